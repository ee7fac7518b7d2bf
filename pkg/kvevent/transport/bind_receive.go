package transport

import (
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// readLive reads the messages waiting on rank's bound socket and hands
// each to its stream.
func (l *bindLoop) readLive(rank int) {
	sub := l.subs[rank]
	for range maxReadBurst {
		frames, err := zmqwire.RecvFrames(sub, zmq.DONTWAIT, l.frames)
		l.frames = frames
		if err != nil {
			if !zmqwire.IsAgain(err) {
				l.logger.Error(err, "Receiving from a bound KV event socket failed", "endpoint", l.bound[rank])
			}
			return
		}
		var seq uint64
		ok := len(frames) == 3
		if ok {
			seq, ok = zmqwire.ParseSeqFrame(frames[1])
		}
		if !ok {
			l.ignore(IgnoredMalformed, "", rank, errMalformed(frames))
			continue
		}
		l.onMessage(rank, string(frames[0]), seq, frames[2])
	}
}

// onMessage feeds one live message to the stream its topic and rank name.
func (l *bindLoop) onMessage(rank int, topic string, seq uint64, payload []byte) {
	ip, _, model, err := parseBindTopic(topic)
	if err != nil {
		l.ignore(IgnoredBadTopic, topic, rank, err)
		return
	}
	pod, ok := l.byAddr[addrKey(ip, model)]
	if !ok {
		l.ignore(IgnoredUnknownPod, topic, rank, nil)
		return
	}
	e := l.streams[boundKey{pod: pod, rank: rank}]
	if e == nil {
		l.ignore(IgnoredRankOutOfRange, topic, rank, nil)
		return
	}
	switch e.topic {
	case "":
		l.attach(e, topic)
	case topic:
	default:
		l.ignore(IgnoredIdentityChanged, topic, rank, nil)
		return
	}
	e.s.liveArrived(time.Now())
	e.s.pushLive(seq, payload)
}

// attach binds a stream to the engine that sent its first message: the
// stream counts as connected, opens its replay socket and replays from the
// start, because the engine published before it was followed.
func (l *bindLoop) attach(e *boundEntry, topic string) {
	e.topic = topic
	e.s.attach(l.ctx)
	e.s.up(time.Now())
	l.track(e)
}

// ignore counts a dropped message and logs it, rate-limited per reason
// (see logLimiter).
func (l *bindLoop) ignore(reason, topic string, rank int, err error) {
	if l.cfg.Ignored != nil {
		l.cfg.Ignored(reason)
	}
	lim := l.ignoreLimits[reason]
	if lim == nil {
		lim = &logLimiter{}
		l.ignoreLimits[reason] = lim
	}
	ok, summary := lim.allow(time.Now())
	if summary > 0 {
		l.logSuppressedIgnores(reason, summary)
	}
	if ok {
		l.logger.Info("Ignoring KV events received on a bound socket", "reason", reason, "topic", topic,
			"endpoint", l.bound[rank], "error", err)
	}
}

// flushIgnoreLogs logs the summaries of the intervals that are over at now.
func (l *bindLoop) flushIgnoreLogs(now time.Time) {
	for reason, lim := range l.ignoreLimits {
		if n := lim.due(now); n > 0 {
			l.logSuppressedIgnores(reason, n)
		}
	}
}

func (l *bindLoop) logSuppressedIgnores(reason string, n int) {
	l.logger.Info("Suppressed repeated log lines of ignored KV events", "reason", reason, "lines", n,
		"interval", logInterval, "burst", logBurst)
}
