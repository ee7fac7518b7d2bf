package gateway

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/cache"
)

// metrics are the gateway's own Prometheus metrics.
type metrics struct {
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	overhead      prometheus.Histogram
	ttft          *prometheus.HistogramVec
	inFlight      prometheus.Gauge
	retries       *prometheus.CounterVec
	upstreamFails *prometheus.CounterVec
	tokenizeFails *prometheus.CounterVec
	usageMissing  prometheus.Counter
	// statusLabels holds the label values of the HTTP status codes.
	statusLabels map[int]string
}

// Reasons an attempt to reach a pod failed, in
// kvgate_gateway_upstream_failures_total. The first two sent nothing and
// eject the pod, for the same reason.
const (
	failRefused = string(cache.EjectConnectionRefused) // the pod refused the connection
	failDial    = string(cache.EjectDialFailed)        // no connection for another reason
	failSend    = "send"                               // the request was (perhaps partly) sent, no response came
	failBody    = "body"                               // the response broke off after its headers
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	latency := prometheus.ExponentialBuckets(0.0005, 2, 18) // 0.5 ms to 65 s
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_gateway_requests_total",
			Help: "Inference requests answered, by model (empty when unknown), HTTP status and routing algorithm (empty when not routed).",
		}, []string{"model", "code", "algorithm"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_gateway_request_duration_seconds",
			Help:    "Time from receiving an inference request to the last byte of its response.",
			Buckets: latency,
		}, []string{"model"}),
		overhead: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvgate_gateway_overhead_seconds",
			Help:    "Time from receiving an inference request to sending it to a pod: decoding, tokenization and routing.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 2, 20), // 10 us to 5 s
		}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_gateway_time_to_first_token_seconds",
			Help:    "Time from receiving a streamed inference request to relaying its first generated token.",
			Buckets: latency,
		}, []string{"model"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_gateway_requests_in_flight",
			Help: "Inference requests being served.",
		}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_gateway_retries_total",
			Help: "Requests sent to another pod after the chosen one could not be reached, by reason.",
		}, []string{"reason"}),
		upstreamFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_gateway_upstream_failures_total",
			Help: "Attempts to get a response from a pod that failed, by reason: connection_refused, dial, send, body.",
		}, []string{"reason"}),
		tokenizeFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_gateway_tokenization_failures_total",
			Help: "Requests routed without prefix information because tokenization failed, by reason.",
		}, []string{"reason"}),
		usageMissing: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_gateway_responses_without_usage_total",
			Help: "Successful responses whose token usage could not be read; their requests end untraced.",
		}),
		statusLabels: map[int]string{},
	}
	for _, r := range []string{failRefused, failDial} {
		m.retries.WithLabelValues(r)
	}
	for _, r := range []string{failRefused, failDial, failSend, failBody} {
		m.upstreamFails.WithLabelValues(r)
	}
	for code := 100; code < 600; code++ {
		m.statusLabels[code] = strconv.Itoa(code)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.overhead, m.ttft, m.inFlight,
		m.retries, m.upstreamFails, m.tokenizeFails, m.usageMissing} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register gateway metrics: %w", err)
		}
	}
	return m, nil
}

// status returns the label value of an HTTP status code without
// formatting it per request.
func (m *metrics) status(code int) string {
	if s, ok := m.statusLabels[code]; ok {
		return s
	}
	return strconv.Itoa(code)
}
