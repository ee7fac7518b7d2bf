package tokenizer

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// resultOK is the calls_total label of a successful call.
const resultOK = "ok"

// metrics are a Tokenizer's Prometheus metrics.
type metrics struct {
	calls         map[string]prometheus.Counter // by result: resultOK or a Reason
	callDuration  prometheus.Histogram
	hits          prometheus.Counter
	misses        prometheus.Counter
	evictions     prometheus.Counter
	cachedTokens  prometheus.Gauge
	cachedEntries prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "kvgate", "tokenizer"
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "calls_total",
		Help: "vLLM /tokenize calls by result: ok, timeout, canceled, connection, status or bad_body.",
	}, []string{"result"})
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	m := &metrics{
		calls: map[string]prometheus.Counter{resultOK: calls.WithLabelValues(resultOK)},
		callDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "call_duration_seconds",
			Help:    "Duration of vLLM /tokenize calls, whatever their result.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		hits:   counter("cache_hits_total", "Tokenizations served from the cache."),
		misses: counter("cache_misses_total", "Tokenizations not in the cache; concurrent identical misses share one call."),
		evictions: counter("cache_evictions_total",
			"Tokenizations evicted from the cache to stay within its token budget."),
		cachedTokens:  gauge("cache_tokens", "Token ids held by the cache."),
		cachedEntries: gauge("cache_entries", "Tokenizations held by the cache."),
	}
	for _, r := range callReasons {
		m.calls[string(r)] = calls.WithLabelValues(string(r))
	}
	collectors := []prometheus.Collector{calls, m.callDuration, m.hits, m.misses, m.evictions, m.cachedTokens, m.cachedEntries}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("register tokenizer metrics: %w", err)
		}
	}
	return m, nil
}

// observeCall records a finished call; result is resultOK or a Reason.
func (m *metrics) observeCall(seconds float64, result string) {
	m.callDuration.Observe(seconds)
	m.calls[result].Inc()
}
