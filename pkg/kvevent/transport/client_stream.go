package transport

import (
	"errors"
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// The client's goroutine is the sequencer's streamSink.
var _ streamSink = (*clientLoop)(nil)

// startReplay sends a replay request ["", from] on the DEALER.
func (l *clientLoop) startReplay(from uint64, force bool) bool {
	c := l.c
	if l.dealer == nil {
		return false
	}
	now := time.Now()
	if !force && now.Before(l.replay.retryAt) {
		return false
	}
	c.counters.replayRequests.Add(1)
	c.metrics.IncrementReplayCount()
	if err := zmqwire.SendFrames(l.dealer, zmq.DONTWAIT, nil, zmqwire.SeqFrame(from)); err != nil {
		l.replayFailed(ErrorTypeSocket, fmt.Errorf("send replay request from seq %d: %w", from, err))
		return false
	}
	l.replay.active = true
	l.replay.deadline = now.Add(c.cfg.ReplayTimeout)
	l.silence.counted = false
	c.logDebug("Requested replay", "fromSeq", from, "endpoint", c.replayEndpoint)
	return true
}

// abortReplay abandons the replay in flight.
func (l *clientLoop) abortReplay() { l.resetDealer() }

// deliver decodes a batch and hands it to the handler.
func (l *clientLoop) deliver(seq uint64, payload []byte, replayed bool) {
	if replayed {
		l.replayDelivered()
	}
	l.c.deliver(seq, payload, replayed)
}

// reset tells the handler its view of the stream is no longer exact.
func (l *clientLoop) reset(r kvevent.StreamReset) {
	c := l.c
	r.PodKey, r.DPRank = c.cfg.PodKey, c.cfg.DPRank
	c.counters.countReset(r)
	c.metrics.recordReset(r)
	if r.Reason == kvevent.ResetRewind {
		c.logInfo("Rewinding KV event stream", "nextSeq", r.NextSeq)
	} else {
		c.logInfo("KV event stream reset: state derived from it is incomplete",
			"reason", r.Reason, "nextSeq", r.NextSeq, "firstMissing", r.FirstMissing, "lastMissing", r.LastMissing)
	}
	if h := c.handler.Load(); h.reset != nil {
		h.reset.HandleReset(r)
	}
}

// drainReplies reads the replies waiting on the DEALER and feeds them to the
// sequencer.
func (l *clientLoop) drainReplies() {
	c := l.c
	for l.dealer != nil {
		frames, err := zmqwire.RecvFrames(l.dealer, zmq.DONTWAIT, l.replyFrames)
		l.replyFrames = frames
		if err != nil {
			if !zmqwire.IsAgain(err) {
				l.failReplay(ErrorTypeSocket, fmt.Errorf("receive replay reply: %w", err))
			}
			return
		}
		if !l.replay.active {
			// A reply after the end marker: not part of any request.
			c.metrics.IncrementErrorCount(ErrorTypeReplayProtocol)
			continue
		}
		r, err := parseReplayReply(frames)
		if err != nil {
			l.failReplay(ErrorTypeReplayProtocol, err)
			return
		}
		l.replay.deadline = time.Now().Add(c.cfg.ReplayTimeout)
		if !r.end {
			if r.hasTopic {
				c.notePublisherTopic(r.topic)
			}
			l.seq.onReplayBatch(r.seq, r.payload)
			continue
		}
		l.replay = replayTimer{backoff: c.cfg.ReconnectDelay}
		c.counters.replaySuccesses.Add(1)
		c.metrics.IncrementReplaySuccess()
		l.seq.onReplayEnd()
	}
}

// failReplay gives up on the replay in flight.
func (l *clientLoop) failReplay(errorType string, err error) {
	l.replayFailed(errorType, err)
	l.seq.onReplayFailed()
}

// replayFailed counts and logs a failed replay, backs further gap replays
// off and replaces the DEALER.
func (l *clientLoop) replayFailed(errorType string, err error) {
	c := l.c
	c.counters.replayFailures.Add(1)
	c.metrics.IncrementReplayFailure()
	if errorType != "" {
		c.metrics.IncrementErrorCount(errorType)
	}
	c.logger.Error(err, "Replay failed", "endpoint", c.replayEndpoint, "retryIn", l.replay.backoff)
	l.replay.retryAt = time.Now().Add(l.replay.backoff)
	l.replay.backoff = min(time.Duration(float64(l.replay.backoff)*ReconnectBackoffFactor), c.cfg.MaxReconnectDelay)
	l.resetDealer()
}

// replayReply is one reply of a replay ROUTER. Its slices are the received
// frames.
type replayReply struct {
	seq     uint64
	payload []byte
	// topic is the publisher's topic frame; hasTopic is false in the layout
	// without one (vLLM v0.25 and earlier).
	topic    []byte
	hasTopic bool
	// end marks the end of the replay: seq 0xffffffffffffffff or an empty
	// payload.
	end bool
}

// parseReplayReply reads one reply of vLLM's replay ROUTER as a DEALER sees
// it: ["", topic, seq, payload] since vLLM v0.26, ["", seq, payload] before.
func parseReplayReply(frames [][]byte) (replayReply, error) {
	if len(frames) == 0 || len(frames[0]) != 0 {
		return replayReply{}, errors.New("replay reply does not start with an empty delimiter frame")
	}
	var r replayReply
	var seqFrame []byte
	switch len(frames) {
	case 4:
		r.topic, r.hasTopic = frames[1], true
		seqFrame, r.payload = frames[2], frames[3]
	case 3:
		seqFrame, r.payload = frames[1], frames[2]
	default:
		return replayReply{}, fmt.Errorf("replay reply has %d frames, want 3 or 4", len(frames))
	}
	seq, ok := zmqwire.ParseSeqFrame(seqFrame)
	if !ok {
		return replayReply{}, fmt.Errorf("replay reply seq frame has %d bytes, want 8", len(seqFrame))
	}
	r.seq, r.end = seq, seq == zmqwire.EndOfReplay || len(r.payload) == 0
	return r, nil
}

// setConnected records a connection change; counted changes are ones the
// monitor reported (closing the sockets is not a disconnection).
func (c *ZMQClient) setConnected(connected, counted bool) {
	if !c.conn.set(connected) {
		return
	}
	c.metrics.SetConnected(connected)
	if !counted {
		return
	}
	if connected {
		c.counters.connections.Add(1)
		c.metrics.IncrementConnectionCount()
		c.logInfo("Connected to KV event publisher", "endpoint", c.pubEndpoint)
		return
	}
	c.counters.disconnections.Add(1)
	c.metrics.IncrementDisconnectionCount()
	c.logInfo("Disconnected from KV event publisher", "endpoint", c.pubEndpoint)
}
