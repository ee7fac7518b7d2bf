package sim

import (
	"math"
	"slices"
	"testing"
	"time"
)

// attention is the cost of a prefill token's attention to one earlier
// token in the tests below: 1 µs.
const attention = 1000.0

func TestPrefillAttentionGrowsWithTheSquareOfThePrompt(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.Latency.AttentionPerContextToken = attention })
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(300, 10), MaxTokens: 1}, t0)
	end, ok := e.BeginStep(t0)
	if !ok {
		t.Fatal("nothing scheduled")
	}
	// 10 tokens attend to 0+1+...+9 = 45 earlier tokens.
	if want := overhead + 10*perPrefill + 45*time.Microsecond; end.Sub(t0) != want {
		t.Errorf("prefill of 10 tokens takes %v, want %v", end.Sub(t0), want)
	}
}

func TestACachedPrefixSavesItsWorkButNotTheAttentionToIt(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.Latency.AttentionPerContextToken = attention })
	prefix := seqTokens(300, 16)
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: append(slices.Clone(prefix), 900), MaxTokens: 1}, t0)
	steps := runUntilIdle(t, e, t0)
	now := steps[len(steps)-1].End
	mustAdd(t, e, RequestSpec{ID: "b", Prompt: append(slices.Clone(prefix), 901, 902, 903, 904), MaxTokens: 1}, now)
	end, _ := e.BeginStep(now)
	res := e.EndStep()
	if got := res.Outputs[0].Stats.CachedTokens; got != 16 {
		t.Fatalf("b found %d tokens cached, want the 16 of the shared prefix", got)
	}
	// The 4 uncached tokens attend to the 16 cached ones and to each
	// other: 16+17+18+19 = 70 earlier tokens.
	if want := overhead + 4*perPrefill + 70*time.Microsecond; end.Sub(now) != want {
		t.Errorf("prefill of 4 tokens after a 16-token hit takes %v, want %v", end.Sub(now), want)
	}
}

func TestChunkedPrefillCostsWhatOneStepWould(t *testing.T) {
	for _, split := range []int{1, 7, 50, 99} {
		if a, b := PrefillContext(0, split)+PrefillContext(split, 100), PrefillContext(0, 100); a != b {
			t.Errorf("chunks split at %d add up to %d context tokens, one chunk to %d", split, a, b)
		}
	}
	e := newTestEngine(t, func(c *EngineConfig) {
		c.Latency.AttentionPerContextToken = attention
		c.MaxNumBatchedTokens = 8
	})
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(300, 20), MaxTokens: 1}, t0)
	steps := runUntilIdle(t, e, t0)
	if len(steps) != 3 {
		t.Fatalf("%d steps, want chunks of 8, 8 and 4", len(steps))
	}
	// 20 tokens attend to 190 earlier tokens in all, whatever the chunks.
	if want := 3*overhead + 20*perPrefill + 190*time.Microsecond; steps[2].End.Sub(t0) != want {
		t.Errorf("chunked prefill ends after %v, want %v", steps[2].End.Sub(t0), want)
	}
}

func TestDecodeStepsGrowWithTheBatchsContext(t *testing.T) {
	const perContext = 100.0 // ns per context token read
	e := newTestEngine(t, func(c *EngineConfig) { c.Latency.DecodePerContextToken = perContext })
	mustAdd(t, e, RequestSpec{ID: "short", Prompt: seqTokens(300, 4), MaxTokens: 3}, t0)
	mustAdd(t, e, RequestSpec{ID: "long", Prompt: seqTokens(500, 40), MaxTokens: 3}, t0)
	first, _ := e.BeginStep(t0)
	e.EndStep()
	end, _ := e.BeginStep(first)
	res := e.EndStep()
	if res.Stats.DecodeTokens != 2 {
		t.Fatalf("second step %+v: want both requests decoding", res.Stats)
	}
	// Each computes its first output token, after its prompt: contexts 4
	// and 40.
	want := overhead + 2*perDecode + time.Duration((4+40)*perContext)
	if end.Sub(first) != want {
		t.Errorf("decode step takes %v, want %v", end.Sub(first), want)
	}
}

func TestSpeedScalesEveryStep(t *testing.T) {
	lat := LatencyModel{StepOverhead: overhead, PrefillPerToken: perPrefill, DecodePerToken: perDecode,
		AttentionPerContextToken: attention, DecodePerContextToken: 100}
	w := StepWork{}
	w.AddPrefill(10, 30)
	w.AddDecode(1000)
	base := lat.Time(w)
	for _, speed := range []float64{0.5, 2, 3} {
		fast := lat
		fast.Speed = speed
		if got, want := fast.Time(w), time.Duration(math.Round(float64(base)/speed)); got != want {
			t.Errorf("speed %v: step takes %v, want %v", speed, got, want)
		}
		if got, want := fast.PrefillTime(10, 30), time.Duration(math.Round(float64(lat.PrefillTime(10, 30))/speed)); got != want {
			t.Errorf("speed %v: prefill takes %v, want %v", speed, got, want)
		}
	}
	if lat.PrefillTime(30, 10) != 0 {
		t.Error("an empty range of tokens costs time")
	}
}

func TestEnginesRefuseInvalidLatencyModels(t *testing.T) {
	for _, lat := range []LatencyModel{
		{StepOverhead: -1},
		{AttentionPerContextToken: -1},
		{DecodePerContextToken: math.NaN()},
		{AttentionPerContextToken: math.Inf(1)},
		{Speed: -2},
	} {
		if _, err := NewEngine(EngineConfig{NumGPUBlocks: 8, Latency: lat}); err == nil {
			t.Errorf("latency model %+v accepted", lat)
		}
	}
}

func TestBacklogCostPricesTheQueuedPrefillsAndTheDecodingBatch(t *testing.T) {
	lat := LatencyModel{StepOverhead: overhead, PrefillPerToken: perPrefill, DecodePerToken: perDecode,
		AttentionPerContextToken: attention, DecodePerContextToken: 100}
	e := newTestEngine(t, func(c *EngineConfig) {
		c.Latency = lat
		c.MaxNumBatchedTokens = 8
	})
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(300, 6), MaxTokens: 5}, t0)
	end, _ := e.BeginStep(t0)
	e.EndStep()
	mustAdd(t, e, RequestSpec{ID: "b", Prompt: seqTokens(600, 12), MaxTokens: 5}, end)
	mustAdd(t, e, RequestSpec{ID: "c", Prompt: seqTokens(900, 5), MaxTokens: 5}, end)
	e.BeginStep(end) // a decodes, b prefills its first 7 tokens
	prefill, decoding := e.BacklogCost()
	if want := lat.PrefillTime(7, 12) + lat.PrefillTime(0, 5); prefill != want {
		t.Errorf("backlog prefill %v, want %v (rest of b, all of c)", prefill, want)
	}
	if decoding.DecodeTokens != 1 || decoding.DecodeContext != 6 {
		t.Errorf("decoding batch %+v, want a decoding after a context of 6", decoding)
	}
}
