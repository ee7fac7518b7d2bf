package routing

import (
	"math"
	"slices"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/types"
)

// scratch is the per-decision working memory, pooled so that decisions do
// not allocate once it has grown.
type scratch struct {
	match  indexer.MatchResult
	keys   []string
	speeds []float64
	scores []float64
	models []string
	bytes  []byte
}

// Candidate.measured bits: which of the pod's metrics had a value.
const (
	hasKVCache uint8 = 1 << iota
	hasTTFT
)

// gather resets d for the request and fills its candidates, one per
// snapshot, with the inputs nd names.
func (r *Router) gather(rc *types.RoutingContext, pods []cache.PodSnapshot, nd needs, d *Decision, s *scratch) input {
	d.reset()
	d.PromptTokens = rc.InputTokens()
	in := input{
		d:            d,
		s:            s,
		rng:          r.rng,
		hasTokens:    len(rc.PromptTokenIDs) > 0,
		meanUncached: math.Float64frombits(r.meanUncached.Load()),
		outputTokens: rc.PredictedOutputTokens,
		model:        rc.Model,
		slo:          rc.SLO,
		sloContended: rc.SLOContended,
	}
	now := r.cfg.Now()
	if !rc.ReceivedAt.IsZero() {
		in.elapsed = max(now.Sub(rc.ReceivedAt).Seconds(), 0)
	}
	var fresh, unfresh bool
	for i := range pods {
		sp := &pods[i]
		c := Candidate{Pod: sp.Endpoint.ID, ep: sp.Endpoint, load: sp.Load}
		if nd != 0 {
			c.Scrape = sp.Scrape
			fresh, unfresh = fresh || c.Scrape == cache.ScrapeFresh, unfresh || c.Scrape != cache.ScrapeFresh
		}
		scrapedAt := readMetrics(&c, sp, nd)
		if nd&needQueue != 0 {
			q := c.load.Queue(now, scrapedAt, c.Waiting)
			c.InFlightPrefills, c.InFlightPrefillTokens, c.QueueSeconds = q.Prefills, q.Tokens, q.Seconds
			c.WaitingEnded = q.WaitingEnded
		}
		d.Candidates = append(d.Candidates, c)
	}
	in.freshOnly = fresh && unfresh
	r.fillSpeeds(in, d.Candidates, s)
	if nd&needMatch != 0 && in.hasTokens && r.cfg.Index != nil {
		r.match(rc, d, d.Candidates, s)
		in.matched = true
		if d.BlockSize > 0 {
			d.promptBlocks = r.inFlight.keys(d.promptBlocks[:0], &s.bytes, baseModel(d.Candidates[0].ep, rc.Model),
				rc.LoraAdapter, rc.PromptTokenIDs, d.BlockSize)
			r.inFlight.match(d.Candidates, d.promptBlocks)
			for i := range d.Candidates {
				c := &d.Candidates[i]
				c.InFlightMatchedTokens = c.InFlightMatchedBlocks * d.BlockSize
			}
		}
	}
	for i := range d.Candidates {
		d.Candidates[i].setUncached(d.PromptTokens, r.cfg.CPUCacheWeight)
	}
	return in
}

// readMetrics reads the pod metrics nd names from sp into c, and returns
// when the waiting requests were scraped (zero when they were not read or
// have no value); a metric without a value, or whose value is not a finite
// number, reads as 0.
func readMetrics(c *Candidate, sp *cache.PodSnapshot, nd needs) (waitingAt time.Time) {
	m := &sp.Metrics
	read := func(v float64, b cache.MetricBits) (float64, bool) {
		if m.Measured&b == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, false
		}
		return v, true
	}
	c.PrefillTokensPerSecond, _ = read(m.PrefillTokensPerSecond, cache.HasPrefillSpeed)
	if nd&needRunning != 0 {
		c.Running = float64(sp.Load.Running())
	}
	if nd&needQueue != 0 {
		var ok bool
		if c.Waiting, ok = read(m.Waiting, cache.HasWaiting); ok {
			waitingAt = m.At
		}
	}
	if nd&(needQueue|needLatency) != 0 {
		c.AvgTPOTSeconds, _ = read(m.AvgTPOTSeconds, cache.HasAvgTPOT)
	}
	if nd&needLatency != 0 {
		var ok bool
		if c.AvgTTFTSeconds, ok = read(m.AvgTTFTSeconds, cache.HasAvgTTFT); ok {
			c.measured |= hasTTFT
		}
	}
	if nd&needKVCache != 0 {
		var ok bool
		if c.KVCacheUsage, ok = read(m.KVCacheUsage, cache.HasKVCacheUsage); ok {
			c.measured |= hasKVCache
		}
	}
	return waitingAt
}

