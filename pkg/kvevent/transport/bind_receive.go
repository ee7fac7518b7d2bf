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
func (r *BindReceiver) drainLive(rank int) {
	sub := r.subs[rank]
	for range maxBurst {
		frames, err := zmqwire.RecvFrames(sub, zmq.DONTWAIT, r.frames)
		r.frames = frames
		if err != nil {
			if !zmqwire.IsAgain(err) {
				r.logger.Error(err, "Receiving from a bound KV event socket failed", "endpoint", r.bound[rank])
			}
			return
		}
		var seq uint64
		ok := len(frames) == 3
		if ok {
			seq, ok = zmqwire.ParseSeqFrame(frames[1])
		}
		if !ok {
			r.ignore(IgnoredMalformed, "", rank, errMalformed(frames))
			continue
		}
		r.onMessage(rank, string(frames[0]), seq, frames[2])
	}
}

// onMessage feeds one live message to the stream its topic and rank name.
func (r *BindReceiver) onMessage(rank int, topic string, seq uint64, payload []byte) {
	ip, _, model, err := ParseBindTopic(topic)
	if err != nil {
		r.ignore(IgnoredBadTopic, topic, rank, err)
		return
	}
	pod, ok := r.byAddr[addrKey(ip, model)]
	if !ok {
		r.ignore(IgnoredUnknownPod, topic, rank, nil)
		return
	}
	st := r.streams[boundKey{pod: pod, rank: rank}]
	if st == nil {
		r.ignore(IgnoredRankOutOfRange, topic, rank, nil)
		return
	}
	switch st.topic {
	case "":
		r.attach(st, topic)
	case topic:
	default:
		r.ignore(IgnoredIdentityChanged, topic, rank, nil)
		return
	}
	l := st.c.loop
	l.liveArrived(time.Now())
	l.seq.onLive(seq, payload)
	r.track(st)
}

// attach binds a stream to the engine that sent its first message: the
// stream counts as connected, opens its replay socket and replays from the
// start, because the engine published before it was followed.
func (r *BindReceiver) attach(st *bindState, topic string) {
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
	r.track(st)
}

// ignore counts a dropped message and logs its identity at most once per
// ignoredLogInterval.
func (r *BindReceiver) ignore(reason, topic string, rank int, err error) {
	if r.cfg.Ignored != nil {
		r.cfg.Ignored(reason)
	}
	key := reason + "|" + topic
	now := time.Now()
	if last, ok := r.warnedAt[key]; ok && now.Sub(last) < ignoredLogInterval {
		return
	}
	if len(r.warnedAt) >= 1024 {
		clear(r.warnedAt)
	}
	r.warnedAt[key] = now
	r.logger.Info("Ignoring KV events received on a bound socket", "reason", reason, "topic", topic,
		"endpoint", r.bound[rank], "error", err)
}
