package kvevent

import (
	"time"

	zmq "github.com/pebbe/zmq4"
)

// ignoredLogInterval is how often one ignored identity is logged.
const ignoredLogInterval = time.Minute

// drainLive reads the messages waiting on rank's bound socket and hands
// each to its stream.
func (b *bindFollower) drainLive(rank int) {
	sub := b.subs[rank]
	for range maxBurst {
		frames, err := recvFrames(sub, zmq.DONTWAIT, b.frames)
		b.frames = frames
		if err != nil {
			if !isAgain(err) {
				b.m.logger.Error(err, "Receiving from a bound KV event socket failed", "endpoint", b.bound[rank])
			}
			return
		}
		var seq uint64
		ok := len(frames) == 3
		if ok {
			seq, ok = parseSeqFrame(frames[1])
		}
		if !ok {
			b.ignore(IgnoredMalformed, "", rank, errMalformed(frames))
			continue
		}
		b.onMessage(rank, string(frames[0]), seq, frames[2])
	}
}

// onMessage feeds one live message to the stream its topic and rank name.
func (b *bindFollower) onMessage(rank int, topic string, seq uint64, payload []byte) {
	ip, _, model, err := ParseBindTopic(topic)
	if err != nil {
		b.ignore(IgnoredBadTopic, topic, rank, err)
		return
	}
	t, ok := b.byAddr[addrKey(ip, model)]
	if !ok {
		b.ignore(IgnoredUnknownPod, topic, rank, nil)
		return
	}
	st := b.streams[t.Stream(rank)]
	if st == nil {
		b.ignore(IgnoredRankOutOfRange, topic, rank, nil)
		return
	}
	switch st.topic {
	case "":
		b.attach(st, topic)
	case topic:
	default:
		b.ignore(IgnoredIdentityChanged, topic, rank, nil)
		return
	}
	l := st.c.loop
	l.liveArrived(time.Now())
	l.seq.onLive(seq, payload)
	b.track(st)
}

// attach binds a stream to the engine that sent its first message: the
// stream counts as connected, opens its replay socket and replays from the
// start, because the engine published before it was followed.
func (b *bindFollower) attach(st *bindState, topic string) {
	st.topic = topic
	l := st.c.loop
	if st.c.replayEndpoint != "" {
		if err := l.openDealer(); err != nil {
			st.c.logger.Error(err, "Replay is unavailable for this stream")
			st.c.metrics.IncrementErrorCount(ErrorTypeSocket)
		}
	}
	l.connected = true
	l.quietFrom(time.Now())
	st.c.setConnected(true, true)
	l.seq.onConnected()
	b.track(st)
}

// ignore counts a dropped message and logs its identity at most once per
// ignoredLogInterval.
func (b *bindFollower) ignore(reason, topic string, rank int, err error) {
	b.ignored(reason)
	key := reason + "|" + topic
	now := time.Now()
	if last, ok := b.warnedAt[key]; ok && now.Sub(last) < ignoredLogInterval {
		return
	}
	if len(b.warnedAt) >= 1024 {
		clear(b.warnedAt)
	}
	b.warnedAt[key] = now
	b.m.logger.Info("Ignoring KV events received on a bound socket", "reason", reason, "topic", topic,
		"endpoint", b.bound[rank], "error", err)
}
