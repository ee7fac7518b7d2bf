package routingbench

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/sim"
)

func TestMooncakeBlockIsAFixedFunctionOfTheID(t *testing.T) {
	// Pinned: changing the expansion changes every number the benchmark
	// reports for a trace.
	for id, want := range map[uint64][]uint32{
		0:     {20143, 22260, 8783, 8940},
		12345: {31392, 3565, 18205, 12234},
	} {
		b := MooncakeBlock(id)
		if len(b) != MooncakeBlockTokens || !slices.Equal(b[:4], want) {
			t.Errorf("block %d: %d tokens starting %v, want %d starting %v", id, len(b), b[:4], MooncakeBlockTokens, want)
		}
		if !slices.Equal(b, MooncakeBlock(id)) {
			t.Errorf("block %d differs between calls", id)
		}
		for _, tok := range b {
			if tok < sim.FirstPieceID || tok >= sim.VocabSize {
				t.Fatalf("block %d holds token %d outside the ordinary pieces [%d, %d)", id, tok, sim.FirstPieceID, sim.VocabSize)
			}
		}
	}
	if a, b := MooncakeBlock(1), MooncakeBlock(2); slices.Equal(a[:16], b[:16]) {
		t.Error("blocks 1 and 2 start alike: a prompt would match a block it does not share")
	}
}

func TestLoadMooncakeExpandsHashIDsAndCutsTheLastBlock(t *testing.T) {
	trace := `{"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [1, 2]}

{"timestamp": 1.5, "input_length": 1100, "output_length": 0, "hash_ids": [1, 3, 4], "extra": "ignored"}
`
	w, err := LoadMooncake(strings.NewReader(trace), "t")
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 2 {
		t.Fatalf("%d requests, want 2", len(w.Requests))
	}
	a, b := w.Requests[0], w.Requests[1]
	wantA := append(MooncakeBlock(1), MooncakeBlock(2)[:700-512]...)
	wantB := slices.Concat(MooncakeBlock(1), MooncakeBlock(3), MooncakeBlock(4)[:1100-1024])
	if a.ID != "t-1" || a.Arrival != 0 || a.OutputTokens != 3 || !slices.Equal(a.Prompt, wantA) {
		t.Errorf("first request %s at %v, %d output tokens, %d prompt tokens: want t-1 at 0 with 3 and hash ids 1, 2 cut to 700",
			a.ID, a.Arrival, a.OutputTokens, len(a.Prompt))
	}
	if b.ID != "t-3" || b.Arrival != 1500*time.Microsecond || b.OutputTokens != 1 || !slices.Equal(b.Prompt, wantB) {
		t.Errorf("second request %s at %v, %d output tokens, %d prompt tokens: want t-3 at 1.5ms with 1 and hash ids 1, 3, 4 cut to 1100",
			b.ID, b.Arrival, b.OutputTokens, len(b.Prompt))
	}
}

func TestLoadMooncakeNamesTheLineOfBadInput(t *testing.T) {
	good := `{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1]}` + "\n"
	tests := []struct {
		name, line, want string
	}{
		{"not json", `{"timestamp": 1,`, "line 2"},
		{"no timestamp", `{"input_length": 10, "output_length": 1, "hash_ids": [1]}`, "no timestamp"},
		{"negative timestamp", `{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}`, "negative timestamp"},
		{"timestamp beyond time", `{"timestamp": 1e300, "input_length": 10, "output_length": 1, "hash_ids": [1]}`, "beyond"},
		{"empty prompt", `{"timestamp": 6, "input_length": 0, "output_length": 1, "hash_ids": []}`, "input_length 0"},
		{"negative output", `{"timestamp": 6, "input_length": 10, "output_length": -2, "hash_ids": [1]}`, "output_length -2"},
		{"too few hash ids", `{"timestamp": 6, "input_length": 513, "output_length": 1, "hash_ids": [1]}`, "1 hash ids for input_length 513, which spans 2 blocks"},
		{"too many hash ids", `{"timestamp": 6, "input_length": 512, "output_length": 1, "hash_ids": [1, 2]}`, "2 hash ids"},
		{"negative hash id", `{"timestamp": 6, "input_length": 10, "output_length": 1, "hash_ids": [-1]}`, "line 2"},
		{"backwards", `{"timestamp": 4, "input_length": 10, "output_length": 1, "hash_ids": [1]}`, "before the previous request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadMooncake(strings.NewReader(good+tt.line+"\n"), "bad")
			if err == nil || !strings.Contains(err.Error(), "bad line 2") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one naming line 2 and %q", err, tt.want)
			}
		})
	}
	if _, err := LoadMooncake(strings.NewReader("\n\n"), "empty"); err == nil || !strings.Contains(err.Error(), "no requests") {
		t.Errorf("empty trace: error %v, want no requests", err)
	}
}

func TestLoadMooncakeReadsTheSyntheticTrace(t *testing.T) {
	w := loadSyntheticTrace(t)
	st := w.Stats()
	want := WorkloadStats{Requests: 3993, PromptTokens: 61_194_628, OutputTokens: 595_432, Duration: 1_022_025 * time.Millisecond}
	if st != want {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
	if err := w.validate(sim.VocabSize); err != nil {
		t.Fatal(err)
	}
}

// loadSyntheticTrace loads the Mooncake-format trace of the testdata.
func loadSyntheticTrace(t testing.TB) Workload {
	t.Helper()
	f, err := os.Open("testdata/mooncake_synthetic_trace.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := LoadMooncake(f, "mooncake")
	if err != nil {
		t.Fatal(err)
	}
	return w
}