// fillSpeeds gives every candidate without a measured prefill speed the
// median of the measured ones, or the configured default when none is.
// While some candidates' metrics are current and others' are not, the
// median is of the current ones: a pod whose scrapes fail keeps its last
// speed, which says nothing of the others.
func (r *Router) fillSpeeds(in input, cs []Candidate, s *scratch) {
	s.speeds = s.speeds[:0]
	for i := range cs {
		if cs[i].PrefillTokensPerSecond > 0 {
			cs[i].SpeedSource = SpeedMeasured
			if in.considers(&cs[i]) {
				s.speeds = append(s.speeds, cs[i].PrefillTokensPerSecond)
			}
		}
	}
	fallback, source := r.cfg.DefaultPrefillTokensPerSecond, SpeedDefault
	if len(s.speeds) > 0 {
		fallback, source = median(s.speeds), SpeedModelMedian
	}
	for i := range cs {
		if cs[i].SpeedSource == "" {
			cs[i].PrefillTokensPerSecond, cs[i].SpeedSource = fallback, source
		}
	}
}

// median returns the median of v, reordering it.
func median(v []float64) float64 {
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// match queries the index for the candidates cs (all of d's, or the chosen
// one) under each one's base model. Candidates normally share one base
// model and need one query; candidates of another base model than a query's
// hold none of its keys, so each candidate keeps its best result.
func (r *Router) match(rc *types.RoutingContext, d *Decision, cs []Candidate, s *scratch) {
	s.keys, s.models = s.keys[:0], s.models[:0]
	for i := range cs {
		s.keys = append(s.keys, cs[i].Pod)
		if m := baseModel(cs[i].ep, rc.Model); !slices.Contains(s.models, m) {
			s.models = append(s.models, m)
		}
	}
	for _, model := range s.models {
		r.cfg.Index.MatchPrefix(model, rc.LoraAdapter, rc.PromptTokenIDs, s.keys, &s.match)
		if s.match.BlockSize > 0 {
			d.BlockSize, d.PromptBlocks = s.match.BlockSize, s.match.PromptBlocks
		}
		for i, pm := range s.match.Pods {
			c := &cs[i]
			if pm.Tokens > c.MatchedTokens || (pm.Tokens == c.MatchedTokens && pm.GPUTokens > c.MatchedGPUTokens) {
				c.MatchedBlocks, c.MatchedGPUBlocks = pm.Blocks, pm.GPUBlocks
				c.MatchedTokens, c.MatchedGPUTokens = pm.Tokens, pm.GPUTokens
				c.rank, c.otherRankBlocks = pm.Rank, pm.OtherRankBlocks
			}
		}
	}
}

// baseModel is the model the index knows the pod's blocks under: the pod's
// base model label, else the requested model.
func baseModel(ep *endpoint.Endpoint, requested string) string {
	if ep.Model != "" {
		return ep.Model
	}
	return requested
}

// setUncached sets the prefill work of a prompt of promptTokens on the pod:
// the tokens past the cached prefix, plus the share cpuWeight leaves of the
// tokens cached only outside GPU memory. The cached prefix is the longer of
// the index's match and the in-flight one, which is in GPU memory.
func (c *Candidate) setUncached(promptTokens int, cpuWeight float64) {
	matched, gpu := max(c.MatchedTokens, c.InFlightMatchedTokens), max(c.MatchedGPUTokens, c.InFlightMatchedTokens)
	offGPU := float64(matched - gpu)
	u := float64(promptTokens-matched) + (1-cpuWeight)*offGPU
	c.uncached = max(u, 0)
	c.UncachedTokens = int(math.Round(c.uncached))
}
