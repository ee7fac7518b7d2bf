package routingbench

import (
	"math"
	"slices"
	"time"

	"github.com/kvgate/kvgate/pkg/slo"
)

// Latency summarises a distribution of durations, in seconds.
type Latency struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// EngineResult is what one engine did under a policy.
type EngineResult struct {
	// Requests counts the requests routed to the engine.
	Requests int `json:"requests"`
	// PromptTokens counts their prompt tokens, PrefillTokens the tokens
	// the engine computed for prompts (the uncached ones, and recomputation
	// after preemption).
	PromptTokens  int64 `json:"promptTokens"`
	PrefillTokens int64 `json:"prefillTokens"`
	// Utilization is the share of the run the engine spent in steps.
	Utilization float64 `json:"utilization"`
	// Speed is the engine's speed relative to the configured model's.
	Speed float64 `json:"speed"`
	// Preemptions counts the requests the engine preempted for KV space.
	Preemptions int `json:"preemptions"`
	// LostEventBatches counts the engine's KV event batches that never
	// reached the index.
	LostEventBatches int `json:"lostEventBatches"`
}

// PolicyResult is what one policy achieved on a workload.
type PolicyResult struct {
	Policy string `json:"policy"`
	// Requests counts the workload's requests; Completed those that
	// finished, Rejected those the engine refused as too long.
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Rejected  int `json:"rejected"`
	// PromptTokens and CachedTokens sum, over the requests that got a
	// first token, the prompt tokens and the prompt tokens the engine took
	// from its prefix cache, as the engine reports them; HitRatio is
	// CachedTokens / PromptTokens.
	PromptTokens int64   `json:"promptTokens"`
	CachedTokens int64   `json:"cachedTokens"`
	HitRatio     float64 `json:"hitRatio"`
	// HitRatioOfBound is HitRatio over the pooled bound's (Report.Bound).
	HitRatioOfBound float64 `json:"hitRatioOfBound"`
	// TTFT is the time from arrival to first token; Queue the time from
	// arrival to the engine's first scheduling of the request; E2E the time
	// from arrival to the last token.
	TTFT  Latency `json:"ttftSeconds"`
	Queue Latency `json:"queueSeconds"`
	E2E   Latency `json:"e2eSeconds"`
	// Makespan runs from the first arrival to the last token.
	// RequestsPerSecond and OutputTokensPerSecond are the completed
	// requests and their output tokens over the makespan.
	Makespan              float64 `json:"makespanSeconds"`
	RequestsPerSecond     float64 `json:"requestsPerSecond"`
	OutputTokensPerSecond float64 `json:"outputTokensPerSecond"`
	// RequestsCV and PrefillCV measure load imbalance: the coefficient of
	// variation (standard deviation over mean) across engines of the
	// requests routed to each and of the prefill tokens each computed. 0 is
	// perfect balance.
	RequestsCV float64 `json:"requestsCV"`
	PrefillCV  float64 `json:"prefillCV"`
	// RequestsSpread is the largest relative deviation of an engine's
	// requests from the mean of the engines of its speed: 0.25 means some
	// engine got 25% more or fewer requests than its identical peers.
	RequestsSpread float64 `json:"requestsSpread"`
	// PredictedHitsFound is the share of the prompt tokens routing
	// predicted cached on the chosen engines that the engines found cached
	// when the prefill started (the rest were evicted while the request
	// waited, or the index was wrong); 0 for a policy that predicts none
	// (the oracle reads the engines themselves).
	PredictedHitsFound float64 `json:"predictedHitsFound"`
	// Preemptions counts the requests engines preempted for KV space.
	Preemptions int            `json:"preemptions"`
	Engines     []EngineResult `json:"engines"`

	// The SLO-aware policies' queue: Queued counts the requests that
	// waited in it, Refused those it refused on arrival (full, or no
	// engine could meet the SLO), Expired those that left it unsent once
	// they could no longer meet their SLO or had waited the longest
	// allowed. Wait is how long the requests sent after waiting waited.
	Queued  int     `json:"queued"`
	Refused int     `json:"refused"`
	Expired int     `json:"expired"`
	Wait    Latency `json:"waitSeconds"`
	// SLOMet counts the requests served within Config.SLO; SLOAttainment
	// is their share of all requests and Goodput their number per second
	// of the workload's duration (first to last arrival). All three are 0
	// without an SLO.
	SLOMet        int     `json:"sloMet"`
	SLOAttainment float64 `json:"sloAttainment"`
	Goodput       float64 `json:"goodput"`
}

