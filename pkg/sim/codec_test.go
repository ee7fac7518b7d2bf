package sim

import (
	"bytes"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// codecWorkload runs requests that exercise every event the engine emits:
// prefill and decode stores, a LoRA adapter's stores, evictions and a reset.
func codecWorkload(t *testing.T) []*kvevent.EventBatch {
	t.Helper()
	e := newTestEngine(t, func(c *EngineConfig) { c.NumGPUBlocks = 9; c.DataParallelRank = 1 })
	lora := &LoRA{Name: "sql-adapter", ID: 7}
	specs := []RequestSpec{
		{ID: "base", Prompt: seqTokens(1, 13), MaxTokens: 6},
		{ID: "lora", Prompt: seqTokens(1, 13), MaxTokens: 3, LoRA: lora},
		{ID: "evicts", Prompt: seqTokens(5000, 21), MaxTokens: 2},
	}
	var batches []*kvevent.EventBatch
	now := t0
	for _, spec := range specs {
		mustAdd(t, e, spec, now)
		for _, s := range runUntilIdle(t, e, now) {
			if s.Batch != nil {
				batches = append(batches, s.Batch)
			}
			now = s.End
		}
	}
	reset, err := e.ResetPrefixCache(now)
	if err != nil {
		t.Fatal(err)
	}
	return append(batches, reset)
}

func TestEngineBatchesSurviveTheCodec(t *testing.T) {
	batches := codecWorkload(t)
	kinds := map[kvevent.EventType]bool{}
	for i, b := range batches {
		for _, ev := range b.Events {
			kinds[ev.GetType()] = true
		}
		for _, layout := range []kvevent.Layout{kvevent.LayoutCurrent, kvevent.LayoutPositional} {
			payload, err := kvevent.AppendEventBatch(nil, b, layout)
			if err != nil {
				t.Fatalf("batch %d: encode %v: %v", i, layout, err)
			}
			got, err := kvevent.DecodeEventBatch(payload)
			if err != nil {
				t.Fatalf("batch %d: decode %v: %v", i, layout, err)
			}
			if !reflect.DeepEqual(got, b) {
				t.Errorf("batch %d in layout %v decodes to\n%+v\nwant\n%+v", i, layout, got, b)
			}
		}
	}
	if len(kinds) != 3 {
		t.Errorf("workload produced only %v", kinds)
	}
}

// TestPrefillBatchMatchesGolden pins the bytes of a prefill batch: the hash
// scheme, the token ids and vLLM's current layout. A change here changes
// every simulated fleet's block hashes.
func TestPrefillBatchMatchesGolden(t *testing.T) {
	e, err := NewEngine(EngineConfig{BlockSize: 16, NumGPUBlocks: 64, HashSeed: "golden", Events: true})
	if err != nil {
		t.Fatal(err)
	}
	prompt := Tokenizer{}.Encode("The simulator hashes blocks like vLLM: sha256 chained over the parent's full digest, "+
		"with a seed per engine, and sends the low 64 bits.", true)
	at := time.Date(2026, 1, 2, 3, 4, 5, 250_000_000, time.UTC)
	mustAdd(t, e, RequestSpec{ID: "golden", Prompt: prompt, MaxTokens: 1}, at)
	e.BeginStep(at)
	payload, err := kvevent.EncodeEventBatch(e.EndStep().Batch)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "prefill_batch.hex")
	if *update {
		if err := os.WriteFile(path, []byte(hex.EncodeToString(payload)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got := hex.EncodeToString(payload); got != string(bytes.TrimSpace(want)) {
		t.Errorf("prefill batch\n%s\nwant (%s)\n%s", got, path, want)
	}
}
