package transport

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// checkingSink is a transport model that checks a sequencer's promises.
type checkingSink struct {
	t        *testing.T
	seq      *sequencer
	expected uint64 // the seq the next delivery must carry
	// begun is set once the stream delivered a batch or was rewound: from
	// then on only a reset may move expected other than by a delivery.
	begun    bool
	inFlight bool // a replay request is outstanding
	refuse   bool // replay unavailable
}

func (k *checkingSink) deliver(seq uint64, payload []byte, replayed bool) {
	k.begun = true
	if seq != k.expected {
		k.t.Fatalf("delivered seq %d, want %d", seq, k.expected)
	}
	if want := fmt.Sprint(seq); string(payload[1:]) != want {
		k.t.Fatalf("delivered payload %q as seq %d", payload, seq)
	}
	k.expected++
}

func (k *checkingSink) reset(r kvevent.StreamReset) {
	if r.Reason == kvevent.ResetUnrecoverableGap && (r.FirstMissing != k.expected || r.LastMissing+1 != r.NextSeq || r.NextSeq <= k.expected) {
		k.t.Fatalf("gap %d..%d next %d while %d was expected", r.FirstMissing, r.LastMissing, r.NextSeq, k.expected)
	}
	k.expected = r.NextSeq
	k.begun = r.Reason == kvevent.ResetRewind
}

func (k *checkingSink) joined(from, at uint64) {
	if k.begun || from != k.expected || at <= from {
		k.t.Fatalf("joined at %d after %d, with %d expected, begun %v", at, from, k.expected, k.begun)
	}
	k.expected = at
}

func (k *checkingSink) startReplay(from uint64, force bool) bool {
	if k.inFlight {
		k.t.Fatal("replay started while one is in flight")
	}
	if k.refuse && !force {
		return false
	}
	k.inFlight = true
	return true
}

func (k *checkingSink) pendingOverflow() {}

func (k *checkingSink) abortReplay() {
	if !k.inFlight {
		k.t.Fatal("aborted a replay that is not in flight")
	}
	k.inFlight = false
}

// FuzzSequencer drives a sequencer with arbitrary live batches, replies,
// connections, probes, failures and rewinds, as a transport would (replies
// only while a replay is in flight), from two publishers that reuse seqs.
func FuzzSequencer(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 3, 1, 1, 1, 2, 2, 0})
	f.Add([]byte{4, 0, 1, 5, 1, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x80, 0})
	f.Add([]byte{0, 2, 0, 9, 3, 0, 5, 0, 0, 4, 1, 4, 2, 0, 6, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const maxPending, maxPendingBytes = 4, 9
		sink := &checkingSink{t: t}
		s := newSequencer(sink, maxPending, maxPendingBytes)
		sink.seq = s
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%8, ops[i+1]
			seq := uint64(arg & 0x1f)
			payload := []byte(fmt.Sprintf("%c%d", 'a'+arg>>7, seq))
			switch op {
			case 0:
				s.onLive(seq, payload)
			case 1:
				if sink.inFlight {
					s.onReplayBatch(seq, payload)
				}
			case 2:
				if sink.inFlight {
					sink.inFlight = false
					s.onReplayEnd()
				}
			case 3:
				if sink.inFlight {
					sink.inFlight = false
					s.onReplayFailed()
				}
			case 4:
				s.onConnected()
			case 5:
				s.probe()
			case 6:
				if seq <= s.next {
					s.rewind(seq)
				}
			case 7:
				sink.refuse = !sink.refuse
			}
			if len(s.pending) > maxPending || s.pendingBytes > maxPendingBytes {
				t.Fatalf("%d batches of %d bytes pending, bound %d and %d", len(s.pending), s.pendingBytes, maxPending, maxPendingBytes)
			}
			var bytes int
			for _, p := range s.pending {
				bytes += len(p.payload)
			}
			if bytes != s.pendingBytes {
				t.Fatalf("pending holds %d bytes, counted %d", bytes, s.pendingBytes)
			}
			if s.replay.active != sink.inFlight {
				t.Fatalf("sequencer replay active %v, transport %v", s.replay.active, sink.inFlight)
			}
			for j := 1; j < len(s.pending); j++ {
				if s.pending[j-1].seq >= s.pending[j].seq {
					t.Fatalf("pending out of order: %v", s.pending)
				}
			}
			if len(s.pending) > 0 && s.pending[0].seq < s.next {
				t.Fatalf("pending seq %d below next %d", s.pending[0].seq, s.next)
			}
			if off := cap(s.pendingBuf) - cap(s.pending); len(s.pending) > 0 &&
				(off < 0 || &s.pendingBuf[:cap(s.pendingBuf)][off] != &s.pending[0]) {
				t.Fatalf("pending is not a window ending where pendingBuf ends")
			}
		}
	})
}
