package sim

import "time"

// LatencyModel prices one scheduler step of the simulated model:
//
//	StepOverhead + PrefillPerToken × prefill tokens + DecodePerToken × decode tokens
//
// A step computes the tokens the scheduler gave it: prompt tokens not found
// in the prefix cache (the prefill tokens, including the recomputation of a
// preempted request) and one token for each running request that is
// decoding. Cached prompt tokens cost nothing, so a prefix hit shortens the
// prefill and therefore the time to first token; a larger batch makes every
// step, and so every request's inter-token latency, longer. The zero value
// makes every step instantaneous.
type LatencyModel struct {
	// StepOverhead is the fixed cost of a step (kernel launches, reading the
	// weights, sampling); a decode step of a small batch costs about this.
	StepOverhead time.Duration
	// PrefillPerToken is the cost of computing one prompt token.
	PrefillPerToken time.Duration
	// DecodePerToken is the cost of one sequence decoding one token.
	DecodePerToken time.Duration
}

// StepTime returns the duration of a step that computes prefillTokens prompt
// tokens and decodeTokens decode tokens.
func (m LatencyModel) StepTime(prefillTokens, decodeTokens int) time.Duration {
	return m.StepOverhead +
		time.Duration(prefillTokens)*m.PrefillPerToken +
		time.Duration(decodeTokens)*m.DecodePerToken
}
