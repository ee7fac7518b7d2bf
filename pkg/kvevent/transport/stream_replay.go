package transport

import (
	"errors"
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// startReplay sends a replay request ["", from] on the DEALER.
func (s *stream) startReplay(from uint64, force bool) bool {
	if s.dealer == nil {
		return false
	}
	now := time.Now()
	if !force && now.Before(s.replay.retryAt) {
		return false
	}
	s.obs.replayRequested(from, s.replayEndpoint)
	if err := zmqwire.SendFrames(s.dealer, zmq.DONTWAIT, nil, zmqwire.SeqFrame(from)); err != nil {
		s.replayFailed(kindSocket, fmt.Errorf("send replay request from seq %d: %w", from, err))
		return false
	}
	s.replay.active = true
	s.replay.deadline = now.Add(s.cfg.ReplayTimeout)
	s.silence.counted = false
	return true
}

// abortReplay abandons the replay in flight.
func (s *stream) abortReplay() { s.resetDealer() }

// reset tells the handler its view of the stream is no longer exact.
func (s *stream) reset(r kvevent.StreamReset) {
	r.PodKey, r.DPRank = s.cfg.PodKey, s.cfg.DPRank
	s.obs.reset(r)
	if h := s.handler.Load(); h.reset != nil {
		h.reset.HandleReset(r)
	}
}

// drainReplies reads the replies waiting on the DEALER and feeds them to the
// sequencer.
func (s *stream) drainReplies() {
	for s.dealer != nil {
		frames, err := zmqwire.RecvFrames(s.dealer, zmq.DONTWAIT, s.replyFrames)
		s.replyFrames = frames
		if err != nil {
			if !zmqwire.IsAgain(err) {
				s.failReplay(kindSocket, fmt.Errorf("receive replay reply: %w", err))
			}
			return
		}
		if !s.replay.active {
			// A reply after the end marker: not part of any request.
			s.obs.unsolicitedReply()
			continue
		}
		r, err := parseReplayReply(frames)
		if err != nil {
			s.failReplay(kindReplayProtocol, err)
			return
		}
		s.replay.deadline = time.Now().Add(s.cfg.ReplayTimeout)
		if !r.end {
			if r.hasTopic {
				s.obs.publisherTopic(r.topic)
			}
			s.seq.onReplayBatch(r.seq, r.payload)
			continue
		}
		s.replay = replayTimer{backoff: s.cfg.ReconnectDelay}
		s.obs.replaySucceeded()
		s.seq.onReplayEnd()
	}
}

// failReplay gives up on the replay in flight; kind is the error it counts
// as besides a failed replay.
func (s *stream) failReplay(kind errorKind, err error) {
	s.replayFailed(kind, err)
	s.seq.onReplayFailed()
}

// replayFailed counts and logs a failed replay, backs further gap replays
// off and replaces the DEALER.
func (s *stream) replayFailed(kind errorKind, err error) {
	s.obs.replayFailed(kind, err, s.replayEndpoint, s.replay.backoff)
	s.replay.retryAt = time.Now().Add(s.replay.backoff)
	s.replay.backoff = min(time.Duration(float64(s.replay.backoff)*ReconnectBackoffFactor), s.cfg.MaxReconnectDelay)
	s.resetDealer()
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
