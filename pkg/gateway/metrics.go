package gateway

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/internal/budget"
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
	// oversizedEvents counts the events of pods' streams relayed unread,
	// beyond Config.MaxStreamEventBytes.
	oversizedEvents prometheus.Counter
	bodyTimeouts    prometheus.Counter
	writeTimeouts   prometheus.Counter
	connWaits       prometheus.Counter
	conns           prometheus.Gauge
	heldRefusals    prometheus.Counter
	heldBytes       prometheus.GaugeFunc
	matchRefusals   *prometheus.CounterVec
	// dpRanks counts the attempts whose decision named a data-parallel
	// rank, by whether they were pinned to it.
	dpRanks *prometheus.CounterVec
	// invalidObjectives counts the requests whose
	// HeaderInferenceObjective is no object name.
	invalidObjectives prometheus.Counter
	// invalidFairnessIDs counts the requests whose HeaderFairnessID is
	// ignored.
	invalidFairnessIDs prometheus.Counter
	// shed counts the sheddable requests refused, by model.
	shed *prometheus.CounterVec
	// phases observe each phase of the gateway's time on a request, by
	// phase; phaseVec holds them.
	phases   [numPhases]prometheus.Observer
	phaseVec *prometheus.HistogramVec
	// statusLabels holds the label values of the HTTP status codes.
	statusLabels map[int]string
}

// Reasons an attempt to reach a pod failed, in
// kvgate_gateway_upstream_failures_total. The first two sent nothing and
// eject the pod, for the same reason.
const (
	failRefused          = string(cache.EjectConnectionRefused) // the pod refused the connection
	failDial             = string(cache.EjectDialFailed)        // no connection for another reason
	failSend             = "send"                               // the request was (perhaps partly) sent, no response came
	failFirstByteTimeout = "first_byte_timeout"                 // no response headers within Config.FirstByteTimeout
	failBody             = "body"                               // the response broke off after its headers
	failIdleTimeout      = "idle_timeout"                       // nothing more of the body within Config.UpstreamIdleTimeout
	failResponseTimeout  = "response_timeout"                   // the response not written to its end within Config.ResponseTimeout
)

