package cache

import (
	"math"
	"time"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
)

// MetricBits says which of a pod's built-in metrics were measured.
type MetricBits uint8

// Bits of PodMetrics.Measured.
const (
	HasWaiting MetricBits = 1 << iota
	HasKVCacheUsage
	HasAvgTTFT
	HasAvgTPOT
	HasPrefillSpeed
)

// PodMetrics are the built-in metrics of a pod as of its latest scrape
// (see the metric names of this package), as a routing decision reads
// them: a field whose bit in Measured is unset was not measured (or was not
// a number) and is zero.
type PodMetrics struct {
	// At is when the pod was scraped, the zero time before its first
	// scrape.
	At time.Time
	// Waiting is NumRequestsWaiting, KVCacheUsage KVCacheUsagePerc,
	// AvgTTFTSeconds and AvgTPOTSeconds the recent mean latencies, and
	// PrefillTokensPerSecond the pod's prefill speed.
	Waiting, KVCacheUsage, AvgTTFTSeconds, AvgTPOTSeconds, PrefillTokensPerSecond float64
	Measured                                                                      MetricBits
	// Ranks are the loads of the data-parallel ranks of the pod's engine,
	// indexed by rank, when the scrape's vllm:num_requests_running and
	// vllm:num_requests_waiting series carried more than one engine label
	// value that is a rank (vLLM serving several ranks behind one API
	// server labels each engine core's series with its rank); nil
	// otherwise. Only ranks below endpoint.MaxDPSize are kept: a series
	// labelled with another engine value counts for the pod as a whole
	// only (and in kvgate_cache_pod_metric_series_dropped_total, reason
	// invalid_rank), so that Ranks never holds more than MaxDPSize
	// entries. A rank below the highest kept that the page had no series
	// of reads zero. The slice is shared: treat it as read-only.
	Ranks []RankLoad
}

// RankLoad is the load of one data-parallel rank of a pod's engine, as
// last scraped: the values of the rank's vllm:num_requests_running and
// vllm:num_requests_waiting series, summed over its models.
type RankLoad struct {
	Running, Waiting float64
}

// podMetricsOf picks the built-in metrics routing reads out of a scrape's
// values.
func podMetricsOf(values map[string]MetricValue, at time.Time) PodMetrics {
	m := PodMetrics{At: at}
	for _, f := range [...]struct {
		name string
		dst  *float64
		bit  MetricBits
	}{
		{NumRequestsWaiting, &m.Waiting, HasWaiting},
		{KVCacheUsagePerc, &m.KVCacheUsage, HasKVCacheUsage},
		{AvgTTFTSeconds, &m.AvgTTFTSeconds, HasAvgTTFT},
		{AvgTPOTSeconds, &m.AvgTPOTSeconds, HasAvgTPOT},
		{PrefillTokensPerSecond, &m.PrefillTokensPerSecond, HasPrefillSpeed},
	} {
		if v, ok := values[f.name]; ok && !math.IsNaN(v.Value) && !math.IsInf(v.Value, 0) {
			*f.dst = v.Value
			m.Measured |= f.bit
		}
	}
	return m
}

// PodSnapshot is what the Store knows of one pod at one moment: what a
// routing decision reads of each candidate, gathered with one registry
// lookup.
type PodSnapshot struct {
	// Endpoint is the pod as registered.
	Endpoint *endpoint.Endpoint
	// Scrape says how current Metrics are; "" when the caller knows
	// nothing of it (a simulation), which routing treats as not fresh.
	Scrape ScrapeState
	// Metrics are the pod's built-in metrics as last scraped.
	Metrics PodMetrics
	// Ejected reports the pod out of routing after failed connections
	// (see EjectPod).
	Ejected bool
	// Load is the pod's load record: the requests in flight on it and its
	// prefill queue.
	Load *inflight.PodLoad
}

// Snapshots appends to out the snapshot of each of pods, in order, and
// returns the extended slice; pass a slice of a previous call, emptied, so
// that snapshots cost no allocation once it has grown. A pod that left the
// registry since it was listed is snapshot as unscraped, with a load record
// of its own, so that what is routed to it counts on no registered pod; a
// pod replaced by another of the same name is snapshot as registered now.
func (s *Store) Snapshots(pods []*endpoint.Endpoint, out []PodSnapshot) []PodSnapshot {
	now := s.now()
	s.reg.mu.RLock()
	defer s.reg.mu.RUnlock()
	for _, ep := range pods {
		e := s.reg.pods[ep.Key]
		if e == nil {
			out = append(out, PodSnapshot{Endpoint: ep, Scrape: ScrapeNone, Load: inflight.NewPodLoad(ep.ID)})
			continue
		}
		sp := PodSnapshot{Endpoint: e.ep, Scrape: ScrapeNone, Ejected: e.state.health.ejected(now), Load: e.state.load}
		if m := e.state.metrics.Load(); m != nil {
			sp.Metrics = m.builtin
			sp.Scrape = ScrapeFresh
			if m.stale {
				sp.Scrape = ScrapeStale
			}
		}
		out = append(out, sp)
	}
	return out
}
