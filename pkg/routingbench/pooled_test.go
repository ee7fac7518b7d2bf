package routingbench

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/sim"
)

// block returns 16 token ids that no other block shares.
func block(i int) []uint32 {
	out := make([]uint32, 16)
	for j := range out {
		out[j] = sim.FirstPieceID + uint32(i*16+j)
	}
	return out
}

// prompt joins blocks, plus extra tokens.
func prompt(blocks []int, extra int) []uint32 {
	var out []uint32
	for _, b := range blocks {
		out = append(out, block(b)...)
	}
	return append(out, block(999)[:extra]...)
}

// pooledFleet is engines identical engines of 5 blocks, 4 usable.
func pooledFleet(engines int) Config {
	return Config{Engines: engines, Engine: sim.EngineConfig{BlockSize: 16, NumGPUBlocks: 5, MaxModelLen: 64, Latency: linearLatency}}
}

func TestPooledBoundIsOneLRUCacheOfTheWholeFleet(t *testing.T) {
	reqs := []Request{
		{Prompt: prompt([]int{1, 2}, 1)},    // miss; caches 1, 2
		{Prompt: prompt([]int{1, 2}, 1)},    // hits 1, 2
		{Prompt: prompt([]int{1, 2}, 0)},    // hits 1 only: vLLM recomputes the block of the last token
		{Prompt: prompt([]int{3, 4, 5}, 1)}, // miss; 1, 2 and 3, 4, 5 need 5 blocks: 2 is evicted first
		{Prompt: prompt([]int{1, 2}, 1)},    // hits 1 (the head outlived its tail)
	}
	for i := range reqs {
		reqs[i].ID, reqs[i].Arrival, reqs[i].OutputTokens = string(rune('a'+i)), time.Duration(i), 1
	}
	w := Workload{Name: "blocks", Requests: reqs}
	b, err := NewPooledBound(pooledFleet(1), &w)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 32, 16, 0, 16}; !slices.Equal(b.hits, want) {
		t.Errorf("hits %v, want %v", b.hits, want)
	}
	if b.Blocks != 4 || b.CachedTokens != 64 || !closeTo(b.HitRatio, 64/float64(b.PromptTokens)) {
		t.Errorf("bound %+v", b)
	}
	// Two engines pool 8 blocks: nothing is evicted.
	if b, _ := NewPooledBound(pooledFleet(2), &w); !slices.Equal(b.hits, []int{0, 32, 16, 0, 32}) {
		t.Errorf("hits on two engines %v, want every repeat found", b.hits)
	}
}

func TestPooledBoundFindsTheAnswersAConversationCarries(t *testing.T) {
	first := prompt([]int{1}, 0)
	answer := sim.GeneratedTokens(0, first, 0, 33)
	next := append(append(slices.Clone(first), answer...), block(7)...)
	w := Workload{Name: "chat", Requests: []Request{
		{ID: "a", Prompt: first, OutputTokens: 33},
		{ID: "b", Arrival: 1, Prompt: next, OutputTokens: 1},
	}}
	cfg := pooledFleet(4)
	cfg.Engine.MaxModelLen = 0
	b, err := NewPooledBound(cfg, &w)
	if err != nil {
		t.Fatal(err)
	}
	// The first request caches its 16 prompt tokens and the 32 of the
	// answer's first 32 tokens (the last token's KV is never computed).
	if b.hits[1] != 48 {
		t.Errorf("the next turn found %d tokens, want the 48 of the prompt and answer", b.hits[1])
	}
}

func TestNoPolicyBeatsThePooledBound(t *testing.T) {
	w := docsWorkload(400, 16, 2048, 64, 15, 3)
	rep, err := Run(context.Background(), smallFleet(), w)
	if err != nil {
		t.Fatal(err)
	}
	logTable(t, rep)
	if rep.Bound == nil || rep.Bound.HitRatio <= 0 {
		t.Fatalf("bound %+v", rep.Bound)
	}
	for _, res := range rep.Results {
		if res.HitRatio > rep.Bound.HitRatio || !closeTo(res.HitRatioOfBound, res.HitRatio/rep.Bound.HitRatio) {
			t.Errorf("%s: hit ratio %.3f, %.3f of the bound %.3f", res.Policy, res.HitRatio, res.HitRatioOfBound, rep.Bound.HitRatio)
		}
	}
	if kv := rep.Result(routing.KVAware); kv.HitRatioOfBound < 0.5 {
		t.Errorf("kv-aware reaches %.3f of the bound", kv.HitRatioOfBound)
	}
}
