package cache

import "math"

// minPrefillComputeShare is the least share of the prefill time that must
// be left for computing tokens once one step per prefill is taken out, for a
// PrefillSample to measure a speed. Below it the estimate would mostly
// reflect the error in the step time: requests that were nearly all cache
// hits tell how long a step lasts, not how fast the engine computes.
const minPrefillComputeShare = 0.25

// PrefillSample is what an engine's metrics tell of its prefills over an
// interval, the input of PrefillTokensPerSecond. The Store builds one per
// pod (and per model on a pod) from each scrape's window; a simulation can
// build its own to derive the speed exactly as the Store does.
type PrefillSample struct {
	// ComputedTokens is the prompt tokens the engine computed rather than
	// took from its prefix cache: the growth of vllm:prompt_tokens_total
	// less that of vllm:prefix_cache_hits_total.
	ComputedTokens float64
	// Prefills and PrefillSeconds are the growth of the count and of the
	// sum of vllm:request_prefill_time_seconds: the requests whose prefill
	// ended, and the time from their first scheduling to their first token.
	Prefills, PrefillSeconds float64
	// StepSeconds is the engine's mean inter-token latency over the
	// interval, the mean length of its steps; 0 when unknown.
	StepSeconds float64
}

// TokensPerSecond returns the prefill speed the sample measures, in prompt
// tokens computed per second of computing them,
//
//	ComputedTokens / (PrefillSeconds - Prefills x StepSeconds)
//
// and false when it measures none.
//
// A request's prefill time spans whole engine steps. Besides the prompt
// tokens it computes, a step pays a fixed cost and advances every request
// decoding, and it may compute other requests' prompt tokens too. The mean
// inter-token latency is the length of a step as a decoding request sees
// it: the same costs, other requests' prompt tokens included. Most prefills
// end within one step, so each prefill's time less one such step is the
// time of its own tokens. A prompt prefilled in chunks over several steps
// pays the other steps too, which is small next to the long prompt that
// needs them.
//
// The speed reads low when more prefills share steps than decoding steps
// carry prompt tokens (each prefill then counts the others' tokens in its
// time), as under a load that queues prefills; it reads high when the
// steps are full of prompt chunks that prefills do not share, as when long
// prompts fill the engine's token budget step after step. It is never below
// ComputedTokens / PrefillSeconds, a bound that always holds.
//
// It reports false when the sample has no computed tokens, no prefill time
// or no prefills, or when less than a quarter of the prefill time is left
// once one step per prefill is taken out: then the prefills were so short
// (nearly all cache hits) that the error of the step time would dominate,
// and the speed could read up to four times too high.
func (s PrefillSample) TokensPerSecond() (float64, bool) {
	if !(s.ComputedTokens > 0 && s.PrefillSeconds > 0 && s.Prefills > 0) || math.IsInf(s.ComputedTokens, 0) {
		return 0, false
	}
	compute := s.PrefillSeconds
	if s.StepSeconds > 0 {
		compute -= s.Prefills * s.StepSeconds
	}
	if !(compute >= minPrefillComputeShare*s.PrefillSeconds) {
		return 0, false
	}
	speed := s.ComputedTokens / compute
	if speed < MinPrefillTokensPerSecond || speed > MaxPrefillTokensPerSecond {
		return 0, false
	}
	return speed, true
}

// MinPrefillTokensPerSecond and MaxPrefillTokensPerSecond bound the prefill
// speed a scrape is believed: no engine prefills less than a token a
// second or more than a hundred million. A speed beyond them comes of
// counters no engine writes, and would make its pod look idle whatever
// its queue (or, near zero, overflow the prediction of its queue); it is
// not measured, and the pod gets the fleet's median.
const (
	MinPrefillTokensPerSecond = 1
	MaxPrefillTokensPerSecond = 1e8
)
