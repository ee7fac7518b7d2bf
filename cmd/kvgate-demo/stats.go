package main

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"
)

// recorder collects what the requests of one run measured. It is safe for
// concurrent use.
type recorder struct {
	start time.Time

	mu       sync.Mutex
	results  []result
	errors   int
	refused  int
	lastErr  error
	inFlight int
}

func newRecorder(start time.Time) *recorder { return &recorder{start: start} }

// begin counts a request sent; end or fail counts it done.
func (r *recorder) begin() {
	r.mu.Lock()
	r.inFlight++
	r.mu.Unlock()
}

func (r *recorder) end(res result) {
	res.answer, res.answerID = "", ""
	r.mu.Lock()
	r.inFlight--
	r.results = append(r.results, res)
	r.mu.Unlock()
}

// refuse counts a request the gateway refused (429) done.
func (r *recorder) refuse() {
	r.mu.Lock()
	r.inFlight--
	r.refused++
	r.mu.Unlock()
}

func (r *recorder) fail(err error) {
	r.mu.Lock()
	r.inFlight--
	r.errors++
	r.lastErr = err
	r.mu.Unlock()
}

// summary is a run's figures at one moment.
type summary struct {
	elapsed  time.Duration
	requests int
	errors   int
	// refused counts the requests the gateway refused with 429.
	refused  int
	lastErr  error
	inFlight int
	// promptTokens and cachedTokens sum the usage of the requests;
	// cachedOf sums the prompt tokens of those that reported their cached
	// tokens, and hit is the ratio of cachedTokens to it.
	promptTokens, cachedTokens, cachedOf int
	// ttft and e2e hold the client's times to the first token and to the
	// end.
	ttft, e2e percentiles
	// ttfts are the served requests' times to the first token, sorted.
	ttfts []time.Duration
	// timing holds the gateway's Server-Timing metrics, by name, over the
	// responses that reported them; timing["gateway"] is its own time.
	timing map[string]percentiles
	pods   []podSummary
}

// podSummary is one pod's share of a run.
type podSummary struct {
	pod                                  string
	requests                             int
	promptTokens, cachedTokens, cachedOf int
}

// hit is the share of the prompt tokens the engines found cached, NaN
// when no request reported its cached tokens.
func (s summary) hit() float64 { return ratio(s.cachedTokens, s.cachedOf) }

// withinSLO counts the requests served whose first token came within
// objective.
func (s summary) withinSLO(objective time.Duration) int {
	n := 0
	for _, d := range s.ttfts {
		if d <= objective {
			n++
		}
	}
	return n
}

// attainment is the share of the requests answered (served or refused)
// that were served within objective.
func (s summary) attainment(objective time.Duration) float64 {
	return ratio(s.withinSLO(objective), s.requests+s.refused)
}

// goodput is the requests served within objective per second.
func (s summary) goodput(objective time.Duration) float64 {
	return float64(s.withinSLO(objective)) / max(s.elapsed.Seconds(), 1e-3)
}
func (p podSummary) hit() float64    { return ratio(p.cachedTokens, p.cachedOf) }
func (s summary) perSecond() float64 { return float64(s.requests) / max(s.elapsed.Seconds(), 1e-3) }

func ratio(a, b int) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// summarize returns the run's figures now, its pods named as in pods
// (pods that served nothing included).
func (r *recorder) summarize(now time.Time, pods []string) summary {
	r.mu.Lock()
	s := summary{elapsed: now.Sub(r.start), requests: len(r.results), errors: r.errors, refused: r.refused, lastErr: r.lastErr,
		inFlight: r.inFlight}
	ttfts := make([]time.Duration, len(r.results))
	e2es := make([]time.Duration, len(r.results))
	timings := map[string][]time.Duration{}
	byPod := map[string]*podSummary{}
	for _, p := range pods {
		byPod[p] = &podSummary{pod: p}
	}
	for i, res := range r.results {
		ttfts[i], e2es[i] = res.ttft, res.e2e
		for name, d := range res.timing {
			timings[name] = append(timings[name], d)
		}
		cachedOf := res.promptTokens
		if res.cachedUnknown {
			cachedOf = 0
		}
		s.promptTokens += res.promptTokens
		s.cachedTokens += res.cachedTokens
		s.cachedOf += cachedOf
		p := byPod[res.pod]
		if p == nil {
			p = &podSummary{pod: res.pod}
			byPod[res.pod] = p
		}
		p.requests++
		p.promptTokens += res.promptTokens
		p.cachedTokens += res.cachedTokens
		p.cachedOf += cachedOf
	}
	r.mu.Unlock()
	s.ttft, s.e2e = percentilesOf(ttfts), percentilesOf(e2es)
	s.ttfts = ttfts
	s.timing = map[string]percentiles{}
	for name, ds := range timings {
		s.timing[name] = percentilesOf(ds)
	}
	for _, p := range byPod {
		s.pods = append(s.pods, *p)
	}
	slices.SortFunc(s.pods, func(a, b podSummary) int { return cmp.Compare(a.pod, b.pod) })
	return s
}

// percentiles are the 50th, 90th and 99th percentiles of durations; ok is
// false when there were none.
type percentiles struct {
	p50, p90, p99 time.Duration
	ok            bool
}

// percentilesOf sorts ds and returns its nearest-rank percentiles.
func percentilesOf(ds []time.Duration) percentiles {
	if len(ds) == 0 {
		return percentiles{}
	}
	slices.Sort(ds)
	at := func(q float64) time.Duration {
		return ds[max(int(math.Ceil(q*float64(len(ds))))-1, 0)]
	}
	return percentiles{p50: at(0.50), p90: at(0.90), p99: at(0.99), ok: true}
}
