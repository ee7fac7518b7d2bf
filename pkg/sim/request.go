package sim

import "time"

// RequestSpec describes a request submitted to an Engine.
type RequestSpec struct {
	// ID names the request; it must be unique among the engine's unfinished
	// requests.
	ID string
	// Prompt holds the prompt's token ids (at least one, each below the
	// engine's EngineConfig.VocabSize).
	Prompt []uint32
	// MaxTokens, when positive, makes the request generate exactly that many
	// tokens (finish reason "length"), as with vLLM's ignore_eos. When zero
	// the simulated model ends its answer with EOSID after the engine's
	// DefaultOutputTokens (finish reason "stop"). Either way generation stops
	// at the engine's MaxModelLen.
	MaxTokens int
	// LoRA is the adapter the request runs with, nil for the base model.
	LoRA *LoRA
	// Seed varies the generated tokens among requests with the same prompt
	// (for example the choices of one request with n > 1).
	Seed uint64
}

// FinishReason says why a request finished, in vLLM's terms.
type FinishReason string

// Finish reasons.
const (
	FinishStop   FinishReason = "stop"   // the model generated EOS
	FinishLength FinishReason = "length" // max tokens or the model length reached
	FinishAbort  FinishReason = "abort"  // the client went away
)

// RequestTimings records when a request passed each stage, in the engine's
// time (virtual or wall). A stage not reached yet is the zero time.
type RequestTimings struct {
	// Arrival is when the request was added.
	Arrival time.Time
	// Scheduled is when it was first scheduled.
	Scheduled time.Time
	// FirstToken is when its first token was produced: the end of the step
	// that completed its prefill.
	FirstToken time.Time
	// LastToken is when its latest token was produced.
	LastToken time.Time
}

// QueueTime is the time from arrival to first scheduling.
func (t RequestTimings) QueueTime() time.Duration { return t.Scheduled.Sub(t.Arrival) }

// TTFT is the time from arrival to the first token.
func (t RequestTimings) TTFT() time.Duration { return t.FirstToken.Sub(t.Arrival) }

// E2E is the time from arrival to the latest token, the end-to-end latency
// of a finished request.
func (t RequestTimings) E2E() time.Duration { return t.LastToken.Sub(t.Arrival) }

// RequestStats is a request's progress after a step.
type RequestStats struct {
	// PromptTokens is the prompt's length.
	PromptTokens int
	// CachedTokens is how many prompt tokens the first scheduling took from
	// the prefix cache (vLLM's num_cached_tokens, reported in usage as
	// prompt_tokens_details.cached_tokens).
	CachedTokens int
	// OutputTokens is how many tokens the request has generated.
	OutputTokens int
	// Preemptions counts how often the request lost its blocks to make room
	// for others and had to be recomputed.
	Preemptions int
	Timings     RequestTimings
}

// RequestOutput reports a token that a step generated for a request.
type RequestOutput struct {
	RequestID string
	// Token is the generated token id.
	Token uint32
	// Finished reports that this was the request's last token, for
	// FinishReason.
	Finished     bool
	FinishReason FinishReason
	Stats        RequestStats
}

// requestStatus is where a request is in the engine.
type requestStatus uint8

const (
	statusWaiting requestStatus = iota
	statusRunning
	statusFinished
)

// request is an Engine's state for one request.
type request struct {
	id     string
	seq    *Sequence
	status requestStatus
	// computed counts the tokens whose KV the engine has computed (or
	// scheduled for computation in the current step).
	computed int
	// maxOutput caps the output tokens; eosAt is the output count at which
	// the model generates EOS, 0 for never.
	maxOutput, eosAt int
	// genKey keys the tokens the model generates for this request.
	genKey uint64
	// admitted reports that the request was scheduled once, which fixes
	// stats.CachedTokens.
	admitted bool
	stats    RequestStats
}

// nextToken returns the token the model samples next for r.
func (r *request) nextToken() uint32 {
	i := r.stats.OutputTokens
	if r.eosAt > 0 && i == r.eosAt-1 {
		return EOSID
	}
	return outputToken(r.genKey, i)
}

// checkStop reports whether r is finished after sampling tok, in the order
// vLLM checks: length limits first, then EOS.
func (r *request) checkStop(tok uint32, maxModelLen int) (FinishReason, bool) {
	if r.seq.Len() >= maxModelLen || r.stats.OutputTokens >= r.maxOutput {
		return FinishLength, true
	}
	if tok == EOSID && r.eosAt > 0 {
		return FinishStop, true
	}
	return "", false
}
