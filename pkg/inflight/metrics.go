package inflight

import (
	"github.com/kvgate/kvgate/pkg/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// ledgerMetrics are the Prometheus metrics of a Ledger. Their names keep
// the subsystems of the components that counted them before the ledger
// did: the Store (requests) and the router (prefills).
type ledgerMetrics struct {
	requestsExpired prometheus.Counter
	closesIgnored   *prometheus.CounterVec
	prefillsExpired prometheus.Counter
}

func newLedgerMetrics(reg prometheus.Registerer, l *Ledger) (*ledgerMetrics, error) {
	m := &ledgerMetrics{
		requestsExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kvgate", Subsystem: "cache", Name: "requests_expired_total",
			Help: "Requests in flight dropped because they did not end within the request TTL: their attempts stop counting as load.",
		}),
		closesIgnored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvgate", Subsystem: "cache", Name: "request_done_ignored_total",
			Help: "Closes of a request's attempt that changed nothing, by reason: closed (the attempt was closed already), " +
				"expired (its request was dropped after the request TTL).",
		}, []string{"reason"}),
		prefillsExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kvgate", Subsystem: "routing", Name: "inflight_prefills_expired_total",
			Help: "In-flight prefills dropped because their request did not end within the request TTL.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	gauge := func(sub, name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kvgate", Subsystem: sub, Name: name, Help: help}, f)
	}
	collectors := []prometheus.Collector{
		m.requestsExpired, m.closesIgnored, m.prefillsExpired,
		gauge("cache", "tracked_requests", "Inference requests in flight, from their arrival until they end or expire.",
			func() float64 { return float64(l.tracked.Load()) }),
		gauge("routing", "inflight_prefills", "Requests sent to pods that have neither produced a first token nor ended: the prefill work kv-aware counts as queued.",
			func() float64 { return float64(l.prefills.Load()) }),
		gauge("routing", "inflight_prefill_tokens", "Predicted uncached prompt tokens of the in-flight prefills.",
			func() float64 { return float64(l.prefillTokens.Load()) }),
	}
	if err := promreg.Register(reg, "request ledger", collectors...); err != nil {
		return nil, err
	}
	return m, nil
}
