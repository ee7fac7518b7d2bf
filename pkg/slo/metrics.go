package slo

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/internal/promreg"
)

// Outcomes of a request that uses an SLO-aware algorithm, as
// kvgate_slo_requests_total counts them.
const (
	// outcomeAdmitted: routed to a pod, at once or after waiting.
	outcomeAdmitted = "admitted"
	// outcomeRejected: refused on arrival (the queue was full, no pod could
	// ever meet the SLO, or no pod could now and the algorithm does not
	// wait).
	outcomeRejected = "rejected"
	// outcomeExpired: left the queue without a pod, when it could no
	// longer meet its SLO or had waited the longest allowed.
	outcomeExpired = "expired"
	// outcomeCancelled: its client went away while it waited.
	outcomeCancelled = "cancelled"
	// outcomeDropped: its model left the fleet (or no pod was left to
	// route it to), or the gateway stopped, while it waited.
	outcomeDropped = "dropped"
	// outcomeDisplaced: it waited in a full queue until a request of a
	// higher priority took its place.
	outcomeDisplaced = "displaced"
	// outcomeShed: refused on arrival because it is sheddable and would
	// have had to wait.
	outcomeShed = "shed"
)

var outcomes = []string{outcomeAdmitted, outcomeRejected, outcomeExpired, outcomeCancelled, outcomeDropped, outcomeDisplaced,
	outcomeShed}

// Metrics are the queues' Prometheus metrics, labelled by model; a model's
// series are deleted when it leaves the fleet (Forget).
type Metrics struct {
	length   *prometheus.GaugeVec
	wait     *prometheus.HistogramVec
	requests *prometheus.CounterVec
	queued   *prometheus.CounterVec
}

// NewMetrics registers the queues' metrics on reg (none when nil):
//
//	kvgate_slo_queue_length{model}            requests waiting
//	kvgate_slo_queue_wait_seconds{model}      time waited, by requests leaving the queue
//	kvgate_slo_requests_total{model,outcome}  admitted, rejected, expired, cancelled, dropped, displaced, shed
//	kvgate_slo_queued_total{model}            requests that had to wait
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	const ns, sub = "kvgate", "slo"
	m := &Metrics{
		length: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "queue_length",
			Help: "Requests waiting in their model's queue for a pod that can serve them within their SLO, or, " +
				"under flow control (KVGATE_FLOW_CONTROL), for a pod with capacity."}, []string{"model"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "queue_wait_seconds",
			Help:    "Time requests waited in their model's queue, observed as they leave it, whatever the outcome.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}}, []string{"model"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests routed through their model's queue (an SLO-aware algorithm's, or any under flow control), by " +
				"outcome: admitted (sent to a pod, at once or after waiting), " +
				"rejected (refused on arrival: queue full, SLO unmeetable, or no capacity for slo-least-load), " +
				"expired (left the queue when it could no longer meet its SLO or waited the longest allowed), " +
				"cancelled (the client went away while it waited), dropped (the model left the fleet, or no pod was left " +
				"to route it to, or the gateway stopped, while it waited), displaced (waited in a full queue until a request " +
				"of a higher priority took its place), shed (a sheddable request, of a negative priority, refused on arrival " +
				"rather than queued)."},
			[]string{"model", "outcome"}),
		queued: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "queued_total",
			Help: "Requests that waited in their model's queue because no pod could serve them within their SLO, or, under " +
				"flow control, had capacity, on arrival."},
			[]string{"model"}),
	}
	if err := promreg.Register(reg, "SLO queues", m.length, m.wait, m.requests, m.queued); err != nil {
		return nil, err
	}
	return m, nil
}

// forget deletes model's series. A queue that resolved them before (see
// forModel) keeps counting on series no longer exported.
func (m *Metrics) forget(model string) {
	if m == nil {
		return
	}
	l := prometheus.Labels{"model": model}
	m.length.DeletePartialMatch(l)
	m.wait.DeletePartialMatch(l)
	m.requests.DeletePartialMatch(l)
	m.queued.DeletePartialMatch(l)
}

// modelMetrics are one model's series, resolved once; nil counts nothing.
type modelMetrics struct {
	length   prometheus.Gauge
	wait     prometheus.Observer
	outcomes map[string]prometheus.Counter
	queuedN  prometheus.Counter
}

func (m *Metrics) forModel(model string) *modelMetrics {
	if m == nil {
		return nil
	}
	mm := &modelMetrics{length: m.length.WithLabelValues(model), wait: m.wait.WithLabelValues(model),
		outcomes: map[string]prometheus.Counter{}, queuedN: m.queued.WithLabelValues(model)}
	for _, o := range outcomes {
		mm.outcomes[o] = m.requests.WithLabelValues(model, o)
	}
	return mm
}

// outcome counts a request that never waited.
func (m *modelMetrics) outcome(o string) {
	if m != nil {
		m.outcomes[o].Inc()
	}
}

// queued counts a request that starts waiting, n now waiting.
func (m *modelMetrics) queued(n int) {
	if m != nil {
		m.queuedN.Inc()
		m.length.Set(float64(n))
	}
}

// left counts a request that left the queue with outcome o after waiting
// waited, n still waiting.
func (m *modelMetrics) left(o string, waited time.Duration, n int) {
	if m != nil {
		m.outcomes[o].Inc()
		m.wait.Observe(waited.Seconds())
		m.length.Set(float64(n))
	}
}
