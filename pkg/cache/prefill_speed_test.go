package cache

import (
	"math"
	"testing"
	"time"
)

func TestPrefillSampleTokensPerSecond(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name   string
		sample PrefillSample
		want   float64 // NaN: measures nothing
	}{
		{"one step's time comes off each prefill",
			// 10 prefills of 1,000 tokens at 20,000 tokens/s, each in one
			// step of 5 ms besides its tokens.
			PrefillSample{ComputedTokens: 10000, Prefills: 10, PrefillSeconds: 10 * (0.05 + 0.005), StepSeconds: 0.005}, 20000},
		{"short prefills measure the same speed",
			// 100 prefills of 64 tokens: 3.2 ms of tokens, 5 ms of step.
			PrefillSample{ComputedTokens: 6400, Prefills: 100, PrefillSeconds: 100 * (0.0032 + 0.005), StepSeconds: 0.005}, 20000},
		{"without a step time the whole prefill time counts",
			PrefillSample{ComputedTokens: 6400, Prefills: 100, PrefillSeconds: 0.82}, 6400 / 0.82},
		{"a quarter of the time left for tokens is enough",
			PrefillSample{ComputedTokens: 1000, Prefills: 3, PrefillSeconds: 0.5, StepSeconds: 0.125}, 1000 / 0.125},
		{"a step with other prompt tokens in it, as prefills and decodes both see it",
			// 10 prefills of 1,000 tokens, each in a step that also computed
			// 200 tokens of another prompt, as the mean decoding step did.
			PrefillSample{ComputedTokens: 10000, Prefills: 10, PrefillSeconds: 10 * (0.05 + 0.005 + 0.01), StepSeconds: 0.015}, 20000},
		{"less than a quarter left measures nothing",
			// 16 uncached tokens per request: 0.8 ms against a 5 ms step.
			PrefillSample{ComputedTokens: 1600, Prefills: 100, PrefillSeconds: 100 * 0.0058, StepSeconds: 0.005}, nan},
		{"a step time above the prefill time measures nothing",
			PrefillSample{ComputedTokens: 1000, Prefills: 10, PrefillSeconds: 0.05, StepSeconds: 0.01}, nan},
		{"only cache hits", PrefillSample{ComputedTokens: 0, Prefills: 5, PrefillSeconds: 1, StepSeconds: 0.01}, nan},
		{"hits counted ahead of their prompts", PrefillSample{ComputedTokens: -200, Prefills: 5, PrefillSeconds: 1}, nan},
		{"no prefill time", PrefillSample{ComputedTokens: 1000, Prefills: 5}, nan},
		{"no prefills counted", PrefillSample{ComputedTokens: 1000, PrefillSeconds: 1}, nan},
		{"NaN tokens", PrefillSample{ComputedTokens: nan, Prefills: 5, PrefillSeconds: 1}, nan},
		{"NaN step time", PrefillSample{ComputedTokens: 1000, Prefills: 5, PrefillSeconds: 1, StepSeconds: nan}, 1000},
		{"infinite tokens", PrefillSample{ComputedTokens: math.Inf(1), Prefills: 5, PrefillSeconds: 1}, nan},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.sample.TokensPerSecond()
			switch {
			case math.IsNaN(tt.want) && ok:
				t.Fatalf("TokensPerSecond() = %v, want no measure", got)
			case math.IsNaN(tt.want):
			case !ok:
				t.Fatalf("TokensPerSecond() measured nothing, want %v", tt.want)
			case math.Abs(got-tt.want) > 1e-9*tt.want:
				t.Fatalf("TokensPerSecond() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPrefillSampleNeverExceedsFourTimesTheWholeStepRatio(t *testing.T) {
	for step := 0.0; step < 0.02; step += 0.0005 {
		s := PrefillSample{ComputedTokens: 5000, Prefills: 40, PrefillSeconds: 1, StepSeconds: step}
		if v, ok := s.TokensPerSecond(); ok && v > 4*5000/1.0 {
			t.Fatalf("step %v s: %v tokens/s, above four times the whole-step ratio", step, v)
		}
	}
}

// TestPrefillSpeedKeepsItsEstimateThroughWindowsOfCacheHits feeds the Store's
// projection a window of long prefills, then windows of prefills that were
// nearly all cache hits: those measure nothing, and the estimate stands.
func TestPrefillSpeedKeepsItsEstimateThroughWindowsOfCacheHits(t *testing.T) {
	g := groupState{prefillKeep: time.Minute} // windows of length 0: each scrape against the previous one
	var c counters
	at := time.Unix(100, 0)
	scrape := func(tokens, hits, prefills, seconds float64) (float64, bool) {
		at = at.Add(time.Second)
		c.add(cPromptTokens, tokens)
		c.add(cPrefixHits, hits)
		c.add(cPrefillCount, prefills)
		c.add(cPrefillSum, seconds)
		return g.prefillSpeed(at, c, 0.005)
	}
	scrape(0, 0, 0, 0)
	// 4 prefills of 2,000 tokens at 10,000 tokens/s, and a step of 5 ms.
	long := 10000.0
	if v, ok := scrape(8000, 0, 4, 4*(0.2+0.005)); !ok || math.Abs(v-long) > 1e-6 {
		t.Fatalf("after long prefills: %v, %v; want %v", v, ok, long)
	}
	// 50 prefills of 2,010 tokens, 2,000 of them cached: 1 ms of tokens
	// against a 5 ms step.
	if v, ok := scrape(50*2010, 50*2000, 50, 50*0.006); !ok || math.Abs(v-long) > 1e-6 {
		t.Fatalf("after cache hits: %v, %v; want the estimate kept at %v", v, ok, long)
	}
	// A later window with measurable prefills replaces it.
	faster := 20000.0
	if v, ok := scrape(2*5000, 0, 2, 2*(0.25+0.005)); !ok || math.Abs(v-faster) > 1e-6 {
		t.Fatalf("after faster prefills: %v, %v; want %v", v, ok, faster)
	}
}

// TestPrefillSpeedEstimateExpiresAfterAWindowWithoutMeasure: a pod whose
// windows stop measuring its speed keeps the estimate for prefillKeep, then
// has none, so that routing stops acting on an estimate nothing confirms.
func TestPrefillSpeedEstimateExpiresAfterAWindowWithoutMeasure(t *testing.T) {
	g := groupState{prefillKeep: 10 * time.Second}
	var c counters
	at := time.Unix(100, 0)
	scrape := func(after time.Duration, tokens, hits, prefills, seconds float64) (float64, bool) {
		at = at.Add(after)
		c.add(cPromptTokens, tokens)
		c.add(cPrefixHits, hits)
		c.add(cPrefillCount, prefills)
		c.add(cPrefillSum, seconds)
		return g.prefillSpeed(at, c, 0.005)
	}
	scrape(0, 0, 0, 0, 0)
	if v, ok := scrape(time.Second, 8000, 0, 4, 4*(0.2+0.005)); !ok || math.Abs(v-10000) > 1e-6 {
		t.Fatalf("after long prefills: %v, %v; want 10000", v, ok)
	}
	if _, ok := scrape(10*time.Second, 50*2010, 50*2000, 50, 50*0.006); !ok {
		t.Fatal("estimate dropped 10 s after it was measured, want it kept for 10 s")
	}
	if v, ok := scrape(time.Second, 50*2010, 50*2000, 50, 50*0.006); ok {
		t.Fatalf("estimate %v still given 11 s after it was measured, want none", v)
	}
	if v, ok := scrape(time.Second, 2*5000, 0, 2, 2*(0.25+0.005)); !ok || math.Abs(v-20000) > 1e-6 {
		t.Fatalf("after new long prefills: %v, %v; want 20000", v, ok)
	}
}
