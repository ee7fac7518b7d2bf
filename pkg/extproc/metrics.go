package extproc

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a stream ended with an error, in kvgate_extproc_stream_errors_total.
const (
	errProtocol     = "protocol"           // a message out of the processing mode's order
	errSend         = "send"               // a response could not be sent: Envoy went away
	errMisconfigure = "misconfigured_mode" // a body mode in which no endpoint can be picked
	errTooLarge     = "too_large"          // a body beyond the gateway's limit
	errOverloaded   = "overloaded"         // a body beyond the request bytes the gateway holds at once
	errTooMany      = "too_many_streams"   // a stream beyond the streams served at once, refused
	errPanic        = "panic"              // serving the stream panicked
)

// statusClosedEarly labels streams that ended before a response (nginx's
// convention for a client that went away).
const statusClosedEarly = 499

type metrics struct {
	requests *prometheus.CounterVec
	decision prometheus.Histogram
	ttft     *prometheus.HistogramVec
	inFlight prometheus.Gauge
	failOpen *prometheus.CounterVec
	errors   *prometheus.CounterVec
	// oversized counts server-sent events relayed uninspected.
	oversized prometheus.Counter
	// timeoutOverrides counts the override_message_timeout messages sent.
	timeoutOverrides prometheus.Counter
	// conns and connWaits are the connections open and the waits of the
	// listener at its bound.
	conns     prometheus.Gauge
	connWaits prometheus.Counter
	// refusedStream is errors{reason="too_many_streams"}.
	refusedStream prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_extproc_requests_total",
			Help: "Requests whose external processing stream ended, by model (empty when unknown), response status (499 when the stream ended before a response), routing algorithm and endpoint (the request's path when it is one of vLLM's endpoints the gateway routes, such as /v1/chat/completions or /v1/embeddings, else other).",
		}, []string{"model", "code", "algorithm", "endpoint"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvgate_extproc_decision_seconds",
			Help:    "Time from a request's last message (its body complete) to its endpoint answer: decoding, tokenization, routing (with any wait in its model's SLO queue) and recording.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 2, 20), // 10 us to 5 s
		}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_extproc_time_to_first_token_seconds",
			Help:    "Time from a streamed request's headers to the first generated token of its response.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18), // 0.5 ms to 65 s
		}, []string{"model"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_extproc_streams_in_flight",
			Help: "External processing streams open.",
		}),
		failOpen: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_extproc_fail_open_total",
			Help: "Requests continued without an endpoint because none could be picked (KVGATE_EXTPROC_FAIL_OPEN), by the status they would have been refused with.",
		}, []string{"code"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_extproc_stream_errors_total",
			Help: "External processing streams ended by an error, by reason: protocol, send, misconfigured_mode, too_large, overloaded (a body beyond the request bytes the gateway holds at once, KVGATE_MAX_HELD_REQUEST_BYTES), too_many_streams (a stream refused with RESOURCE_EXHAUSTED beyond KVGATE_EXTPROC_MAX_STREAMS), panic (serving the stream panicked: it ended with INTERNAL, the panic logged with its stack).",
		}, []string{"reason"}),
		oversized: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_extproc_oversized_events_total",
			Help: "Server-sent events of pods' streams longer than KVGATE_MAX_STREAM_EVENT_BYTES, passed on as they came without being read: a first token or usage they carry is missed.",
		}),
		timeoutOverrides: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_extproc_message_timeout_overrides_total",
			Help: "Requests waiting in their model's SLO queue for which Envoy was asked to wait longer for the answer (override_message_timeout, KVGATE_EXTPROC_MAX_MESSAGE_TIMEOUT).",
		}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_extproc_connections",
			Help: "Connections the external processing listener holds open (at most KVGATE_EXTPROC_MAX_CONNECTIONS).",
		}),
		connWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_extproc_connection_limit_waits_total",
			Help: "Times the external processing listener held KVGATE_EXTPROC_MAX_CONNECTIONS connections and waited for one to close before accepting another.",
		}),
	}
	for _, r := range []string{errProtocol, errSend, errMisconfigure, errTooLarge, errOverloaded, errTooMany, errPanic} {
		m.errors.WithLabelValues(r)
	}
	m.refusedStream = m.errors.WithLabelValues(errTooMany)
	for _, c := range []prometheus.Collector{m.requests, m.decision, m.ttft, m.inFlight, m.failOpen, m.errors, m.oversized, m.timeoutOverrides, m.conns, m.connWaits} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register extproc metrics: %w", err)
		}
	}
	return m, nil
}

// status returns the label value of an HTTP status, once per stream.
func (m *metrics) status(code int) string { return strconv.Itoa(code) }
