package routingbench

import (
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/sim"
)

// counters are the cumulative vLLM metrics of one engine that the Store
// turns into recent means and rates.
type counters struct {
	promptTokens float64 // vllm:prompt_tokens_total
	prefixHits   float64 // vllm:prefix_cache_hits_total
	ttftSum      float64 // vllm:time_to_first_token_seconds
	ttftCount    float64
	itlSum       float64 // vllm:inter_token_latency_seconds
	itlCount     float64
	prefillSum   float64 // vllm:request_prefill_time_seconds, as many as ttftCount
}

func (c counters) sub(b counters) counters {
	return counters{
		promptTokens: c.promptTokens - b.promptTokens, prefixHits: c.prefixHits - b.prefixHits,
		ttftSum: c.ttftSum - b.ttftSum, ttftCount: c.ttftCount - b.ttftCount,
		itlSum: c.itlSum - b.itlSum, itlCount: c.itlCount - b.itlCount,
		prefillSum: c.prefillSum - b.prefillSum,
	}
}

// The recent means and rates the Store derives, by slot.
const (
	slotTTFT = iota
	slotTPOT
	slotPrefillSpeed
	numSlots
)

type counterSample struct {
	at time.Duration
	c  counters
}

// counterWindow turns successive scrapes of counters into deltas over
// about the last length of time, as the Store's window does: it keeps
// samples spaced length/windowSteps apart, the oldest being the newest one
// at least length old.
type counterWindow struct {
	length  time.Duration
	samples []counterSample
}

// windowSteps is how many samples a window keeps per window length, as the
// Store does.
const windowSteps = 8

// observe records the counters c read at now and returns their delta from
// the window's baseline; false on the first scrape.
func (w *counterWindow) observe(now time.Duration, c counters) (counters, bool) {
	if len(w.samples) == 0 {
		w.samples = append(w.samples, counterSample{now, c})
		return counters{}, false
	}
	d := c.sub(w.samples[0].c)
	if now-w.samples[len(w.samples)-1].at >= w.length/windowSteps {
		w.samples = append(w.samples, counterSample{now, c})
	}
	drop := 0
	for len(w.samples)-drop > 1 && now-w.samples[drop+1].at >= w.length {
		drop++
	}
	w.samples = append(w.samples[:0], w.samples[drop:]...)
	return d, true
}

// scraped is what the Store knows of one engine from its scrapes, derived
// as cache.Store derives it from vLLM's /metrics: gauges as of the last
// scrape, means over a window of about MetricsWindow and the prefill speed
// over one of about PrefillSpeedWindow, each window sliding by an eighth of
// its length, each value kept through windows that measure none (the prefill
// speed for one more window at most) and the lifetime value standing in
// before the first.
type scraped struct {
	ok                       bool
	at                       time.Duration // of the last scrape
	waiting, running, kvUsed float64
	window, prefillWindow    counterWindow
	recent                   [numSlots]float64
	hasRecent                [numSlots]bool
	prefillAt                time.Duration // of the last prefill-speed measure
	lifetime                 counters
}

// scrape records an engine's gauges q and counters c, read at now.
func (s *scraped) scrape(now time.Duration, q sim.QueueState, c counters) {
	s.ok, s.at = true, now
	s.waiting, s.running, s.kvUsed = float64(q.Waiting), float64(q.Running), q.KVCacheUsage
	s.lifetime = c
	if d, ok := s.window.observe(now, c); ok {
		s.observe(slotTTFT, d.ttftSum, d.ttftCount)
		s.observe(slotTPOT, d.itlSum, d.itlCount)
	}
	d, ok := s.prefillWindow.observe(now, c)
	if !ok {
		return
	}
	step, _ := s.value(cache.AvgTPOTSeconds)
	if d.itlSum > 0 && d.itlCount > 0 {
		step = d.itlSum / d.itlCount
	}
	if v, ok := d.prefillSample(step).TokensPerSecond(); ok {
		s.recent[slotPrefillSpeed], s.hasRecent[slotPrefillSpeed] = v, true
		s.prefillAt = now
	}
}

