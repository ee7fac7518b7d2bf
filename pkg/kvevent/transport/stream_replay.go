package transport

import (
	"errors"
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// Each replay has a DEALER of its own, created for the request and closed
// when the end marker arrives, when the replay fails or is cut short, or
// when it is abandoned. vLLM's replay ROUTER carries no request id, so a
// fresh socket is what ties replies to the request they answer: replies
// still on their way to a closed socket (a second end marker, the tail of
// an abandoned replay) are dropped by ZeroMQ and never taken for the
// answer to a later request.

// maxReadBurst bounds the messages a driver reads from one socket in a row
// before it applies what it read, services its other sockets and commands.
const maxReadBurst = 1024

// startReplay opens a replay socket and sends the request ["", from] on it.
func (s *stream) startReplay(from uint64, force bool) bool {
	if s.replayEndpoint == "" || s.ctx == nil || s.resets.suspended {
		return false
	}
	now := time.Now()
	if !force && now.Before(s.replay.retryAt) {
		return false
	}
	s.endReplay()
	if err := s.openDealer(); err != nil {
		s.replayFailed(kindSocket, err)
		return false
	}
	s.obs.replayRequested(from, s.replayEndpoint)
	if err := zmqwire.SendFrames(s.dealer, zmq.DONTWAIT, nil, zmqwire.SeqFrame(from)); err != nil {
		s.replayFailed(kindSocket, fmt.Errorf("send replay request from seq %d: %w", from, err))
		return false
	}
	s.replay.active, s.replay.ending, s.replay.cut, s.replay.replies = true, false, false, 0
	s.replay.deadline = now.Add(s.cfg.ReplayTimeout)
	s.replay.cutAt = now.Add(s.cfg.MaxReplayDuration)
	s.silence.counted = false
	return true
}

// openDealer creates and connects the replay socket of one replay. Its
// receive high-water mark holds a whole replay of MaxReplayBatches replies,
// so that the engine's ROUTER, which drops what its peer does not take in
// time, can send it all even while the stream is busy: vLLM sends a whole
// replay in one loop and its ROUTER drops what its own queue cannot hold,
// so a mark derived from bytes (ReceiveBufferBytes / MaxMessageBytes, 4 by
// default) would lose most of a replay of small batches and have it
// replayed again, round after round. ZeroMQ counts messages, not bytes; what it queues is bounded in
// time instead: the stream reads the socket after every slice of work
// (processSlice plus one batch), and cuts the replay, closing the socket
// and dropping its queue, once the replies read fill ReceiveBufferBytes.
func (s *stream) openDealer() error {
	ep := s.replayEndpoint
	d, err := s.ctx.NewSocket(zmq.DEALER)
	if err != nil {
		return fmt.Errorf("kvevent: create replay socket for %s: %w", ep, err)
	}
	err = errors.Join(d.SetLinger(0), d.SetRcvhwm(s.cfg.MaxReplayBatches+1), d.SetMaxmsgsize(int64(s.cfg.MaxMessageBytes)))
	if err == nil && zmqwire.NeedsIPv6(ep) {
		err = d.SetIpv6(true)
	}
	if err == nil {
		err = d.Connect(ep)
	}
	if err != nil {
		d.Close()
		return fmt.Errorf("kvevent: set up replay socket for %s: %w", ep, err)
	}
	s.dealer = d
	return nil
}

// closeDealer closes the replay socket, if any; replies still on their way
// are dropped with it.
func (s *stream) closeDealer() {
	if s.dealer != nil {
		s.dealer.Close()
		s.dealer = nil
	}
}

// endReplay forgets the replay in flight: its socket and the replies read.
func (s *stream) endReplay() {
	s.closeDealer()
	s.replies.clear()
	s.replay.active, s.replay.ending, s.replay.cut = false, false, false
}

// abortReplay abandons the replay in flight.
func (s *stream) abortReplay() { s.endReplay() }

// reset tells the handler its view of the stream is no longer exact, and
// suspends a stream that resets too often.
func (s *stream) reset(r kvevent.StreamReset) {
	r.PodKey, r.DPRank = s.cfg.PodKey, s.cfg.DPRank
	s.obs.reset(r)
	if h := s.handler.Load(); h.reset != nil {
		h.reset.HandleReset(r)
	}
	if r.Reason != kvevent.ResetRewind {
		s.countReset(time.Now())
	}
}

// joined records where the stream begins (see streamSink).
func (s *stream) joined(from, at uint64) { s.obs.joined(from, at) }

// pendingOverflow counts an overflow of the sequencer's pending buffer.
func (s *stream) pendingOverflow() { s.obs.limitHit(LimitPendingBuffer) }

// readReplies reads the replies waiting on the replay socket into the
// replies inbox. An end marker closes the socket, so that nothing sent
// after it is read, and ends the replay once the replies are applied; so
// does a replay that sends more replies than MaxReplayBatches or more
// bytes than the inbox holds, which is cut short.
func (s *stream) readReplies() {
	for range maxReadBurst {
		if s.dealer == nil {
			return
		}
		frames, n, err := zmqwire.RecvFrames(s.dealer, zmq.DONTWAIT, s.replyFrames, 4)
		s.replyFrames = frames
		if err != nil {
			if !zmqwire.IsAgain(err) {
				s.failReplay(kindSocket, fmt.Errorf("receive replay reply: %w", err))
			}
			return
		}
		r, err := parseReplayReply(frames, n)
		if err != nil {
			s.failReplay(kindReplayProtocol, err)
			return
		}
		now := time.Now()
		s.heard(now)
		s.replay.deadline = now.Add(s.cfg.ReplayTimeout)
		if r.end {
			s.closeDealer()
			s.replay.ending = true
			return
		}
		m := inMsg{seq: r.seq, payload: r.payload, topic: r.topic, hasTopic: r.hasTopic}
		if s.replay.replies++; s.replay.replies > s.cfg.MaxReplayBatches {
			s.cutReplay(LimitReplayBatches)
			return
		}
		if !s.replies.push(m) {
			s.cutReplay(LimitReplayBuffer)
			return
		}
	}
}

// applyReply hands one reply read from the replay socket to the sequencer.
func (s *stream) applyReply(m inMsg) {
	if m.hasTopic {
		s.obs.publisherTopic(m.topic)
	}
	s.seq.onReplayBatch(m.seq, m.payload)
}

// cutReplay stops reading a replay that is answering but hit limit (""
// for one that went silent before its end marker): the replies read are
// still applied, then the sequencer replays what is missing.
func (s *stream) cutReplay(limit string) {
	if limit != "" {
		s.obs.replayCut(limit, s.replay.replies, s.replayEndpoint)
	}
	s.closeDealer()
	s.replay.ending, s.replay.cut = true, true
}

// finishReplay winds up a replay whose replies are all applied: one that
// ended with its end marker, or was cut short.
func (s *stream) finishReplay() {
	if s.replay.cut {
		s.replay.active, s.replay.ending, s.replay.cut = false, false, false
		s.seq.onReplayCut()
		return
	}
	s.replay = replayTimer{backoff: s.cfg.ReconnectDelay}
	// A replay is a probe of the stream: the next comes no sooner than
	// one probe delay after it.
	if next := time.Now().Add(s.probeDelay); next.After(s.probeAt) {
		s.probeAt = next
	}
	s.obs.replaySucceeded()
	s.seq.onReplayEnd()
}

// failReplay gives up on the replay in flight; kind is the error it counts
// as besides a failed replay.
func (s *stream) failReplay(kind errorKind, err error) {
	s.replayFailed(kind, err)
	s.seq.onReplayFailed()
}

// replayFailed counts and logs a failed replay, backs further gap replays
// off and forgets the replay.
func (s *stream) replayFailed(kind errorKind, err error) {
	s.obs.replayFailed(kind, err, s.replayEndpoint, s.replay.backoff)
	s.replay.retryAt = time.Now().Add(s.replay.backoff)
	s.replay.backoff = min(time.Duration(float64(s.replay.backoff)*ReconnectBackoffFactor), s.cfg.MaxReconnectDelay)
	s.endReplay()
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
// The reply had n frames, the first of which are frames.
func parseReplayReply(frames [][]byte, n int) (replayReply, error) {
	if len(frames) == 0 || len(frames[0]) != 0 {
		return replayReply{}, errors.New("replay reply does not start with an empty delimiter frame")
	}
	var r replayReply
	var seqFrame []byte
	switch n {
	case 4:
		r.topic, r.hasTopic = frames[1], true
		seqFrame, r.payload = frames[2], frames[3]
	case 3:
		seqFrame, r.payload = frames[1], frames[2]
	default:
		return replayReply{}, fmt.Errorf("replay reply has %d frames, want 3 or 4", n)
	}
	seq, ok := zmqwire.ParseSeqFrame(seqFrame)
	if !ok {
		return replayReply{}, fmt.Errorf("replay reply seq frame has %d bytes, want 8", len(seqFrame))
	}
	r.seq, r.end = seq, seq == zmqwire.EndOfReplay || len(r.payload) == 0
	return r, nil
}
