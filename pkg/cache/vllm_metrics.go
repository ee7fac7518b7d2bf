package cache

import (
	"math"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// Metric families of vLLM's /metrics that the Store reads.
const (
	vllmRunning          = "vllm:num_requests_running"
	vllmWaiting          = "vllm:num_requests_waiting"
	vllmKVCacheUsage     = "vllm:kv_cache_usage_perc"
	vllmGPUCacheUsage    = "vllm:gpu_cache_usage_perc"
	vllmCPUCacheUsage    = "vllm:cpu_cache_usage_perc"
	vllmPrefixHits       = "vllm:prefix_cache_hits_total"
	vllmPrefixQueries    = "vllm:prefix_cache_queries_total"
	vllmPromptTokens     = "vllm:prompt_tokens_total"
	vllmTTFT             = "vllm:time_to_first_token_seconds"
	vllmInterTokenLat    = "vllm:inter_token_latency_seconds"
	vllmTimePerOutputTok = "vllm:time_per_output_token_seconds"
	vllmE2ELatency       = "vllm:e2e_request_latency_seconds"
	vllmPrefillTime      = "vllm:request_prefill_time_seconds"
	vllmCacheConfigInfo  = "vllm:cache_config_info"

	// modelNameLabel is the label vLLM puts the served model name in.
	modelNameLabel = "model_name"
	// engineLabel is the label vLLM puts the index of an engine core in:
	// with data parallelism behind one API server, the core's rank.
	engineLabel = "engine"
)

// usageTiers lists the KV-cache usage gauges in order of preference.
var usageTiers = [...]string{vllmKVCacheUsage, vllmGPUCacheUsage, vllmCPUCacheUsage}

// acc accumulates the samples of one metric over several series.
type acc struct {
	sum float64
	n   int
}

func (a *acc) add(v float64) { a.sum += v; a.n++ }

// groupAcc gathers one scrape's samples of a pod (or of one model_name on
// the pod).
type groupAcc struct {
	running, waiting acc
	usage            [len(usageTiers)]acc
	blockSize        acc
	numBlocks        acc
	c                counters
	raw              map[string]*rawAcc
}

// rawAcc gathers a subscribed metric family.
type rawAcc struct {
	value acc
	hist  *HistogramValue
}

// Derived values that carry over between scrapes, see groupState.ratio.
const (
	slotTTFT = iota
	slotTPOT
	slotE2E
	slotPrefill
	numSlots
)

// groupState is what a pod (or model on a pod) remembers between scrapes:
// the counters of its recent window and of its prefill-speed window.
type groupState struct {
	window, prefill recentWindow
	last            [numSlots]float64
	hasLast         [numSlots]bool
	// prefillAt is when the prefill speed was last measured; the estimate
	// is dropped once prefillKeep has passed since.
	prefillAt   time.Time
	prefillKeep time.Duration
}

// projector turns successive scrapes of one pod into podMetrics. It is owned
// by the pod's scrape loop and not safe for concurrent use.
type projector struct {
	window, prefillWindow time.Duration
	// prefillKeep is how long a prefill speed outlives the last window that
	// measured one: prefillWindow, as newProjector sets it.
	prefillKeep time.Duration
	groups      map[string]*groupState // "" is the pod as a whole
}

// newProjector returns a projector deriving recent means and rates over
// window, and the prefill speed over prefillWindow.
func newProjector(window, prefillWindow time.Duration) *projector {
	return &projector{window: window, prefillWindow: prefillWindow, prefillKeep: prefillWindow,
		groups: map[string]*groupState{}}
}

// droppedSeries counts the series of one scrape left out of a breakdown.
type droppedSeries struct {
	// unserved counts the series whose model_name the pod does not
	// serve; example is the first such model_name.
	unserved int
	example  string
	// notRank counts the series of running and waiting requests whose
	// engine label is not a rank rankLoads keeps.
	notRank int
}

// project derives the pod's metrics from one scrape taken at now. subscribed
// names extra families to keep as they are. Series are broken down by their
// model_name among served, the models the pod serves, only: the others count
// for the pod as a whole, and project returns how many there were, so that
// an engine cannot make the Store keep state for models it makes up. The
// running and waiting requests are also broken down by data-parallel rank
// (see rankLoads), whose dropped series project counts as well.
func (p *projector) project(now time.Time, families map[string]*dto.MetricFamily, subscribed map[string]struct{},
	served []string) (*podMetrics, droppedSeries) {
	pod := &groupAcc{}
	models := map[string]*groupAcc{}
	keep := make(map[string]bool, len(served))
	for _, name := range served {
		keep[name] = true
	}
	var dropped droppedSeries
	var firstModel string
	split := false
	visit := func(family string, fn func(a *groupAcc, m *dto.Metric)) {
		mf := families[family]
		if mf == nil {
			return
		}
		for _, m := range mf.Metric {
			fn(pod, m)
			name := labelValue(m, modelNameLabel)
			if name == "" {
				continue
			}
			if firstModel == "" {
				firstModel = name
			} else if name != firstModel {
				split = true
			}
			if !keep[name] {
				if dropped.unserved == 0 {
					dropped.example = name
				}
				dropped.unserved++
				continue
			}
			a := models[name]
			if a == nil {
				a = &groupAcc{}
				models[name] = a
			}
			fn(a, m)
		}
	}
	gather(families, visit)
	for name := range subscribed {
		visit(name, func(a *groupAcc, m *dto.Metric) { a.addRaw(name, m) })
	}

	out := &podMetrics{pod: p.finish("", pod, now), models: make(map[string]map[string]MetricValue, len(models)),
		split: split}
	out.builtin = podMetricsOf(out.pod, now)
	out.builtin.Ranks, dropped.notRank = rankLoads(families)
	for name, a := range models {
		mv := p.finish(name, a, now)
		// vLLM labels its cache config by engine, not by model: it
		// describes the cache every model of the pod shares.
		for _, k := range [...]string{CacheBlockSize, CacheNumGPUBlocks} {
			if v, ok := out.pod[k]; ok {
				if _, has := mv[k]; !has {
					mv[k] = v
				}
			}
		}
		out.models[name] = mv
	}
	for name := range p.groups {
		if _, seen := models[name]; !seen && name != "" {
			delete(p.groups, name)
		}
	}
	return out, dropped
}

// rankLoads returns the running and waiting requests of each data-parallel
// rank the series of vllm:num_requests_running and vllm:num_requests_waiting
// name in their engine label, indexed by rank, when they name more than one
// (see PodMetrics.Ranks); nil otherwise, which costs no allocation. Only a
// label of decimal digits below endpoint.MaxDPSize is a rank: rankLoads
// also returns how many series had an engine label of another value.
// Samples that are not finite numbers are left out.
func rankLoads(families map[string]*dto.MetricFamily) ([]RankLoad, int) {
	var seen [endpoint.MaxDPSize / 64]uint64
	distinct, top, notRank := 0, -1, 0
	for _, family := range [...]string{vllmRunning, vllmWaiting} {
		for _, m := range families[family].GetMetric() {
			r, labelled := engineRank(m)
			switch {
			case r >= 0:
				if seen[r/64]&(1<<(r%64)) == 0 {
					seen[r/64] |= 1 << (r % 64)
					distinct++
				}
				top = max(top, r)
			case labelled:
				notRank++
			}
		}
	}
	if distinct < 2 {
		return nil, notRank
	}
	out := make([]RankLoad, top+1)
	for i, family := range [...]string{vllmRunning, vllmWaiting} {
		for _, m := range families[family].GetMetric() {
			r, _ := engineRank(m)
			v := sampleValue(m)
			if r < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			if i == 0 {
				out[r].Running += v
			} else {
				out[r].Waiting += v
			}
		}
	}
	return out, notRank
}

// engineRank returns the data-parallel rank m's engine label names, -1 for
// none, and whether m has an engine label at all.
func engineRank(m *dto.Metric) (int, bool) {
	for _, l := range m.Label {
		if l.GetName() != engineLabel {
			continue
		}
		v := l.GetValue()
		if v == "" {
			return -1, true
		}
		r := 0
		for i := 0; i < len(v); i++ {
			if v[i] < '0' || v[i] > '9' {
				return -1, true
			}
			if r = r*10 + int(v[i]-'0'); r >= endpoint.MaxDPSize {
				return -1, true
			}
		}
		return r, true
	}
	return -1, false
}

// gather feeds every built-in family to visit.
func gather(families map[string]*dto.MetricFamily, visit func(string, func(*groupAcc, *dto.Metric))) {
	visit(vllmRunning, func(a *groupAcc, m *dto.Metric) { a.running.add(sampleValue(m)) })
	visit(vllmWaiting, func(a *groupAcc, m *dto.Metric) { a.waiting.add(sampleValue(m)) })
	for i, tier := range usageTiers {
		visit(tier, func(a *groupAcc, m *dto.Metric) { a.usage[i].add(sampleValue(m)) })
	}
	visit(vllmCacheConfigInfo, func(a *groupAcc, m *dto.Metric) {
		if v, err := strconv.ParseFloat(labelValue(m, "block_size"), 64); err == nil {
			a.blockSize.add(v)
		}
		if v, err := strconv.ParseFloat(labelValue(m, "num_gpu_blocks"), 64); err == nil {
			a.numBlocks.add(v)
		}
	})
	addCounter := func(family string, k counter) {
		visit(family, func(a *groupAcc, m *dto.Metric) { a.c.add(k, sampleValue(m)) })
	}
	addCounter(vllmPromptTokens, cPromptTokens)
	addCounter(vllmPrefixHits, cPrefixHits)
	addCounter(vllmPrefixQueries, cPrefixQueries)
	addHistogram := func(family string, sum, count counter) {
		visit(family, func(a *groupAcc, m *dto.Metric) {
			if h := m.GetHistogram(); h != nil {
				a.c.add(sum, h.GetSampleSum())
				a.c.add(count, float64(h.GetSampleCount()))
			}
		})
	}
	addHistogram(vllmTTFT, cTTFTSum, cTTFTCount)
	if families[vllmInterTokenLat] != nil {
		addHistogram(vllmInterTokenLat, cTPOTSum, cTPOTCount)
	} else {
		addHistogram(vllmTimePerOutputTok, cTPOTSum, cTPOTCount)
	}
	addHistogram(vllmE2ELatency, cE2ESum, cE2ECount)
	addHistogram(vllmPrefillTime, cPrefillSum, cPrefillCount)
}

// finish turns one group's samples into metric values, updating the group's
// memory.
func (p *projector) finish(group string, a *groupAcc, now time.Time) map[string]MetricValue {
	g := p.groups[group]
	if g == nil {
		g = &groupState{window: recentWindow{length: p.window}, prefill: recentWindow{length: p.prefillWindow},
			prefillKeep: p.prefillKeep}
		p.groups[group] = g
	}
	out := make(map[string]MetricValue, 12+len(a.raw))
	set := func(name string, v float64) { out[name] = MetricValue{Value: v, UpdatedAt: now} }
	if a.running.n > 0 {
		set(NumRequestsRunning, a.running.sum)
	}
	if a.waiting.n > 0 {
		set(NumRequestsWaiting, a.waiting.sum)
	}
	for _, u := range a.usage {
		if u.n > 0 {
			set(KVCacheUsagePerc, u.sum/float64(u.n))
			break
		}
	}
	if a.blockSize.n > 0 {
		set(CacheBlockSize, a.blockSize.sum/float64(a.blockSize.n))
	}
	if a.numBlocks.n > 0 {
		set(CacheNumGPUBlocks, a.numBlocks.sum)
	}

	d := g.window.observe(now, a.c)
	hits, okHits := d.get(cPrefixHits)
	if queries, ok := d.get(cPrefixQueries); ok && okHits {
		rate := 0.0
		if queries > 0 {
			rate = hits / queries
		}
		set(PrefixCacheHitRate, rate)
	}
	mean := func(name string, slot int, sum, count counter) {
		ds, okd := d.get(sum)
		dc, _ := d.get(count)
		ls, okl := a.c.get(sum)
		lc, _ := a.c.get(count)
		if v, ok := g.ratio(slot, ds, dc, okd, ls, lc, okl); ok {
			set(name, v)
		}
	}
	mean(AvgTTFTSeconds, slotTTFT, cTTFTSum, cTTFTCount)
	mean(AvgTPOTSeconds, slotTPOT, cTPOTSum, cTPOTCount)
	mean(AvgE2ELatencySeconds, slotE2E, cE2ESum, cE2ECount)
	if v, ok := g.prefillSpeed(now, a.c, out[AvgTPOTSeconds].Value); ok {
		set(PrefillTokensPerSecond, v)
	}
	for name, r := range a.raw {
		out[name] = r.metricValue(now)
	}
	return out
}

// ratio returns the windowed ratio dn/dd when the window saw new
// observations, else the previous windowed ratio, else the lifetime ratio
// ln/ld: a mean latency, in seconds. A mean below minMeanLatency, which no
// engine takes for a token, comes of counters no engine writes (a count
// of 2^62 on one page) and is not taken: a pod would look infinitely fast.
func (g *groupState) ratio(slot int, dn, dd float64, okd bool, ln, ld float64, okl bool) (float64, bool) {
	if okd && dd > 0 && dn > 0 && dn/dd >= minMeanLatency {
		g.last[slot], g.hasLast[slot] = dn/dd, true
	}
	if g.hasLast[slot] {
		return g.last[slot], true
	}
	if okl && ld > 0 && ln > 0 && ln/ld >= minMeanLatency {
		return ln / ld, true
	}
	return 0, false
}

// minMeanLatency is the least mean latency (time to first token, between
// tokens, end to end) a scrape is believed: a microsecond.
const minMeanLatency = 1e-6

// prefillSpeed computes PrefillTokensPerSecond from the group's counters
// cur scraped at now: the speed over the prefill-speed window when it
// measures one, else the last one measured if that is at most prefillKeep
// old, else, before the first measure, the lifetime speed. The step time is
// the window's mean inter-token latency, else recentStep, the latest recent
// one.
//
// An estimate expires because routing feeds back into it: a pod measured
// slower than it is receives fewer cold prompts, so its windows hold only
// cache hits, measure nothing, and would keep the low estimate for good.
// Without one, the router takes the pod at its peers' median speed, sends it
// cold prompts again, and the next window measures it afresh.
func (g *groupState) prefillSpeed(now time.Time, cur counters, recentStep float64) (float64, bool) {
	d := g.prefill.observe(now, cur)
	step := recentStep
	if sum, _ := d.get(cTPOTSum); sum > 0 {
		if n, _ := d.get(cTPOTCount); n > 0 {
			step = sum / n
		}
	}
	if v, ok := prefillSample(d, step).TokensPerSecond(); ok {
		g.last[slotPrefill], g.hasLast[slotPrefill], g.prefillAt = v, true, now
	}
	if g.hasLast[slotPrefill] {
		return g.last[slotPrefill], now.Sub(g.prefillAt) <= g.prefillKeep
	}
	return prefillSample(cur, recentStep).TokensPerSecond()
}

// prefillSample reads a PrefillSample from counters: the prefill-time
// histogram, or the time-to-first-token histogram on engines without it. A
// counter the engine does not expose reads as zero, which measures nothing.
func prefillSample(c counters, step float64) PrefillSample {
	s := PrefillSample{StepSeconds: step}
	tokens, _ := c.get(cPromptTokens)
	hits, _ := c.get(cPrefixHits)
	s.ComputedTokens = tokens - hits
	sum, count := cPrefillSum, cPrefillCount
	if _, ok := c.get(cPrefillSum); !ok {
		sum, count = cTTFTSum, cTTFTCount
	}
	s.PrefillSeconds, _ = c.get(sum)
	s.Prefills, _ = c.get(count)
	return s
}

func (a *groupAcc) addRaw(name string, m *dto.Metric) {
	if a.raw == nil {
		a.raw = map[string]*rawAcc{}
	}
	r := a.raw[name]
	if r == nil {
		r = &rawAcc{}
		a.raw[name] = r
	}
	switch {
	case m.GetHistogram() != nil:
		r.addHistogram(m.GetHistogram())
	case m.GetSummary() != nil:
		r.addCountSum(float64(m.GetSummary().GetSampleCount()), m.GetSummary().GetSampleSum())
	default:
		r.value.add(sampleValue(m))
	}
}

func (r *rawAcc) addCountSum(count, sum float64) {
	if r.hist == nil {
		r.hist = &HistogramValue{}
	}
	r.hist.Count += count
	r.hist.Sum += sum
}

// addHistogram adds h's buckets to the ones with the same upper bound;
// series of one family share their bucket layout.
func (r *rawAcc) addHistogram(h *dto.Histogram) {
	r.addCountSum(float64(h.GetSampleCount()), h.GetSampleSum())
	for _, b := range h.GetBucket() {
		ub := b.GetUpperBound()
		if math.IsInf(ub, +1) {
			continue
		}
		i := 0
		for i < len(r.hist.Buckets) && r.hist.Buckets[i].UpperBound < ub {
			i++
		}
		if i == len(r.hist.Buckets) || r.hist.Buckets[i].UpperBound != ub {
			r.hist.Buckets = append(r.hist.Buckets, Bucket{})
			copy(r.hist.Buckets[i+1:], r.hist.Buckets[i:])
			r.hist.Buckets[i] = Bucket{UpperBound: ub}
		}
		r.hist.Buckets[i].CumulativeCount += float64(b.GetCumulativeCount())
	}
}

func (r *rawAcc) metricValue(now time.Time) MetricValue {
	if r.hist == nil {
		return MetricValue{Value: r.value.sum, UpdatedAt: now}
	}
	v := MetricValue{Histogram: r.hist, UpdatedAt: now}
	if r.hist.Count > 0 {
		v.Value = r.hist.Sum / r.hist.Count
	}
	return v
}

// sampleValue returns the value of a gauge, counter or untyped sample.
func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	default:
		return m.GetUntyped().GetValue()
	}
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func isBuiltinMetric(name string) bool {
	switch name {
	case NumRequestsRunning, NumRequestsWaiting, KVCacheUsagePerc, PrefixCacheHitRate,
		AvgTTFTSeconds, AvgTPOTSeconds, AvgE2ELatencySeconds, PrefillTokensPerSecond,
		CacheBlockSize, CacheNumGPUBlocks, RealtimeNumRequestsRunning, RealtimeNormalizedPendings:
		return true
	}
	return false
}
