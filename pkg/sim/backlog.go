package sim

import "time"

// Backlog is the work an engine has accepted but not yet prefilled, in the
// terms of its scheduler: what a request added now would queue behind. It
// lets a caller that sees the engine (a simulation's oracle) predict when a
// new request would get its first token.
type Backlog struct {
	// PrefillTokens counts the tokens the engine must still compute before
	// every request it holds has its prompt done: the rest of each running
	// request's prompt (a preempted request's generated tokens included),
	// and each waiting request's tokens less the prefix its KV cache holds
	// now, which admission would take from the cache if nothing evicted it
	// first. Tokens of the step in flight count as computed.
	PrefillTokens int
	// Decoding counts the running requests done with their prompt (those
	// finishing it in the step in flight included). Each takes one token of
	// every step's budget and prices every step at DecodePerToken.
	Decoding int
}

// Backlog returns the engine's backlog. It changes nothing. Unlike
// QueueState it looks every waiting request up in the prefix cache, a map
// lookup per cached block.
func (e *Engine) Backlog() Backlog {
	var b Backlog
	for _, r := range e.running {
		if r.computed < r.seq.Len()-1 {
			b.PrefillTokens += r.seq.Len() - r.computed
		} else {
			b.Decoding++
		}
	}
	for _, r := range e.waiting {
		b.PrefillTokens += r.seq.Len() - e.kv.ComputedBlocks(r.seq)*e.cfg.BlockSize
	}
	return b
}

// BacklogCost prices the engine's backlog with its latency model: prefill is
// the compute time of the prefill work Backlog counts, each token's
// attention to the tokens before it included (the prefix a waiting request
// finds cached counts as context, not as work), without step overheads;
// decoding is what the running requests done with their prompt add to every
// step, one token each at its current context. It changes nothing.
func (e *Engine) BacklogCost() (prefill time.Duration, decoding StepWork) {
	lat := e.cfg.Latency
	for _, r := range e.running {
		if r.computed < r.seq.Len()-1 {
			prefill += lat.PrefillTime(r.computed, r.seq.Len())
		} else {
			decoding.AddDecode(r.seq.Len() - 1)
		}
	}
	for _, r := range e.waiting {
		prefill += lat.PrefillTime(e.kv.ComputedBlocks(r.seq)*e.cfg.BlockSize, r.seq.Len())
	}
	return prefill, decoding
}
