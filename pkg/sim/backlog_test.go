package sim

import (
	"slices"
	"testing"
)

func TestBacklogCountsPromptWorkLeftAgainstTheCache(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.MaxNumSeqs = 1; c.MaxNumBatchedTokens = 8 })
	shared := seqTokens(1, 20)
	mustAdd(t, e, RequestSpec{ID: "warm", Prompt: shared, MaxTokens: 1}, t0)
	steps := runUntilIdle(t, e, t0)
	at := steps[len(steps)-1].End
	if b := e.Backlog(); b != (Backlog{}) {
		t.Fatalf("idle engine's backlog %+v, want none", b)
	}

	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(500, 20), MaxTokens: 2}, at)
	mustAdd(t, e, RequestSpec{ID: "b", Prompt: append(slices.Clone(shared), seqTokens(900, 6)...), MaxTokens: 2}, at)
	end, _ := e.BeginStep(at)
	// a runs with 8 of its 20 tokens in flight; b waits, its first 5 blocks
	// cached.
	if got, want := e.Backlog(), (Backlog{PrefillTokens: 12 + 6}); got != want {
		t.Errorf("backlog during a's first chunk %+v, want %+v", got, want)
	}
	e.EndStep()
	for range 2 { // a's last two chunks: 8 then 4 tokens
		end, _ = e.BeginStep(end)
		e.EndStep()
	}
	if got, want := e.Backlog(), (Backlog{PrefillTokens: 6, Decoding: 1}); got != want {
		t.Errorf("backlog once a decodes %+v, want %+v", got, want)
	}
}
