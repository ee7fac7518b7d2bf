package transport

import (
	"bytes"
	"sort"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// maxFollowUpReplays bounds how many replays in a row may end with batches
// still missing, and without having delivered any, before the missing ones
// are declared lost. A follow-up replay recovers batches the publisher sent
// after it served the previous replay but before the subscription reached
// it, replies lost in transit, and the rest of a replay that was cut short;
// a publisher whose replay keeps omitting batches cannot stall the stream
// beyond this.
const maxFollowUpReplays = 3

// streamSink is what a sequencer drives: the transport that owns the sockets
// and the handler.
type streamSink interface {
	// deliver hands batch seq to the handler. Each seq is delivered once, in
	// order, except across a reset; replayed tells whether the batch came
	// from a replay rather than the live stream.
	deliver(seq uint64, payload []byte, replayed bool)
	// reset tells the handler its view of the stream is no longer exact.
	reset(r kvevent.StreamReset)
	// joined records that the stream, on first contact or after its
	// publisher restarted, begins at seq at rather than from: the
	// batches before it were never seen, and nothing derived from the
	// stream is lost.
	joined(from, at uint64)
	// startReplay asks the publisher for every batch from seq on. It
	// returns false when replay is unavailable right now (not configured,
	// backing off after failures unless force is set, or the request could
	// not be sent). Replies come back through onReplayBatch and onReplayEnd,
	// or onReplayFailed.
	startReplay(from uint64, force bool) bool
	// abortReplay abandons the replay in flight: replies still on the way
	// must never reach the sequencer.
	abortReplay()
	// pendingOverflow records that the pending buffer overflowed.
	pendingOverflow()
}

// pendingBatch is a batch that arrived ahead of the next expected seq.
type pendingBatch struct {
	seq      uint64
	payload  []byte
	replayed bool
}

// replayState follows the replay in flight.
type replayState struct {
	active   bool
	start    uint64
	anchored bool // start is the last delivered seq, whose payload must match
	gotFirst bool
}

// sequencer turns the live messages and replay replies of one publisher's
// stream (one engine, one data-parallel rank) into an exact sequence of
// batches. It knows nothing of sockets, so any transport can drive it; it is
// not safe for concurrent use.
//
// The rules:
//   - batches are delivered in seq order, each exactly once;
//   - after every (re)connection the stream is replayed from the last
//     delivered seq (from 0 at first), because a PUB drops what it sent
//     before the subscription arrived and an idle engine sends nothing;
//     the transport probes a quiet stream the same way;
//   - a live seq above the expected one buffers live batches (bounded by
//     maxPending batches and maxPendingBytes bytes) while the missing range
//     is replayed, then applies them;
//   - a stream begins with the first batch it delivers: on first contact,
//     and after its publisher restarted, a replay that starts later than
//     asked, an unavailable replay and an overflowing buffer only move the
//     start (joined), since nothing was delivered that they could make
//     inexact;
//   - once a batch was delivered, a replay that starts later than asked,
//     an unavailable replay and an overflowing buffer report an
//     unrecoverable gap and go on;
//   - a live seq not above the previous live seq, a replayed anchor batch
//     whose payload differs from the one delivered, or a publisher that no
//     longer has the last delivered seq means the publisher restarted: the
//     stream is reset and rebuilt from seq 0.
type sequencer struct {
	sink            streamSink
	maxPending      int
	maxPendingBytes int

	next    uint64 // seq of the next batch to deliver
	last    []byte // payload of batch next-1, valid when hasLast
	hasLast bool
	// joined is set once the stream has a position the next batch must
	// follow on from: a batch was delivered, or the stream was rewound.
	// It is clear on first contact and after a publisher restart, when the
	// first batch available is where the stream begins.
	joined bool

	liveHigh uint64 // highest live seq seen, valid when hasLive
	hasLive  bool

	replay       replayState
	replayedFrom uint64 // next when the last replay was asked for
	followUps    int
	pending      []pendingBatch // sorted by seq, all >= next: a window of pendingBuf
	pendingBuf   []pendingBatch // the array pending is a window of, from its start
	pendingBytes int            // payload bytes in pending
}

func newSequencer(sink streamSink, maxPending, maxPendingBytes int) *sequencer {
	return &sequencer{sink: sink, maxPending: maxPending, maxPendingBytes: maxPendingBytes}
}

// onConnected resynchronises after the transport (re)connected: batches
// buffered on the old connection are dropped (the replay brings them back),
// and the stream is replayed from the last delivered seq.
func (s *sequencer) onConnected() {
	s.abortReplay()
	s.clearPending()
	s.followUps = 0
	s.requestReplay(true)
}

// probe checks a quiet stream with a replay from the last delivered batch,
// unless a replay is in flight. A gap shows only when a later batch
// arrives, so batches lost just before the engine went idle (dropped at a
// high-water mark, or sent before the subscription reached the publisher)
// would otherwise stay missing for as long as the engine stays idle.
func (s *sequencer) probe() {
	if !s.replay.active {
		s.requestReplay(false)
	}
}

// detach forgets the replay in flight and the buffered batches, for a
// transport that closed its sockets. Delivered state is kept: the next
// onConnected resumes the stream.
func (s *sequencer) detach() {
	s.replay = replayState{}
	s.clearPending()
	s.followUps = 0
}

// rewind restarts the stream at seq, which must not be above next: the
// handler is reset and everything from seq on is replayed.
func (s *sequencer) rewind(seq uint64) {
	s.abortReplay()
	s.clearPending()
	s.followUps = 0
	s.next, s.hasLast, s.last, s.joined = seq, false, nil, true
	s.sink.reset(kvevent.StreamReset{Reason: kvevent.ResetRewind, NextSeq: seq})
	s.requestReplay(true)
}

// onLive handles a batch from the live stream.
func (s *sequencer) onLive(seq uint64, payload []byte) {
	if s.hasLive && seq <= s.liveHigh {
		s.restart(seq, payload)
		return
	}
	s.liveHigh, s.hasLive = seq, true
	switch {
	case seq < s.next:
		// Already delivered by a replay that overtook the live stream.
	case seq == s.next && !s.replay.active:
		s.apply(seq, payload, false)
	default:
		s.addPending(seq, payload, false)
		if !s.replay.active && len(s.pending) > 0 {
			s.requestReplay(false)
		}
	}
}

// onReplayBatch handles one replayed batch of the replay in flight.
func (s *sequencer) onReplayBatch(seq uint64, payload []byte) {
	r := &s.replay
	if !r.active {
		return
	}
	if !r.gotFirst {
		r.gotFirst = true
		if r.anchored && seq == r.start {
			if !bytes.Equal(payload, s.last) {
				s.abortReplay()
				s.restartFromReplay()
			}
			return
		}
		if seq > s.next {
			// The publisher no longer buffers what we asked for.
			target := seq
			if len(s.pending) > 0 && s.pending[0].seq < target {
				target = s.pending[0].seq
			}
			s.skipTo(target)
		}
	}
	switch {
	case seq < s.next:
	case seq == s.next:
		s.apply(seq, payload, true)
		s.drainPending()
	default:
		// A reply was lost in transit; a follow-up replay fills the hole.
		s.addPending(seq, payload, true)
	}
}

// onReplayEnd handles the end marker of the replay in flight.
func (s *sequencer) onReplayEnd() {
	if !s.replay.active {
		return
	}
	r := s.replay
	s.replay = replayState{}
	if r.anchored && !r.gotFirst {
		// A publisher always buffers its newest batch; one without the
		// last seq we delivered is a new one.
		s.restartFromReplay()
		return
	}
	s.settle(false)
}

// onReplayCut handles a replay the transport ended before its end marker
// although it was answering: it took too long, sent too much, or stopped
// before its end marker. What it delivered stands; batches still missing
// are replayed again.
func (s *sequencer) onReplayCut() {
	if !s.replay.active {
		return
	}
	s.replay = replayState{}
	s.settle(false)
}

// onReplayFailed handles a replay that timed out or broke the protocol. The
// transport has already discarded its replay socket.
func (s *sequencer) onReplayFailed() {
	if !s.replay.active {
		return
	}
	s.replay = replayState{}
	s.settle(true)
}

// requestReplay asks for everything after the last delivered batch, anchored
// on that batch so that a restarted publisher shows itself.
func (s *sequencer) requestReplay(force bool) {
	from, anchored := s.next, false
	if s.hasLast {
		from, anchored = s.next-1, true
	}
	s.replayedFrom = s.next
	if !s.sink.startReplay(from, force) {
		s.settle(true)
		return
	}
	s.replay = replayState{active: true, start: from, anchored: anchored}
}

// settle runs when no replay is in flight any more: it applies the buffered
// batches that now follow on, and either replays again for the ones still
// missing or declares them lost.
func (s *sequencer) settle(failed bool) {
	progressed := s.next > s.replayedFrom
	s.drainPending()
	if len(s.pending) == 0 {
		s.followUps = 0
		return
	}
	if progressed {
		s.followUps = 0
	}
	if !failed && s.followUps < maxFollowUpReplays {
		s.followUps++
		s.requestReplay(false)
		return
	}
	s.followUps = 0
	s.skipPending()
}

// skipPending applies every buffered batch in seq order, declaring the
// batches missing before each lost (see skipTo), and empties the buffer.
// It walks the buffer once, however many gaps it holds.
func (s *sequencer) skipPending() {
	for i := range s.pending {
		p := s.pending[i]
		s.skipTo(p.seq)
		if p.seq == s.next {
			s.apply(p.seq, p.payload, p.replayed)
		}
	}
	s.clearPending()
}

// restart resets the stream because live seq went back.
func (s *sequencer) restart(seq uint64, payload []byte) {
	s.abortReplay()
	s.clearPending()
	s.followUps = 0
	s.next, s.hasLast, s.last, s.joined = 0, false, nil, false
	s.liveHigh = seq
	s.sink.reset(kvevent.StreamReset{Reason: kvevent.ResetPublisherRestart})
	if seq == 0 {
		s.apply(seq, payload, false)
		return
	}
	s.addPending(seq, payload, false)
	s.requestReplay(true)
}

// restartFromReplay resets the stream because the replay showed a different
// publisher. The buffered live batches come from the new publisher (the
// buffer is cleared on every connection) and are kept.
func (s *sequencer) restartFromReplay() {
	s.followUps = 0
	s.next, s.hasLast, s.last, s.joined = 0, false, nil, false
	s.hasLive = len(s.pending) > 0
	if s.hasLive {
		s.liveHigh = s.pending[len(s.pending)-1].seq
	}
	s.sink.reset(kvevent.StreamReset{Reason: kvevent.ResetPublisherRestart})
	s.requestReplay(true)
}

// skipTo moves on to seq: before the stream has joined, seq is where it
// begins; after, next..seq-1 are declared lost.
func (s *sequencer) skipTo(seq uint64) {
	if seq <= s.next {
		return
	}
	if !s.joined {
		s.sink.joined(s.next, seq)
		s.next = seq
		return
	}
	s.sink.reset(kvevent.StreamReset{Reason: kvevent.ResetUnrecoverableGap, NextSeq: seq, FirstMissing: s.next, LastMissing: seq - 1})
	s.next, s.hasLast, s.last = seq, false, nil
}

func (s *sequencer) apply(seq uint64, payload []byte, replayed bool) {
	s.sink.deliver(seq, payload, replayed)
	s.next, s.last, s.hasLast, s.joined = seq+1, payload, true, true
}

func (s *sequencer) abortReplay() {
	if s.replay.active {
		s.replay = replayState{}
		s.sink.abortReplay()
	}
}

// addPending buffers a batch that is ahead of next. When the buffer is full
// the replay in flight is abandoned and the missing batches are declared lost.
func (s *sequencer) addPending(seq uint64, payload []byte, replayed bool) {
	i := sort.Search(len(s.pending), func(i int) bool { return s.pending[i].seq >= seq })
	if i < len(s.pending) && s.pending[i].seq == seq {
		return
	}
	if len(s.pending) == cap(s.pending) && cap(s.pendingBuf)-cap(s.pending) >= len(s.pending) {
		// The batches drained from the front left at least as much room
		// as the buffer holds: move it there rather than grow.
		n := copy(s.pendingBuf[:len(s.pending)], s.pending)
		clear(s.pending)
		s.pending = s.pendingBuf[:n]
	}
	before := cap(s.pending)
	s.pending = append(s.pending, pendingBatch{})
	if cap(s.pending) != before {
		s.pendingBuf = s.pending[:0]
	}
	copy(s.pending[i+1:], s.pending[i:])
	s.pending[i] = pendingBatch{seq: seq, payload: payload, replayed: replayed}
	s.pendingBytes += len(payload)
	if len(s.pending) > s.maxPending || s.pendingBytes > s.maxPendingBytes {
		s.sink.pendingOverflow()
		s.abortReplay()
		s.settle(true)
	}
}

// drainPending delivers the buffered batches that follow on from next and
// drops the ones already delivered.
func (s *sequencer) drainPending() {
	n := 0
	for n < len(s.pending) && s.pending[n].seq <= s.next {
		p := s.pending[n]
		s.pendingBytes -= len(p.payload)
		if p.seq == s.next {
			s.apply(p.seq, p.payload, p.replayed)
		}
		n++
	}
	if n == 0 {
		return
	}
	// The batches after stay where they are: the buffer's window moves on
	// (see addPending), so that filling holes one at a time costs no more
	// than the batches it applies.
	clear(s.pending[:n])
	s.pending = s.pending[n:]
	if len(s.pending) == 0 {
		s.pending = s.pendingBuf[:0]
	}
}

func (s *sequencer) clearPending() {
	clear(s.pending)
	s.pending, s.pendingBytes = s.pendingBuf[:0], 0
}
