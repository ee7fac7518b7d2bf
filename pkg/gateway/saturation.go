package gateway

import (
	"fmt"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/config"
)

// SaturationConfig says when a pod has capacity for sheddable requests,
// those of a negative priority (see types.RoutingContext.Priority), as the
// Gateway API Inference Extension decides it: its metrics are fresh, and
// its engine's waiting queue and KV cache within their thresholds. When no
// candidate pod of a request's model has capacity, the model's pods are
// saturated, and a sheddable request is refused with 429 (code
// pool_saturated) and a Retry-After of a second, counted in
// kvgate_gateway_shed_requests_total; requests of priority 0 or more are
// routed as usual.
type SaturationConfig struct {
	// QueueDepth is the most requests waiting in a pod's engine
	// (vllm:num_requests_waiting) for it to have capacity
	// (KVGATE_SATURATION_QUEUE_DEPTH).
	QueueDepth int
	// KVCacheUtilization is the most a pod's KV cache may be in use
	// (vllm:kv_cache_usage_perc, 0 to 1) for it to have capacity
	// (KVGATE_SATURATION_KV_CACHE_UTILIZATION).
	KVCacheUtilization float64
	// MetricsStaleness is how old the pod's latest scrape may be for it to
	// have capacity (KVGATE_SATURATION_METRICS_STALENESS_MS); a pod whose
	// last scrape failed, or that was never scraped, has none.
	MetricsStaleness time.Duration
}

// DefaultSaturation is the SaturationConfig of a Config whose Saturation is
// zero: the Gateway API Inference Extension's defaults.
var DefaultSaturation = SaturationConfig{QueueDepth: 5, KVCacheUtilization: 0.8, MetricsStaleness: 200 * time.Millisecond}

// hasCapacity reports whether the pod of s has capacity for sheddable
// requests at now: not ejected, scraped successfully no longer than
// MetricsStaleness ago, with at most QueueDepth requests waiting and at
// most KVCacheUtilization of its KV cache in use. A metric the engine does
// not export does not limit it.
func (c SaturationConfig) hasCapacity(s *cache.PodSnapshot, now time.Time) bool {
	m := &s.Metrics
	if s.Ejected || s.Scrape != cache.ScrapeFresh || m.At.IsZero() || now.Sub(m.At) > c.MetricsStaleness {
		return false
	}
	if m.Measured&cache.HasWaiting != 0 && m.Waiting > float64(c.QueueDepth) {
		return false
	}
	return m.Measured&cache.HasKVCacheUsage == 0 || m.KVCacheUsage <= c.KVCacheUtilization
}

// validate refuses thresholds no pod can meet the way they are meant:
// a negative queue depth, a KV-cache utilization outside [0, 1], a
// staleness that is not positive.
func (c SaturationConfig) validate() error {
	if c.QueueDepth < 0 || !(c.KVCacheUtilization >= 0 && c.KVCacheUtilization <= 1) || c.MetricsStaleness <= 0 {
		return fmt.Errorf("saturation thresholds %+v: want a queue depth of at least 0, a KV-cache utilization in [0, 1] "+
			"and a positive metrics staleness", c)
	}
	return nil
}

// saturated reports whether no pod of snaps has capacity at now; no pod at
// all has none.
func (c SaturationConfig) saturated(snaps []cache.PodSnapshot, now time.Time) bool {
	for i := range snaps {
		if c.hasCapacity(&snaps[i], now) {
			return false
		}
	}
	return true
}

// codePoolSaturated is the code of a sheddable request refused because its
// model's pods are saturated.
const codePoolSaturated = "pool_saturated"

// shed refuses a sheddable request (a negative priority) when its
// candidates are saturated, counting it; it returns nil for any other
// request, which it does not look at further.
func (g *Gateway) shed(a *admitted, x *exchange) *Error {
	if a.priority >= 0 {
		return nil
	}
	x.snaps = a.b.store.Snapshots(a.pods, x.snaps[:0])
	if !g.cfg.Saturation.saturated(x.snaps, time.Now()) {
		return nil
	}
	g.metrics.shed.WithLabelValues(a.model).Inc()
	c := g.cfg.Saturation
	return &Error{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: codePoolSaturated,
		Message: fmt.Sprintf("the pods of the model `%s` are saturated (none has at most %d requests waiting, at most %v "+
			"of its KV cache in use and metrics from the last %v), and the request's objective (priority %d) is sheddable",
			a.model, c.QueueDepth, c.KVCacheUtilization, c.MetricsStaleness, a.priority),
		RetryAfter: time.Second, Model: a.model, Algorithm: a.algorithm}
}

// loadSaturation reads the saturation thresholds; staleness must exceed the
// scrape interval refresh, or every pod would read stale between scrapes.
func loadSaturation(e *config.Env, refresh time.Duration) SaturationConfig {
	c := SaturationConfig{
		QueueDepth:         e.Int(config.SaturationQueueDepth, 0),
		KVCacheUtilization: e.Float(config.SaturationKVCacheUtilization, 0),
		MetricsStaleness:   e.Duration(config.SaturationMetricsStaleness, time.Millisecond),
	}
	if c.KVCacheUtilization > 1 {
		e.Errorf("%s=%v: want a number in [0, 1]", config.SaturationKVCacheUtilization.Name, c.KVCacheUtilization)
	}
	if c.MetricsStaleness > 0 && refresh > 0 && c.MetricsStaleness <= refresh {
		e.Errorf("%s=%v must exceed %s (%v): every pod's metrics would be stale between scrapes, and every sheddable "+
			"request refused", config.SaturationMetricsStaleness.Name, c.MetricsStaleness, config.PodMetricRefreshInterval.Name,
			refresh)
	}
	return c
}
