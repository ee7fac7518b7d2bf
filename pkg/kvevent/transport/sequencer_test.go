package transport

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// recordingSink logs what a sequencer asks of its transport.
type recordingSink struct {
	log         []string
	unavailable bool // startReplay refuses
}

func (r *recordingSink) deliver(seq uint64, payload []byte, replayed bool) {
	src := "live"
	if replayed {
		src = "replay"
	}
	r.log = append(r.log, fmt.Sprintf("deliver %s %s", payload, src))
	_ = seq
}

func (r *recordingSink) reset(rs kvevent.StreamReset) {
	if rs.Reason == kvevent.ResetUnrecoverableGap {
		r.log = append(r.log, fmt.Sprintf("gap %d-%d", rs.FirstMissing, rs.LastMissing))
		return
	}
	r.log = append(r.log, fmt.Sprintf("%s next %d", rs.Reason, rs.NextSeq))
}

func (r *recordingSink) joined(from, at uint64) {
	r.log = append(r.log, fmt.Sprintf("join %d after %d", at, from))
}

func (r *recordingSink) startReplay(from uint64, force bool) bool {
	if r.unavailable {
		r.log = append(r.log, fmt.Sprintf("replay %d refused", from))
		return false
	}
	r.log = append(r.log, fmt.Sprintf("replay %d", from))
	return true
}

func (r *recordingSink) abortReplay() { r.log = append(r.log, "abort") }

func (r *recordingSink) pendingOverflow() { r.log = append(r.log, "overflow") }

// runSequencer feeds steps to a fresh sequencer and returns the sink's log.
// Steps: "connect", "live <seq> [publisher]", "reply <seq> [publisher]",
// "end", "cut", "fail", "rewind <seq>", "probe", "refuse" (replay
// unavailable from now on).
// A batch's payload is "<publisher><seq>", publisher "a" unless given.
func runSequencer(t *testing.T, maxPending, maxPendingBytes int, steps []string) []string {
	t.Helper()
	sink := &recordingSink{}
	s := newSequencer(sink, maxPending, maxPendingBytes)
	for _, step := range steps {
		f := strings.Fields(step)
		var seq uint64
		pub := "a"
		if len(f) > 1 {
			if _, err := fmt.Sscan(f[1], &seq); err != nil {
				t.Fatalf("step %q: %v", step, err)
			}
		}
		if len(f) > 2 {
			pub = f[2]
		}
		payload := []byte(fmt.Sprintf("%s%d", pub, seq))
		switch f[0] {
		case "connect":
			s.onConnected()
		case "live":
			s.onLive(seq, payload)
		case "reply":
			s.onReplayBatch(seq, payload)
		case "end":
			s.onReplayEnd()
		case "fail":
			s.onReplayFailed()
		case "cut":
			s.onReplayCut()
		case "rewind":
			s.rewind(seq)
		case "probe":
			s.probe()
		case "refuse":
			sink.unavailable = true
		default:
			t.Fatalf("unknown step %q", step)
		}
	}
	return sink.log
}

