package sim

import (
	"slices"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// scheduledRequest is a request and the tokens a step computes for it.
type scheduledRequest struct {
	r         *request
	numTokens int
}

// step accumulates what the step in flight did.
type step struct {
	start, end time.Time
	stats      StepStats
}

// StepStats summarises one step, for metrics.
type StepStats struct {
	// PrefillTokens and DecodeTokens count the tokens the step computed.
	PrefillTokens, DecodeTokens int
	// Running and Waiting count the requests in each queue after the step.
	Running, Waiting int
	// KVCacheUsage is the fraction of usable blocks held after the step.
	KVCacheUsage float64
	// PrefixCacheQueries and PrefixCacheHits count, in tokens, the prompts
	// the step admitted and how much of them the prefix cache held (vLLM's
	// prefix_cache_queries and prefix_cache_hits).
	PrefixCacheQueries, PrefixCacheHits int
	// Preemptions counts the requests the step preempted.
	Preemptions int
	// PromptTokens counts the prompt tokens of requests that got their first
	// token in this step, GenerationTokens the tokens generated (vLLM's
	// prompt_tokens and generation_tokens counters).
	PromptTokens, GenerationTokens int
}

// StepResult is what a step produced.
type StepResult struct {
	// Start and End delimit the step.
	Start, End time.Time
	// Outputs holds one token for each request the step generated for, in
	// scheduling order.
	Outputs []RequestOutput
	// Batch holds the KV-cache events of the step, stamped End, or is nil
	// when the step produced none (vLLM then publishes nothing).
	Batch *kvevent.EventBatch
	Stats StepStats
}

// BeginStep starts a step at now: it schedules requests as vLLM's v1
// scheduler does and returns when the step ends. It returns false, and
// starts nothing, when there is nothing to schedule. It panics if a step is
// already in flight.
//
// Running requests are served first, in order, each taking the rest of its
// prompt (chunked to the step's token budget) or one decode token. When the
// KV cache cannot hold a running request's next token, the most recently
// admitted running request is preempted (its blocks freed, its progress
// lost, itself put back at the head of the waiting queue) until it can.
// Then, unless something was preempted, waiting requests are admitted in
// order while the token budget, MaxNumSeqs and the KV cache allow, each
// first taking what the prefix cache holds of it.
func (e *Engine) BeginStep(now time.Time) (end time.Time, ok bool) {
	if e.inStep {
		panic("sim: BeginStep while a step is in flight")
	}
	e.step = step{start: now}
	e.scheduled = e.scheduled[:0]
	budget := e.scheduleRunning(e.cfg.MaxNumBatchedTokens)
	if e.step.stats.Preemptions == 0 {
		e.scheduleWaiting(budget, now)
	}
	if len(e.scheduled) == 0 {
		return time.Time{}, false
	}
	var work StepWork
	for _, s := range e.scheduled {
		if s.r.stats.OutputTokens > 0 && s.numTokens == 1 && s.r.computed == s.r.seq.Len()-1 {
			work.AddDecode(s.r.computed)
		} else {
			work.AddPrefill(s.r.computed, s.r.computed+s.numTokens)
		}
		s.r.computed += s.numTokens
	}
	e.step.stats.PrefillTokens, e.step.stats.DecodeTokens = work.PrefillTokens, work.DecodeTokens
	e.step.end = now.Add(e.cfg.Latency.Time(work))
	e.inStep = true
	return e.step.end, true
}

// scheduleRunning schedules the running requests and returns the token
// budget left.
func (e *Engine) scheduleRunning(budget int) int {
	for i := 0; i < len(e.running) && budget > 0; {
		r := e.running[i]
		n := min(r.seq.Len()-r.computed, budget, e.cfg.MaxModelLen-1-r.computed)
		if n <= 0 {
			i++
			continue
		}
		for !e.kv.AllocateSlots(r.seq, r.computed, 0, n) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			if victim == r {
				return budget
			}
		}
		e.scheduled = append(e.scheduled, scheduledRequest{r, n})
		budget -= n
		i++
	}
	return budget
}

// preempt frees r's blocks and puts it back at the head of the waiting
// queue, to be recomputed from scratch (its prefix may still be cached).
func (e *Engine) preempt(r *request) {
	e.kv.Free(r.seq)
	r.status = statusWaiting
	r.computed = 0
	r.stats.Preemptions++
	e.step.stats.Preemptions++
	e.waiting = slices.Insert(e.waiting, 0, r)
}

// scheduleWaiting admits waiting requests at now within budget.
func (e *Engine) scheduleWaiting(budget int, now time.Time) {
	for len(e.waiting) > 0 && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		r := e.waiting[0]
		hit := e.kv.ComputedBlocks(r.seq)
		hitTokens := hit * e.cfg.BlockSize
		n := min(r.seq.Len()-hitTokens, budget)
		if !e.kv.AllocateSlots(r.seq, 0, hit, n) {
			return
		}
		e.waiting[0] = nil
		e.waiting = e.waiting[1:]
		e.running = append(e.running, r)
		r.status = statusRunning
		r.computed = hitTokens
		if !r.admitted {
			r.admitted = true
			r.stats.CachedTokens = hitTokens
			r.stats.Timings.Scheduled = now
			e.step.stats.PrefixCacheQueries += r.seq.Len()
			e.step.stats.PrefixCacheHits += hitTokens
		}
		e.scheduled = append(e.scheduled, scheduledRequest{r, n})
		budget -= n
	}
}

// EndStep completes the step in flight at the end BeginStep returned: every
// scheduled request whose tokens are all computed samples one token, and
// requests that reach EOS or a length limit finish and free their blocks.
// It panics if no step is in flight.
func (e *Engine) EndStep() *StepResult {
	if !e.inStep {
		panic("sim: EndStep without a step in flight")
	}
	e.inStep = false
	end := e.step.end
	res := &StepResult{Start: e.step.start, End: end, Outputs: make([]RequestOutput, 0, len(e.scheduled))}
	finished := false
	for _, s := range e.scheduled {
		r := s.r
		if r.status != statusRunning || r.computed < r.seq.Len() {
			continue // aborted, preempted, or a prefill chunk
		}
		out := e.sample(r, end)
		finished = finished || out.Finished
		res.Outputs = append(res.Outputs, out)
	}
	if finished {
		e.running = slices.DeleteFunc(e.running, func(r *request) bool { return r.status == statusFinished })
	}
	e.step.stats.Running = len(e.running)
	e.step.stats.Waiting = len(e.waiting)
	e.step.stats.KVCacheUsage = e.kv.Usage()
	res.Stats = e.step.stats
	res.Batch = e.batch(end)
	return res
}

// sample appends r's next token at time now and finishes r if it is done.
func (e *Engine) sample(r *request, now time.Time) RequestOutput {
	tok := r.nextToken()
	r.seq.Append(tok)
	r.stats.OutputTokens++
	e.step.stats.GenerationTokens++
	if r.stats.Timings.FirstToken.IsZero() {
		r.stats.Timings.FirstToken = now
		e.step.stats.PromptTokens += r.stats.PromptTokens
	}
	r.stats.Timings.LastToken = now
	out := RequestOutput{RequestID: r.id, Token: tok}
	if reason, done := r.checkStop(tok, e.cfg.MaxModelLen); done {
		out.Finished, out.FinishReason = true, reason
		r.status = statusFinished
		e.kv.Free(r.seq)
		delete(e.requests, r.id)
	}
	out.Stats = r.stats
	return out
}
