package cache

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Operation label values of kvgate_cache_redis_errors_total.
const (
	redisOpTraceFlush    = "trace_flush"
	redisOpProfileLoad   = "profile_load"
	redisOpSharedPublish = "shared_counts_publish"
	redisOpSharedRead    = "shared_counts_read"
)

// storeMetrics are the Prometheus metrics the Store exports about itself.
type storeMetrics struct {
	scrapeFailures     *prometheus.CounterVec
	modelListFailures  *prometheus.CounterVec
	podEjections       *prometheus.CounterVec
	scrapeDuration     prometheus.Histogram
	traceFlushes       *prometheus.CounterVec
	traceFlushDelay    prometheus.Histogram
	redisErrors        *prometheus.CounterVec
	doneIgnored        *prometheus.CounterVec
	requestsExpired    prometheus.Counter
	profileLoadRejects prometheus.Counter

	reg        prometheus.Registerer
	registered []prometheus.Collector
}

// gauges are read from the Store when Prometheus collects.
type storeGauges struct {
	scrapeTargets, stalePods, ejectedPods, trackedRequests, profiles func() float64
}

func newStoreMetrics(reg prometheus.Registerer, g storeGauges) (*storeMetrics, error) {
	const ns, sub = "kvgate", "cache"
	counters := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	histogram := func(name, help string, buckets ...float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help, Buckets: buckets})
	}
	m := &storeMetrics{
		scrapeFailures: counters("pod_scrape_failures_total",
			"Scrapes of a pod's /metrics that failed (connection, timeout, HTTP status or parse error).", "pod"),
		modelListFailures: counters("pod_model_list_failures_total",
			"Reads of a pod's /v1/models, which lists its LoRA adapters, that failed (connection, timeout, HTTP status or "+
				"decode error); the pod keeps the adapters it listed last.", "pod"),
		podEjections: counters("pod_ejections_total",
			"Times a pod was taken out of routing for a backoff (by default 1 s doubling to 30 s) because a request could not "+
				"connect to it, by reason: connection_refused, dial.", "pod", "reason"),
		scrapeDuration: histogram("pod_scrape_duration_seconds",
			"Time to fetch and parse one pod's /metrics, failures included.",
			.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5),
		traceFlushes: counters("request_trace_flushes_total",
			"Per-model request traces written to Redis, by result (ok, error).", "result"),
		traceFlushDelay: histogram("request_trace_flush_delay_seconds",
			"How long after the end of its window a request trace flush started.",
			.001, .005, .01, .05, .1, .25, .5, 1, 5),
		redisErrors: counters("redis_errors_total", "Failed Redis operations, by operation.", "operation"),
		doneIgnored: counters("request_done_ignored_total",
			"Request completions ignored because the request was not in flight (unknown) or belonged to an older term (stale_term).", "reason"),
		requestsExpired: counter("requests_expired_total",
			"Tracked requests dropped because no completion arrived within the request TTL."),
		profileLoadRejects: counter("gpu_profile_rejects_total",
			"GPU profiles read from Redis that could not be decoded."),
	}
	if reg == nil {
		return m, nil
	}
	m.reg = reg
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, f)
	}
	collectors := []prometheus.Collector{
		m.scrapeFailures, m.modelListFailures, m.podEjections, m.scrapeDuration, m.traceFlushes, m.traceFlushDelay, m.redisErrors,
		m.doneIgnored, m.requestsExpired, m.profileLoadRejects,
		gauge("pod_scrape_targets", "Pods whose /metrics are being scraped.", g.scrapeTargets),
		gauge("stale_pods", "Routable pods whose latest scrape failed: their metrics, if any, are the last measured, "+
			"and routing prefers pods with fresh metrics.", g.stalePods),
		gauge("ejected_pods", "Routable pods out of routing because requests could not connect to them; "+
			"a model whose pods are all ejected is routed to all of them.", g.ejectedPods),
		gauge("tracked_requests", "Inference requests in flight that count as pod load, tracked until they complete or expire.", g.trackedRequests),
		gauge("gpu_profiles", "GPU profiles held in memory.", g.profiles),
	}
	var errs []error
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
			continue
		}
		m.registered = append(m.registered, c)
	}
	if err := errors.Join(errs...); err != nil {
		m.unregister()
		return nil, fmt.Errorf("register cache metrics: %w", err)
	}
	return m, nil
}

// unregister removes the metrics from the Registerer they were registered
// on, so that another Store may register its own.
func (m *storeMetrics) unregister() {
	for _, c := range m.registered {
		m.reg.Unregister(c)
	}
	m.registered = nil
}