// prefillSample is what c tells of the engine's prefills, with step the
// engine's mean inter-token latency.
func (c counters) prefillSample(step float64) cache.PrefillSample {
	return cache.PrefillSample{
		ComputedTokens: c.promptTokens - c.prefixHits,
		Prefills:       c.ttftCount,
		PrefillSeconds: c.prefillSum,
		StepSeconds:    step,
	}
}

// observe keeps the window's ratio num/den of slot when the window saw
// observations.
func (s *scraped) observe(slot int, num, den float64) {
	if num > 0 && den > 0 {
		s.recent[slot], s.hasRecent[slot] = num/den, true
	}
}

// ratio returns slot's recent value, else its lifetime ratio num/den.
func (s *scraped) ratio(slot int, num, den float64) (float64, bool) {
	if s.hasRecent[slot] {
		return s.recent[slot], true
	}
	return num / den, num > 0 && den > 0
}

// value returns the scraped metric of the given name (a cache constant).
func (s *scraped) value(metric string) (float64, bool) {
	if !s.ok {
		return 0, false
	}
	l := s.lifetime
	switch metric {
	case cache.NumRequestsWaiting:
		return s.waiting, true
	case cache.NumRequestsRunning:
		return s.running, true
	case cache.KVCacheUsagePerc:
		return s.kvUsed, true
	case cache.AvgTTFTSeconds:
		return s.ratio(slotTTFT, l.ttftSum, l.ttftCount)
	case cache.AvgTPOTSeconds:
		return s.ratio(slotTPOT, l.itlSum, l.itlCount)
	case cache.PrefillTokensPerSecond:
		if s.hasRecent[slotPrefillSpeed] {
			return s.recent[slotPrefillSpeed], s.at-s.prefillAt <= s.prefillWindow.length
		}
		step, _ := s.value(cache.AvgTPOTSeconds)
		return l.prefillSample(step).TokensPerSecond()
	}
	return 0, false
}

// storeView serves the routing algorithms what the gateway's cache.Store
// would know of the engines: the scraped metrics, and the requests the
// gateway has sent to each engine and not seen complete, which the request
// ledger counts on the engine's load record at once.
type storeView struct {
	f *fleet
	// loads are the gateway's load records of the engines, in order; nil
	// for the engines' own.
	loads []*inflight.PodLoad
}

// builtins are the Store's built-in metrics routing reads, and where they
// go in a snapshot.
var builtins = []struct {
	name string
	bit  cache.MetricBits
	dst  func(*cache.PodMetrics) *float64
}{
	{cache.NumRequestsWaiting, cache.HasWaiting, func(m *cache.PodMetrics) *float64 { return &m.Waiting }},
	{cache.KVCacheUsagePerc, cache.HasKVCacheUsage, func(m *cache.PodMetrics) *float64 { return &m.KVCacheUsage }},
	{cache.AvgTTFTSeconds, cache.HasAvgTTFT, func(m *cache.PodMetrics) *float64 { return &m.AvgTTFTSeconds }},
	{cache.AvgTPOTSeconds, cache.HasAvgTPOT, func(m *cache.PodMetrics) *float64 { return &m.AvgTPOTSeconds }},
	{cache.PrefillTokensPerSecond, cache.HasPrefillSpeed, func(m *cache.PodMetrics) *float64 { return &m.PrefillTokensPerSecond }},
}

// snapshots appends the snapshot of every engine, in order, to out, as
// cache.Store.Snapshots would give them; the engines' metrics carry no
// scrape state, so that all of them count as current.
func (v storeView) snapshots(out []cache.PodSnapshot) []cache.PodSnapshot {
	for _, e := range v.f.engines {
		var m cache.PodMetrics
		if e.metrics.ok {
			m.At = simEpoch.Add(e.metrics.at)
		}
		for _, b := range builtins {
			if val, ok := e.metrics.value(b.name); ok {
				*b.dst(&m) = val
				m.Measured |= b.bit
			}
		}
		load := e.load
		if v.loads != nil {
			load = v.loads[e.index]
		}
		out = append(out, cache.PodSnapshot{Endpoint: e.pod, Metrics: m, Load: load})
	}
	return out
}
