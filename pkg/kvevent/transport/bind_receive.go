package transport

import (
	"fmt"
	"net"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// readLive reads the messages waiting on rank's bound socket and hands
// each to its stream, and reports whether there were any, and whether it
// stopped at maxReadBurst with more perhaps waiting.
func (l *bindLoop) readLive(rank int) (read, more bool) {
	sub := l.subs[rank]
	for i := range maxReadBurst {
		frames, n, peer, err := zmqwire.RecvFramesFrom(sub, zmq.DONTWAIT, l.frames, 3)
		l.frames = frames
		if err != nil {
			if zmqwire.IsAgain(err) {
				l.poller.Drained(sub)
			} else {
				l.logger.Error(err, "Receiving from a bound KV event socket failed", "endpoint", l.bound[rank])
			}
			return i > 0, false
		}
		var seq uint64
		ok := n == 3
		if ok {
			seq, ok = zmqwire.ParseSeqFrame(frames[1])
		}
		if !ok {
			l.ignore(IgnoredMalformed, "", peer, rank, func() error { return errMalformed(frames, n) })
			continue
		}
		l.onMessage(rank, string(frames[0]), peer, seq, frames[2])
	}
	return true, true
}

// onMessage hands one live message to the stream its topic and rank name,
// when it comes from the address its topic names.
func (l *bindLoop) onMessage(rank int, topic, peer string, seq uint64, payload []byte) {
	id, err := parseBindTopic(topic)
	if err != nil {
		l.ignore(IgnoredBadTopic, topic, peer, rank, func() error { return err })
		return
	}
	if !l.cfg.AllowAnyPeer && !samePeer(peer, id.ip) {
		l.ignore(IgnoredPeerMismatch, topic, peer, rank, func() error {
			return fmt.Errorf("the topic names %s but the message came from %s", id.ip, peer)
		})
		return
	}
	pod, ok := l.byIdentity[id]
	if !ok {
		l.ignore(IgnoredUnknownPod, topic, peer, rank, nil)
		return
	}
	e := l.streams[boundKey{pod: pod, rank: rank}]
	if e == nil {
		l.ignore(IgnoredRankOutOfRange, topic, peer, rank, nil)
		return
	}
	now := time.Now()
	if !e.attached {
		l.attach(e, now)
	}
	e.received++
	e.s.liveArrived(now)
	e.s.pushLive(seq, payload)
}

// samePeer reports whether a message from peer may speak for ip. A peer
// address is absent only on transports without one (ipc, inproc), which
// reach the gateway's own host alone.
func samePeer(peer, ip string) bool {
	if peer == "" {
		return true
	}
	p := net.ParseIP(peer)
	return p != nil && p.String() == ip
}

// attach binds a stream to its engine on the engine's first message: the
// stream counts as connected, and replays from the start, because the
// engine published before it was followed.
func (l *bindLoop) attach(e *boundEntry, now time.Time) {
	e.attached, e.alive = true, true
	e.s.attach(l.ctx)
	e.s.up(now)
	l.track(e)
}

// ignore counts a dropped message and logs it, rate-limited per reason
// (see logLimiter), with the error explain returns (none when it is nil),
// which it asks for only to log it. The log shows at most maxShown bytes
// of the topic.
func (l *bindLoop) ignore(reason, topic, peer string, rank int, explain func() error) {
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
		var err error
		if explain != nil {
			err = explain()
		}
		l.logger.Info("Ignoring KV events received on a bound socket", "reason", reason, "topic", shown(topic),
			"peer", peer, "endpoint", l.bound[rank], "error", err)
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
