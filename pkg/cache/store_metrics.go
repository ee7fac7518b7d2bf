package cache

import (
	"fmt"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// Reasons of kvgate_cache_pod_metric_series_dropped_total.
const (
	dropUnservedModel = "unserved_model"
	dropInvalidRank   = "invalid_rank"
)

// storeMetrics are the Prometheus metrics the Store exports about itself.
type storeMetrics struct {
	scrapeFailures    *prometheus.CounterVec
	modelListFailures *prometheus.CounterVec
	podEjections      *prometheus.CounterVec
	scrapeDuration    prometheus.Histogram
	seriesDropped     *prometheus.CounterVec
	adaptersDropped   *prometheus.CounterVec

	reg        prometheus.Registerer
	registered []prometheus.Collector
}

// gauges are read from the Store when Prometheus collects.
type storeGauges struct {
	scrapeTargets, stalePods, ejectedPods func() float64
}

func newStoreMetrics(reg prometheus.Registerer, g storeGauges) (*storeMetrics, error) {
	const ns, sub = "kvgate", "cache"
	counters := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets ...float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help, Buckets: buckets})
	}
	m := &storeMetrics{
		scrapeFailures: counters("pod_scrape_failures_total",
			fmt.Sprintf("Scrapes of a pod's /metrics that failed, by reason: connection, timeout, status (not 200, "+
				"after at most %d redirects within the pod's address), too_large (a page beyond %d MiB once inflated, or an "+
				"answer beyond %d MiB as sent) or bad_body (a page that does not parse, or whose encoding is not gzip or not what it says); "+
				"the pod keeps its last values, marked stale.", maxPageRedirects, maxScrapeBytes>>20,
				pageWireBytes(maxScrapeBytes)>>20), "pod", "reason"),
		modelListFailures: counters("pod_model_list_failures_total",
			fmt.Sprintf("Reads of a pod's /v1/models, which lists its LoRA adapters, that failed, by reason: connection, "+
				"timeout, status (not 200), too_large (a body beyond %d MiB) or bad_body (not a model list); the pod keeps "+
				"the adapters it listed last.", maxModelListBytes>>20), "pod", "reason"),
		podEjections: counters("pod_ejections_total",
			"Times a pod was taken out of routing for a backoff (by default 1 s doubling to 30 s) because a request could not "+
				"connect to it, by reason: connection_refused, dial.", "pod", "reason"),
		seriesDropped: counters("pod_metric_series_dropped_total",
			fmt.Sprintf("Series of a pod's /metrics not broken down by model or data-parallel rank, counted at every scrape, "+
				"by reason: unserved_model (labelled with a model_name the pod does not serve; they count for the pod as a "+
				"whole), invalid_rank (running or waiting requests labelled with an engine that is not a rank from 0 to %d; "+
				"they count for the pod as a whole, not for a rank).", endpoint.MaxDPSize-1), "pod", "reason"),
		adaptersDropped: counters("pod_adapters_dropped_total",
			"LoRA adapters a pod's /v1/models listed beyond the most the gateway takes from one pod "+
				"(KVGATE_MAX_ADAPTERS_PER_POD), counted at every listing: requests for them are not routed to the pod.", "pod"),
		scrapeDuration: histogram("pod_scrape_duration_seconds",
			"Time to fetch and parse one pod's /metrics, failures included.",
			.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5),
	}
	if reg == nil {
		return m, nil
	}
	m.reg = reg
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, f)
	}
	collectors := []prometheus.Collector{
		m.scrapeFailures, m.modelListFailures, m.podEjections, m.scrapeDuration, m.seriesDropped, m.adaptersDropped,
		gauge("pod_scrape_targets", "Pods whose /metrics are being scraped.", g.scrapeTargets),
		gauge("stale_pods", "Routable pods whose latest scrape failed: their metrics, if any, are the last measured, "+
			"and routing prefers pods with fresh metrics.", g.stalePods),
		gauge("ejected_pods", "Routable pods out of routing because requests could not connect to them; "+
			"a model whose pods are all ejected is routed to all of them.", g.ejectedPods),
	}
	if err := promreg.Register(reg, "cache", collectors...); err != nil {
		return nil, err
	}
	m.registered = collectors
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
