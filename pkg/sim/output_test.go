package sim

import (
	"slices"
	"testing"
)

func TestGeneratedTokensAreWhatEnginesGenerate(t *testing.T) {
	prompt := seqTokens(300, 10)
	for _, seed := range []uint64{0, 9} {
		e := newTestEngine(t, func(c *EngineConfig) { c.OutputSeed = 77 })
		mustAdd(t, e, RequestSpec{ID: "a", Prompt: prompt, MaxTokens: 6, Seed: seed}, t0)
		var got []uint32
		for _, o := range outputsOf(runUntilIdle(t, e, t0), "a") {
			got = append(got, o.Token)
		}
		if want := GeneratedTokens(77, prompt, seed, 6); !slices.Equal(got, want) {
			t.Errorf("seed %d: engine generated %v, GeneratedTokens says %v", seed, got, want)
		}
	}
}