// result summarises the simulation once it has run.
func (s *simulation) result() *PolicyResult {
	r := &PolicyResult{Policy: s.name, Requests: len(s.reqs)}
	var ttft, queue, e2e, wait []float64
	var outputTokens int64
	end := time.Duration(0)
	for i := range s.reqs {
		st := &s.reqs[i]
		arrival := simEpoch.Add(s.w.Requests[i].Arrival)
		if st.queued {
			r.Queued++
		}
		switch {
		case st.refused == slo.ReasonExpired || st.refused == slo.ReasonModelGone || st.refused == slo.ReasonStopped:
			r.Expired++
			continue
		case st.refused != "":
			r.Refused++
			continue
		case st.rejected:
			r.Rejected++
			continue
		case st.stats.OutputTokens == 0:
			continue
		}
		if st.queued {
			wait = append(wait, (st.sent - s.w.Requests[i].Arrival).Seconds())
		}
		if s.metSLO(i) {
			r.SLOMet++
		}
		tm := st.stats.Timings
		r.PromptTokens += int64(st.stats.PromptTokens)
		r.CachedTokens += int64(st.stats.CachedTokens)
		ttft = append(ttft, tm.FirstToken.Sub(arrival).Seconds())
		queue = append(queue, tm.Scheduled.Sub(arrival).Seconds())
		if st.finished {
			r.Completed++
			outputTokens += int64(st.stats.OutputTokens)
			e2e = append(e2e, tm.LastToken.Sub(arrival).Seconds())
			end = max(end, tm.LastToken.Sub(simEpoch))
		}
	}
	if r.PromptTokens > 0 {
		r.HitRatio = float64(r.CachedTokens) / float64(r.PromptTokens)
	}
	r.TTFT, r.Queue, r.E2E, r.Wait = summarize(ttft), summarize(queue), summarize(e2e), summarize(wait)
	if !s.cfg.SLO.IsZero() {
		r.SLOAttainment = float64(r.SLOMet) / float64(r.Requests)
		span := s.w.Requests[len(s.w.Requests)-1].Arrival - s.w.Requests[0].Arrival
		if span <= 0 {
			span = end - s.w.Requests[0].Arrival
		}
		if span > 0 {
			r.Goodput = float64(r.SLOMet) / span.Seconds()
		}
	}
	if span := end - s.w.Requests[0].Arrival; span > 0 {
		r.Makespan = span.Seconds()
		r.RequestsPerSecond = float64(r.Completed) / r.Makespan
		r.OutputTokensPerSecond = float64(outputTokens) / r.Makespan
	}
	var routed, prefilled []float64
	for _, e := range s.engines {
		er := EngineResult{Requests: e.routed, PromptTokens: e.promptTokens, PrefillTokens: e.prefillTokens,
			Speed: e.speed, Preemptions: e.preemptions, LostEventBatches: e.lostBatches}
		if r.Makespan > 0 {
			er.Utilization = e.busyTime.Seconds() / r.Makespan
		}
		r.Engines = append(r.Engines, er)
		r.Preemptions += e.preemptions
		routed = append(routed, float64(e.routed))
		prefilled = append(prefilled, float64(e.prefillTokens))
	}
	if s.cachedPredicted > 0 {
		r.PredictedHitsFound = s.cachedFound / s.cachedPredicted
	}
	r.RequestsCV, r.PrefillCV = variation(routed), variation(prefilled)
	r.RequestsSpread = spreadWithinSpeeds(r.Engines)
	return r
}

// spreadWithinSpeeds returns the largest relative deviation of an engine's
// requests from the mean requests of the engines of its speed, 0 when every
// such mean is 0.
func spreadWithinSpeeds(engines []EngineResult) float64 {
	sum := map[float64][2]int{} // speed -> requests, engines
	for _, e := range engines {
		v := sum[e.Speed]
		sum[e.Speed] = [2]int{v[0] + e.Requests, v[1] + 1}
	}
	spread := 0.0
	for _, e := range engines {
		v := sum[e.Speed]
		if mean := float64(v[0]) / float64(v[1]); mean > 0 {
			spread = max(spread, math.Abs(float64(e.Requests)-mean)/mean)
		}
	}
	return spread
}

// metSLO reports whether request i, which got a first token, was served
// within the configured SLO: its first token in time, its last in time, and
// its mean time per output token within the target, for each target set.
func (s *simulation) metSLO(i int) bool {
	o := s.cfg.SLO
	if o.IsZero() {
		return false
	}
	st, r := &s.reqs[i], &s.w.Requests[i]
	tm := st.stats.Timings
	arrival := simEpoch.Add(r.Arrival)
	if t := o.TTFTFor(len(r.Prompt)); t > 0 && tm.FirstToken.Sub(arrival) > t {
		return false
	}
	if o.E2E > 0 && (!st.finished || tm.LastToken.Sub(arrival) > o.E2E) {
		return false
	}
	if o.TPOT > 0 {
		if !st.finished {
			return false
		}
		if n := st.stats.OutputTokens - 1; n > 0 && tm.LastToken.Sub(tm.FirstToken)/time.Duration(n) > o.TPOT {
			return false
		}
	}
	return true
}

// summarize returns the mean and nearest-rank percentiles of v, which it
// sorts; zero for no values.
func summarize(v []float64) Latency {
	if len(v) == 0 {
		return Latency{}
	}
	slices.Sort(v)
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return Latency{
		Mean: sum / float64(len(v)),
		P50:  percentile(v, 0.50),
		P90:  percentile(v, 0.90),
		P99:  percentile(v, 0.99),
		Max:  v[len(v)-1],
	}
}

// percentile returns the nearest-rank p-quantile of sorted v.
func percentile(sorted []float64, p float64) float64 {
	rank := int(math.Ceil(p * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// variation returns the coefficient of variation of v (population
// standard deviation over mean), 0 when the mean is 0.
func variation(v []float64) float64 {
	var sum, sumSq float64
	for _, x := range v {
		sum += x
		sumSq += x * x
	}
	n := float64(len(v))
	mean := sum / n
	if mean == 0 {
		return 0
	}
	return math.Sqrt(max(sumSq/n-mean*mean, 0)) / mean
}
