package sim

import (
	"math"
	"time"
)

// LatencyModel prices one scheduler step of the simulated model:
//
//	(StepOverhead
//	 + PrefillPerToken × prefill tokens + AttentionPerContextToken × Σ context of each prefill token
//	 + DecodePerToken × decode tokens + DecodePerContextToken × Σ context of each decode token) / Speed
//
// A step computes the tokens the scheduler gave it: prompt tokens not found
// in the prefix cache (the prefill tokens, including the recomputation of a
// preempted request) and one token for each running request that is
// decoding. A token's context is the number of tokens of its sequence
// before it, cached or not: the keys and values its attention reads.
//
// The linear terms are the work every token costs whatever its position
// (the weights' matrix multiplications). The context terms are attention:
// a prefill token attends to every earlier token of its sequence, so a
// prompt of n uncached tokens after c cached ones costs
// n × (c + (n-1)/2) context tokens, growing with the square of the
// prompt's length, and a prefix hit saves its own tokens' work but not the
// attention of the tokens after it to them; a decoding sequence reads its
// whole KV cache every step, so a decode step grows with the batch's total
// context. With both context terms zero the model is linear in tokens and
// cached tokens cost nothing at any length.
//
// Speed scales the whole step, standing for a faster or slower GPU (or
// tensor-parallel group) running the same model: 2 halves every step.
//
// The zero value makes every step instantaneous.
type LatencyModel struct {
	// StepOverhead is the fixed cost of a step (kernel launches, reading the
	// weights, sampling); a decode step of a small batch costs about this.
	StepOverhead time.Duration
	// PrefillPerToken is the cost of computing one prompt token, its
	// attention aside.
	PrefillPerToken time.Duration
	// AttentionPerContextToken is the cost of one prefill token's attention
	// to one earlier token of its sequence. A duration has a resolution of
	// a nanosecond: the cost is carried as a float, in nanoseconds.
	AttentionPerContextToken float64
	// DecodePerToken is the cost of one sequence decoding one token, its
	// attention aside.
	DecodePerToken time.Duration
	// DecodePerContextToken is the cost, in nanoseconds, of one decoding
	// sequence reading the KV cache of one token of its context.
	DecodePerContextToken float64
	// Speed divides every step's time; 0 means 1.
	Speed float64
}

// StepWork is what one step computes, in the terms LatencyModel prices.
type StepWork struct {
	// PrefillTokens counts the prompt tokens computed; PrefillContext sums,
	// over those tokens, the tokens before each in its sequence.
	PrefillTokens  int
	PrefillContext int64
	// DecodeTokens counts the sequences decoding one token; DecodeContext
	// sums their context lengths.
	DecodeTokens  int
	DecodeContext int64
}

// PrefillContext returns the context the tokens from to to (exclusive) of a
// sequence add up to: Σ i for i in [from, to), each token attending to the
// tokens before it.
func PrefillContext(from, to int) int64 {
	if to <= from {
		return 0
	}
	n := int64(to - from)
	return n*int64(from) + n*(n-1)/2
}

// AddPrefill accumulates the prefill of a sequence's tokens from to to
// (exclusive).
func (w *StepWork) AddPrefill(from, to int) {
	if to > from {
		w.PrefillTokens += to - from
		w.PrefillContext += PrefillContext(from, to)
	}
}

// AddDecode accumulates one sequence decoding the token at position ctx
// (after ctx tokens of context).
func (w *StepWork) AddDecode(ctx int) {
	w.DecodeTokens++
	w.DecodeContext += int64(ctx)
}

// Time returns the duration of a step that computes w.
func (m LatencyModel) Time(w StepWork) time.Duration {
	ns := float64(m.StepOverhead) +
		float64(w.PrefillTokens)*float64(m.PrefillPerToken) + float64(w.PrefillContext)*m.AttentionPerContextToken +
		float64(w.DecodeTokens)*float64(m.DecodePerToken) + float64(w.DecodeContext)*m.DecodePerContextToken
	return m.scale(ns)
}

// PrefillTime returns the compute time of prefilling a sequence's tokens
// from to to (exclusive), without any step's overhead.
func (m LatencyModel) PrefillTime(from, to int) time.Duration {
	if to <= from {
		return 0
	}
	ns := float64(to-from)*float64(m.PrefillPerToken) + float64(PrefillContext(from, to))*m.AttentionPerContextToken
	return m.scale(ns)
}

// scale divides ns by the model's speed and rounds it to a duration.
func (m LatencyModel) scale(ns float64) time.Duration {
	if m.Speed > 0 {
		ns /= m.Speed
	}
	return time.Duration(math.Round(ns))
}

// valid reports whether every cost is non-negative and finite and the speed
// is not negative.
func (m LatencyModel) valid() bool {
	finite := func(v float64) bool { return v >= 0 && !math.IsInf(v, 0) && !math.IsNaN(v) }
	return m.StepOverhead >= 0 && m.PrefillPerToken >= 0 && m.DecodePerToken >= 0 &&
		finite(m.AttentionPerContextToken) && finite(m.DecodePerContextToken) && finite(m.Speed)
}