func TestSequencer(t *testing.T) {
	tests := []struct {
		name            string
		maxPending      int
		maxPendingBytes int
		steps           []string
		want            []string
	}{{
		name:  "connect replays from 0 and live follows on",
		steps: []string{"connect", "reply 0", "reply 1", "end", "live 2"},
		want:  []string{"replay 0", "deliver a0 replay", "deliver a1 replay", "deliver a2 live"},
	}, {
		name:  "live batches wait while the connect replay runs",
		steps: []string{"connect", "live 2", "reply 0", "reply 1", "reply 2", "end", "live 3"},
		want:  []string{"replay 0", "deliver a0 replay", "deliver a1 replay", "deliver a2 live", "deliver a3 live"},
	}, {
		name:  "live batches the replay did not reach are applied after it",
		steps: []string{"connect", "live 1", "live 2", "reply 0", "end"},
		want:  []string{"replay 0", "deliver a0 replay", "deliver a1 live", "deliver a2 live"},
	}, {
		name:  "a gap is replayed from the last delivered batch and filled in order",
		steps: []string{"connect", "end", "live 0", "live 3", "live 4", "reply 0", "reply 1", "reply 2", "reply 3", "end"},
		want: []string{"replay 0", "deliver a0 live", "replay 0", "deliver a1 replay", "deliver a2 replay",
			"deliver a3 live", "deliver a4 live"},
	}, {
		name:  "on first contact a replay starting after the requested seq is where the stream begins",
		steps: []string{"connect", "reply 5", "reply 6", "end", "live 7"},
		want:  []string{"replay 0", "join 5 after 0", "deliver a5 replay", "deliver a6 replay", "deliver a7 live"},
	}, {
		name:  "once a batch was delivered a replay starting after the requested seq is an unrecoverable gap",
		steps: []string{"connect", "reply 0", "end", "live 1", "connect", "reply 5", "reply 6", "end"},
		want: []string{"replay 0", "deliver a0 replay", "deliver a1 live", "replay 1", "gap 2-4",
			"deliver a5 replay", "deliver a6 replay"},
	}, {
		name:  "a publisher counting from 1 joins at 1 when followed and after every restart",
		steps: []string{"connect", "reply 1", "reply 2", "end", "live 3", "live 1 b", "reply 1 b", "end", "live 2 b"},
		want: []string{"replay 0", "join 1 after 0", "deliver a1 replay", "deliver a2 replay", "deliver a3 live",
			"publisher_restart next 0", "replay 0", "join 1 after 0", "deliver b1 replay", "deliver b2 live"},
	}, {
		name:  "a rewound stream reports a replay starting later than the rewind as a gap",
		steps: []string{"connect", "end", "live 0", "live 1", "rewind 0", "reply 1", "end"},
		want:  []string{"replay 0", "deliver a0 live", "deliver a1 live", "rewind next 0", "replay 0", "gap 0-0", "deliver a1 replay"},
	}, {
		name:  "a live seq going back is a publisher restart",
		steps: []string{"connect", "end", "live 0", "live 1", "live 0 b", "live 1 b"},
		want: []string{"replay 0", "deliver a0 live", "deliver a1 live", "publisher_restart next 0",
			"deliver b0 live", "deliver b1 live"},
	}, {
		name:  "a restarted publisher first seen past 0 is replayed from 0",
		steps: []string{"connect", "end", "live 0", "live 1", "live 2", "live 1 b", "reply 0 b", "reply 1 b", "end"},
		want: []string{"replay 0", "deliver a0 live", "deliver a1 live", "deliver a2 live", "publisher_restart next 0",
			"replay 0", "deliver b0 replay", "deliver b1 live"},
	}, {
		name:  "an anchor batch that differs after a reconnect is a publisher restart",
		steps: []string{"connect", "end", "live 0", "live 1", "connect", "reply 1 b", "reply 0 b", "reply 1 b", "reply 2 b", "end"},
		want: []string{"replay 0", "deliver a0 live", "deliver a1 live", "replay 1", "abort", "publisher_restart next 0",
			"replay 0", "deliver b0 replay", "deliver b1 replay", "deliver b2 replay"},
	}, {
		name:  "an anchor batch that matches resumes the stream",
		steps: []string{"connect", "end", "live 0", "live 1", "connect", "reply 1", "reply 2", "end", "live 3"},
		want: []string{"replay 0", "deliver a0 live", "deliver a1 live", "replay 1", "deliver a2 replay",
			"deliver a3 live"},
	}, {
		name:  "a publisher without the last delivered seq is a new one",
		steps: []string{"connect", "end", "live 0", "live 1", "live 2", "connect", "end", "reply 0 b", "end"},
		want: []string{"replay 0", "deliver a0 live", "deliver a1 live", "deliver a2 live", "replay 2",
			"publisher_restart next 0", "replay 0", "deliver b0 replay"},
	}, {
		name:  "without replay the stream begins at the first live batch and reports later gaps",
		steps: []string{"refuse", "connect", "live 3", "live 4", "live 6"},
		want:  []string{"replay 0 refused", "replay 0 refused", "join 3 after 0", "deliver a3 live", "deliver a4 live", "replay 4 refused", "gap 5-5", "deliver a6 live"},
	}, {
		name:  "a failed replay reports the gap and applies the buffered batches",
		steps: []string{"connect", "end", "live 0", "live 3", "live 4", "fail"},
		want:  []string{"replay 0", "deliver a0 live", "replay 0", "gap 1-2", "deliver a3 live", "deliver a4 live"},
	}, {
		name:       "overflowing the pending buffer abandons the replay",
		maxPending: 2,
		steps:      []string{"connect", "end", "live 0", "live 2", "live 3", "live 4", "reply 0", "live 5"},
		want:       []string{"replay 0", "deliver a0 live", "replay 0", "overflow", "abort", "gap 1-1", "deliver a2 live", "deliver a3 live", "deliver a4 live", "deliver a5 live"},
	}, {
		name:       "an overflowing buffer of batches apart declares each gap lost and applies them in order",
		maxPending: 3,
		steps:      []string{"connect", "end", "live 0", "live 2", "live 4", "live 5", "live 7", "live 8"},
		want: []string{"replay 0", "deliver a0 live", "replay 0", "overflow", "abort", "gap 1-1", "deliver a2 live",
			"gap 3-3", "deliver a4 live", "deliver a5 live", "gap 6-6", "deliver a7 live", "deliver a8 live"},
	}, {
		name: "a replay filling the holes between live batches applies each as it follows on",
		steps: []string{"connect", "end", "live 0", "live 2", "live 4", "live 6", "live 8", "reply 0", "reply 1", "reply 3",
			"live 10", "live 12", "reply 5", "reply 7", "reply 9", "reply 11", "end", "live 13"},
		want: []string{"replay 0", "deliver a0 live", "replay 0", "deliver a1 replay", "deliver a2 live", "deliver a3 replay",
			"deliver a4 live", "deliver a5 replay", "deliver a6 live", "deliver a7 replay", "deliver a8 live", "deliver a9 replay",
			"deliver a10 live", "deliver a11 replay", "deliver a12 live", "deliver a13 live"},
	}, {
		name:            "overflowing the pending buffer's bytes abandons the replay",
		maxPendingBytes: 5, // payloads are 2 bytes each
		steps:           []string{"connect", "end", "live 0", "live 2", "live 3", "live 4", "reply 0", "live 5"},
		want:            []string{"replay 0", "deliver a0 live", "replay 0", "overflow", "abort", "gap 1-1", "deliver a2 live", "deliver a3 live", "deliver a4 live", "deliver a5 live"},
	}, {
		name:  "a replay cut short is followed up from where it got, as long as it progresses",
		steps: []string{"connect", "end", "live 0", "live 5", "reply 0", "reply 1", "cut", "reply 2", "cut", "reply 3", "reply 4", "end"},
		want: []string{"replay 0", "deliver a0 live", "replay 0", "deliver a1 replay", "replay 1", "deliver a2 replay",
			"replay 2", "deliver a3 replay", "deliver a4 replay", "deliver a5 live"},
	}, {
		name:  "replays cut short without progress end in a gap",
		steps: []string{"connect", "end", "live 0", "live 2", "reply 0", "cut", "reply 0", "cut", "reply 0", "cut", "reply 0", "cut"},
		want:  []string{"replay 0", "deliver a0 live", "replay 0", "replay 0", "replay 0", "replay 0", "gap 1-1", "deliver a2 live"},
	}, {
		name:  "a reply lost in transit is fetched by a follow-up replay",
		steps: []string{"connect", "reply 0", "reply 2", "end", "reply 1", "reply 2", "end"},
		want:  []string{"replay 0", "deliver a0 replay", "replay 0", "deliver a1 replay", "deliver a2 replay"},
	}, {
		name: "follow-up replays that never fill a hole end in a gap",
		steps: []string{"connect", "end", "live 0", "live 2", "reply 0", "end", "reply 0", "end",
			"reply 0", "end", "reply 0", "end"},
		want: []string{"replay 0", "deliver a0 live", "replay 0", "replay 0", "replay 0", "replay 0", "gap 1-1", "deliver a2 live"},
	}, {
		name:  "a reconnect during a replay starts it again and drops buffered batches",
		steps: []string{"connect", "end", "live 0", "live 2", "connect", "reply 0", "reply 1", "reply 2", "end"},
		want:  []string{"replay 0", "deliver a0 live", "replay 0", "abort", "replay 0", "deliver a1 replay", "deliver a2 replay"},
	}, {
		name:  "rewind resets the handler and replays from the given seq",
		steps: []string{"connect", "end", "live 0", "live 1", "rewind 0", "reply 0", "reply 1", "end", "live 2"},
		want: []string{"replay 0", "deliver a0 live", "deliver a1 live", "rewind next 0", "replay 0",
			"deliver a0 replay", "deliver a1 replay", "deliver a2 live"},
	}, {
		name:  "live batches a replay already delivered are dropped",
		steps: []string{"connect", "live 1", "reply 0", "reply 1", "reply 2", "end", "live 2", "live 3"},
		want:  []string{"replay 0", "deliver a0 replay", "deliver a1 live", "deliver a2 replay", "deliver a3 live"},
	}, {
		name:  "a probe replays from the last delivered batch and finds what the live stream lost",
		steps: []string{"connect", "end", "probe", "reply 0", "end", "probe", "reply 0", "reply 1", "end", "live 2"},
		want:  []string{"replay 0", "replay 0", "deliver a0 replay", "replay 0", "deliver a1 replay", "deliver a2 live"},
	}, {
		name:  "a probe while a replay runs does nothing",
		steps: []string{"connect", "probe", "reply 0", "end"},
		want:  []string{"replay 0", "deliver a0 replay"},
	}, {
		name:  "replies with no replay in flight are ignored",
		steps: []string{"connect", "end", "reply 0", "end", "live 0"},
		want:  []string{"replay 0", "deliver a0 live"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			maxPending := tt.maxPending
			if maxPending == 0 {
				maxPending = 100
			}
			maxPendingBytes := tt.maxPendingBytes
			if maxPendingBytes == 0 {
				maxPendingBytes = 1 << 20
			}
			got := runSequencer(t, maxPending, maxPendingBytes, tt.steps)
			if !slices.Equal(got, tt.want) {
				t.Errorf("steps %q\n got  %q\n want %q", tt.steps, got, tt.want)
			}
		})
	}
}
