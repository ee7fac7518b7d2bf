package routingbench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/sim"
)

// requestState is what a simulation records of one request.
type requestState struct {
	rejected bool
	finished bool
	// refused is why the gateway's queue refused the request or let it go
	// without sending it ("" when it was sent); queued reports that it
	// waited in the queue, and sent when it was sent to its engine.
	refused string
	queued  bool
	sent    time.Duration
	// lastToken is when the request's latest token came out.
	lastToken time.Duration
	// stats are the engine's statistics of the request at its first token
	// (prompt and cached tokens, timings up to the first token), updated
	// at its last.
	stats sim.RequestStats
}

// simulation plays one workload under one policy.
type simulation struct {
	cfg    Config
	w      *Workload
	name   string
	policy policy
	*fleet
	queue eventQueue
	reqs  []requestState
	byID  map[string]int
	// next is the next request to arrive; deliveries counts the event
	// batches on their way to the index.
	next, busy, deliveries int
	// nextWake is when the next look at the policy's queue is due.
	nextWake time.Duration
}

// cancelCheckEvents is how many events a simulation processes between
// looks at its context.
const cancelCheckEvents = 1 << 12

// simulate plays w under the named policy with cfg, which is defaulted and
// valid, and returns the policy's result.
func simulate(ctx context.Context, cfg Config, w *Workload, name string) (*PolicyResult, error) {
	f, err := newFleet(cfg)
	if err != nil {
		return nil, err
	}
	s := &simulation{
		cfg: cfg, w: w, name: name, fleet: f,
		reqs: make([]requestState, len(w.Requests)),
		byID: make(map[string]int, len(w.Requests)),
	}
	if s.policy, err = newPolicy(name, s); err != nil {
		return nil, err
	}
	for i, r := range w.Requests {
		s.byID[r.ID] = i
	}
	s.queue.push(event{at: w.Requests[0].Arrival, kind: evArrival})
	s.queue.push(event{at: 0, kind: evScrape})
	if r, ok := s.policy.(*replicated); ok && len(r.shared) > 0 {
		s.queue.push(event{at: 0, kind: evShare})
	}
	for n := 0; s.queue.len() > 0; n++ {
		if n%cancelCheckEvents == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("simulate %s under %s: %w", w.Name, name, ctx.Err())
		}
		ev := s.queue.pop()
		s.now = ev.at
		if err := s.handle(ev); err != nil {
			return nil, fmt.Errorf("simulate %s under %s at %v: %w", w.Name, name, s.now, err)
		}
	}
	return s.result(), nil
}

func (s *simulation) handle(ev event) error {
	switch ev.kind {
	case evArrival:
		return s.arrive(ev.req)
	case evStepEnd:
		return s.endStep(s.engines[ev.engine])
	case evDeliver:
		return s.deliver(s.engines[ev.engine], ev.payload)
	case evScrape:
		s.scrape()
		return s.policy.changed()
	case evShare:
		s.policy.(*replicated).share()
		if s.pending() {
			s.queue.push(event{at: s.now + s.cfg.ShareInterval, kind: evShare})
		}
	case evQueue:
		return s.policy.changed()
	}
	return nil
}

// arrive routes request i, sends it unless its policy holds or refuses it,
// and schedules the next arrival.
func (s *simulation) arrive(i int) error {
	if s.next = i + 1; s.next < len(s.w.Requests) {
		s.queue.push(event{at: s.w.Requests[s.next].Arrival, kind: evArrival, req: s.next})
	}
	idx, err := s.policy.route(i, &s.w.Requests[i])
	if err != nil || idx < 0 {
		return err
	}
	return s.send(i, idx)
}

// send sends request i to engine idx now.
func (s *simulation) send(i, idx int) error {
	r := &s.w.Requests[i]
	s.reqs[i].sent = s.now
	e := s.engines[idx]
	err := e.eng.Add(sim.RequestSpec{ID: r.ID, Prompt: r.Prompt, MaxTokens: r.OutputTokens}, s.clock())
	switch {
	case errors.Is(err, sim.ErrTooLong):
		s.reqs[i].rejected = true
		return s.policy.ended(i, inflight.Usage{})
	case err != nil:
		return err
	}
	e.inFlight++
	e.routed++
	e.promptTokens += int64(len(r.Prompt))
	s.kick(e)
	return nil
}

