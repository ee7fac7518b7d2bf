package transport

import (
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// ignoredLogInterval is how often one ignored identity is logged.
const ignoredLogInterval = time.Minute

// drainLive reads the messages waiting on rank's bound socket and hands
// each to its stream.
func (l *bindLoop) drainLive(rank int) {
	sub := l.subs[rank]
	for range maxBurst {
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
	e.s.live(seq, payload)
	l.track(e)
}

// attach binds a stream to the engine that sent its first message: the
// stream counts as connected, opens its replay socket and replays from the
// start, because the engine published before it was followed.
func (l *bindLoop) attach(e *boundEntry, topic string) {
	e.topic = topic
	if err := e.s.openReplay(l.ctx); err != nil {
		e.handle.obs.socketFailed(err, "Replay is unavailable for this stream")
	}
	e.s.up(time.Now())
	l.track(e)
}

// ignore counts a dropped message and logs its identity at most once per
// ignoredLogInterval.
func (l *bindLoop) ignore(reason, topic string, rank int, err error) {
	if l.cfg.Ignored != nil {
		l.cfg.Ignored(reason)
	}
	key := reason + "|" + topic
	now := time.Now()
	if last, ok := l.warnedAt[key]; ok && now.Sub(last) < ignoredLogInterval {
		return
	}
	if len(l.warnedAt) >= 1024 {
		clear(l.warnedAt)
	}
	l.warnedAt[key] = now
	l.logger.Info("Ignoring KV events received on a bound socket", "reason", reason, "topic", topic,
		"endpoint", l.bound[rank], "error", err)
}