func newMetrics(reg prometheus.Registerer, bodies *budget.Budget) (*metrics, error) {
	latency := prometheus.ExponentialBuckets(0.0005, 2, 18) // 0.5 ms to 65 s
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_gateway_requests_total",
			Help: "Inference requests answered (completions, chat, Anthropic Messages, OpenAI Responses and the other endpoints routed by model), by model " +
				"(empty when unknown), HTTP status (499 when the client went away before the response ended), routing " +
				"algorithm (empty when not routed) and endpoint (the request's path, such as /v1/chat/completions or /v1/embeddings).",
		}, []string{"model", "code", "algorithm", "endpoint"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_gateway_request_duration_seconds",
			Help:    "Time from the first byte of an inference request read to the last byte of its response written, by model and endpoint (the request's path).",
			Buckets: latency,
		}, []string{"model", "endpoint"}),
		overhead: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvgate_gateway_overhead_seconds",
			Help:    "Time from the first byte of an inference request read to the request sent to its first pod: reading, decoding, tokenization and routing.",
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
			Help: "Attempts to get a response from a pod that failed, by reason: connection_refused, dial, send, " +
				"first_byte_timeout, body, idle_timeout, response_timeout (the response, relayed to the " +
				"client, did not end within KVGATE_UPSTREAM_RESPONSE_TIMEOUT of its request sent, whether the pod or the " +
				"client was slow).",
		}, []string{"reason"}),
		tokenizeFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_gateway_tokenization_failures_total",
			Help: "Requests routed without prefix information because tokenization failed, by reason: input (a request vLLM " +
				"would refuse, or that carries several prompts), unsupported (an Anthropic Messages or OpenAI Responses request whose prompt the " +
				"gateway cannot reproduce exactly, such as one with images), too_large (beyond KVGATE_TOKENIZER_LOCAL_MAX_BYTES), " +
				"timeout, canceled, connection, status, bad_body (the engine's /tokenize call) or other.",
		}, []string{"reason"}),
		usageMissing: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_gateway_responses_without_usage_total",
			Help: "Successful completion, chat, Anthropic Messages and OpenAI Responses responses whose token usage could not be read; their requests end untraced. " +
				"The responses of the other endpoints routed by model are not read for usage, and not counted.",
		}),
		oversizedEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_gateway_oversized_events_total",
			Help: "Server-sent events of pods' streams longer than KVGATE_MAX_STREAM_EVENT_BYTES, relayed by the proxy as they came " +
				"without being read: a first token or usage they carry is missed, and a usage chunk the gateway asked for on the " +
				"client's behalf reaches the client.",
		}),
		bodyTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_gateway_request_body_timeouts_total",
			Help: "Requests whose body did not arrive within KVGATE_REQUEST_BODY_TIMEOUT, answered 408 and their connection closed.",
		}),
		writeTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_gateway_client_write_timeouts_total",
			Help: "Client connections closed because a write to them blocked for KVGATE_CLIENT_WRITE_TIMEOUT: the client read nothing of its response.",
		}),
		connWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_gateway_client_connection_limit_waits_total",
			Help: "Times the API listener held KVGATE_MAX_CLIENT_CONNECTIONS client connections open and stopped " +
				"accepting until one closed; meanwhile new connections wait in the kernel's listen backlog.",
		}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_gateway_client_connections",
			Help: "Client connections the API listener holds open, at most KVGATE_MAX_CLIENT_CONNECTIONS.",
		}),
		heldRefusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_gateway_held_request_bytes_refusals_total",
			Help: "Requests refused with 503 gateway_overloaded because their body would pass KVGATE_MAX_HELD_REQUEST_BYTES, the request bytes the gateway holds at once.",
		}),
		heldBytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvgate_gateway_held_request_bytes",
			Help: "Bytes of request bodies the gateway holds: being read, waiting for a pod or in an SLO queue, being forwarded.",
		}, func() float64 { return float64(bodies.Held()) }),
		matchRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_gateway_debug_match_refusals_total",
			Help: "POST /debug/match requests refused by reason: busy (the most served at once already are, 429), " +
				"too_large (a body or prompt beyond the bounds, 413).",
		}, []string{"reason"}),
		dpRanks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_gateway_dp_rank_requests_total",
			Help: "Requests sent to a pod serving several data-parallel ranks behind one port whose routing decision named the " +
				"rank holding more of the prompt's prefix than the others, by result: pinned (sent with X-Data-Parallel-Rank " +
				"naming it) or balanced (sent without, the engine balancing by load, because the rank already ran at least " +
				"2 requests this gateway pinned and at least twice the mean of the pod's other ranks, or because the pod's " +
				"latest scrape showed the rank with at least 2 requests waiting and a load, waiting×4 + running plus the " +
				"gateway's pins since, at least twice the mean of the other ranks'). Off with KVGATE_DP_RANK_ROUTING=false.",
		}, []string{"result"}),
		invalidObjectives: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_gateway_invalid_inference_objectives_total",
			Help: "Requests whose x-gateway-inference-objective header is not a Kubernetes object name (longer than 253 " +
				"bytes, or with other characters than lower-case letters, digits, '-' and '.'): the header is ignored and " +
				"the request has priority 0.",
		}),
		invalidFairnessIDs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_gateway_invalid_fairness_ids_total",
			Help: "Requests whose x-gateway-inference-fairness-id header is longer than 128 bytes or holds a byte that is " +
				"not printable ASCII: the header is ignored and the request joins the default flow of its priority.",
		}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_gateway_shed_requests_total",
			Help: "Requests of a negative priority (their InferenceObjective's) refused with 429 pool_saturated because no " +
				"candidate pod of their model had capacity (see KVGATE_SATURATION_QUEUE_DEPTH, " +
				"the KV cache's KVGATE_SATURATION_KV_CACHE_UTILIZATION and the metrics' age, " +
				"at most KVGATE_SATURATION_METRICS_STALENESS_MS) or, under flow control (KVGATE_FLOW_CONTROL), because " +
				"requests of their model waited for capacity, by model.",
		}, []string{"model"}),
		phaseVec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_gateway_request_phase_seconds",
			Help: "The gateway's time on an inference request by phase, from the first byte read to the last byte written: " +
				"read (the request read and checked), tokenize, route (choosing the pod and sending it the request), " +
				"upstream (waiting for the pod's response headers) and relay (the response to its last byte).",
			Buckets: prometheus.ExponentialBuckets(0.00001, 2, 24), // 10 us to 84 s
		}, []string{"phase"}),
		statusLabels: map[int]string{},
	}
	for _, r := range []string{failRefused, failDial} {
		m.retries.WithLabelValues(r)
	}
	for _, r := range []string{failRefused, failDial, failSend, failFirstByteTimeout, failBody, failIdleTimeout, failResponseTimeout} {
		m.upstreamFails.WithLabelValues(r)
	}
	for p := range numPhases {
		m.phases[p] = m.phaseVec.WithLabelValues(phaseNames[p])
	}
	for _, r := range []string{"busy", "too_large"} {
		m.matchRefusals.WithLabelValues(r)
	}
	for _, r := range []string{dpRankPinned, dpRankBalanced} {
		m.dpRanks.WithLabelValues(r)
	}
	for code := 100; code < 600; code++ {
		m.statusLabels[code] = strconv.Itoa(code)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.overhead, m.ttft, m.inFlight,
		m.retries, m.upstreamFails, m.tokenizeFails, m.usageMissing, m.oversizedEvents, m.bodyTimeouts, m.writeTimeouts,
		m.connWaits, m.conns, m.heldRefusals, m.heldBytes, m.matchRefusals, m.dpRanks, m.invalidObjectives, m.invalidFairnessIDs, m.shed, m.phaseVec} {
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