// kick starts a step on an idle engine that has work.
func (s *simulation) kick(e *engine) {
	if e.busy {
		return
	}
	end, ok := e.eng.BeginStep(s.clock())
	if !ok {
		return
	}
	e.busy, e.stepEnd = true, end.Sub(simEpoch)
	s.busy++
	s.queue.push(event{at: e.stepEnd, kind: evStepEnd, engine: e.index})
}

// endStep completes e's step: its tokens reach the gateway, its metrics
// count them, its event batch leaves for the index, and the next step
// starts.
func (s *simulation) endStep(e *engine) error {
	res := e.eng.EndStep()
	e.busy = false
	s.busy--
	e.busyTime += res.End.Sub(res.Start)
	e.prefillTokens += int64(res.Stats.PrefillTokens)
	e.preemptions += res.Stats.Preemptions
	e.counters.promptTokens += float64(res.Stats.PromptTokens)
	e.counters.prefixHits += float64(res.Stats.PrefixCacheHits)
	for _, out := range res.Outputs {
		if err := s.output(e, out); err != nil {
			return err
		}
	}
	if res.Batch != nil {
		payload, err := kvevent.EncodeEventBatch(res.Batch)
		if err != nil {
			return fmt.Errorf("encode event batch of %s: %w", e.key, err)
		}
		if at, ok := e.link.Deliver(res.End); ok {
			s.deliveries++
			s.queue.push(event{at: at.Sub(simEpoch), kind: evDeliver, engine: e.index, payload: payload})
		} else {
			e.lostBatches++
		}
	}
	s.kick(e)
	return nil
}

// output records one token of a request.
func (s *simulation) output(e *engine, out sim.RequestOutput) error {
	i, ok := s.byID[out.RequestID]
	if !ok {
		return fmt.Errorf("%s produced a token for unknown request %q", e.key, out.RequestID)
	}
	st := &s.reqs[i]
	tm := out.Stats.Timings
	if out.Stats.OutputTokens == 1 {
		st.stats = out.Stats
		e.counters.ttftSum += tm.TTFT().Seconds()
		e.counters.ttftCount++
		e.counters.prefillSum += tm.FirstToken.Sub(tm.Scheduled).Seconds()
		if err := s.policy.firstToken(i); err != nil {
			return err
		}
	} else {
		e.counters.itlSum += (s.now - st.lastToken).Seconds()
		e.counters.itlCount++
	}
	st.lastToken = s.now
	if out.Finished {
		st.finished = true
		st.stats.OutputTokens = out.Stats.OutputTokens
		st.stats.Preemptions = out.Stats.Preemptions
		st.stats.Timings.LastToken = tm.LastToken
		e.inFlight--
		return s.policy.ended(i, inflight.Usage{PromptTokens: int64(st.stats.PromptTokens), CompletionTokens: int64(st.stats.OutputTokens),
			CachedTokens: int64(st.stats.CachedTokens), CachedReported: true})
	}
	return nil
}

// refuse records that the gateway's queue refused request i, or let it go
// without sending it, for reason.
func (s *simulation) refuse(i int, reason string) { s.reqs[i].refused = reason }

// wakeAt schedules a look at the policy's queue at at, unless one is due
// by then.
func (s *simulation) wakeAt(at time.Duration) {
	if s.nextWake > s.now && s.nextWake <= at {
		return
	}
	s.nextWake = at
	s.queue.push(event{at: at, kind: evQueue})
}

// deliver decodes an event batch of e and applies it to the index.
func (s *simulation) deliver(e *engine, payload []byte) error {
	s.deliveries--
	batch, err := kvevent.DecodeEventBatch(payload)
	if err != nil {
		return fmt.Errorf("decode event batch of %s: %w", e.key, err)
	}
	if err := s.index.ApplyBatch(e.stream, batch); err != nil {
		return fmt.Errorf("apply event batch of %s: %w", e.key, err)
	}
	return nil
}

// scrape reads every engine's metrics, and schedules the next scrape while
// anything is left to happen.
func (s *simulation) scrape() {
	for _, e := range s.engines {
		e.metrics.scrape(s.now, e.eng.QueueState(), e.counters)
	}
	if s.pending() {
		s.queue.push(event{at: s.now + s.cfg.ScrapeInterval, kind: evScrape})
	}
}

// pending reports whether anything is left to happen: requests to arrive,
// engines busy, event batches on their way, requests held.
func (s *simulation) pending() bool {
	return s.next < len(s.w.Requests) || s.busy > 0 || s.deliveries > 0 || s.policy.holding()
}
