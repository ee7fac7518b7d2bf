package redisstate

import (
	"github.com/kvgate/kvgate/pkg/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// Operation label values of kvgate_cache_redis_errors_total.
const (
	opTraceFlush    = "trace_flush"
	opProfileLoad   = "profile_load"
	opSharedPublish = "shared_counts_publish"
	opSharedRead    = "shared_counts_read"
	opStoredWrite   = "stored_response_write"
	opStoredLookup  = "stored_response_lookup"
)

// Reason label values of kvgate_cache_gpu_profile_rejects_total.
const (
	profileRejectDecode = "decode"
	profileRejectSize   = "size"
	profileRejectLimit  = "limit"
)

// Reason label values of kvgate_cache_shared_gateways_skipped_total.
const (
	skipLimit      = "limit"
	skipClockAhead = "clock_ahead"
	skipFields     = "fields"
	skipBytes      = "bytes"
	skipNotHash    = "not_hash"
)

// Reason label values of kvgate_cache_shared_fields_ignored_total.
const (
	ignoreUnknownPod   = "unknown_pod"
	ignoreUnknownModel = "unknown_model"
)

// Metrics are the Prometheus metrics of the components that keep state in
// Redis, shared by them. Their names keep the Store's subsystem, which
// counted them before these components had a package of their own. One
// Metrics serves every component of a gateway.
type Metrics struct {
	redisErrors     *prometheus.CounterVec
	traceFlushes    *prometheus.CounterVec
	traceFlushDelay prometheus.Histogram
	profileRejects  *prometheus.CounterVec
	localOnly       prometheus.Counter
	blocksTruncated prometheus.Counter
	sharedRejects   *prometheus.CounterVec
	gateways        prometheus.Gauge
	gatewaysSkipped *prometheus.CounterVec
	fieldsIgnored   *prometheus.CounterVec
	storedWrites    *prometheus.CounterVec
	storedLookups   *prometheus.CounterVec
}

// NewMetrics returns the metrics, registered on reg (none when nil). It
// fails when they cannot be registered.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	const ns, sub = "kvgate", "cache"
	m := &Metrics{
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "redis_errors_total",
			Help: "Failed Redis operations, by operation."}, []string{"operation"}),
		traceFlushes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "request_trace_flushes_total",
			Help: "Per-model request traces written to Redis, by result (ok, error)."}, []string{"result"}),
		traceFlushDelay: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "request_trace_flush_delay_seconds", Help: "How long after the end of its window a request trace flush started.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 5}}),
		profileRejects: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "gpu_profile_rejects_total",
			Help: "GPU profiles in Redis skipped, at each refresh, by reason: decode (not a string, not JSON, more than 2 " +
				"index dimensions, or more than 64 values in an index, a table or a table's row), size (a value longer than 256 KiB), limit (beyond the 256 " +
				"profiles a refresh loads). A skipped profile keeps the version loaded before, but for limit."}, []string{"reason"}),
		localOnly: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "shared_counts_local_only_total",
			Help: "Times the other gateway replicas' requests stopped counting in routing because Redis could not be read " +
				"for longer than the shared counts' TTL: routing then goes on with this replica's requests alone."}),
		blocksTruncated: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "shared_blocks_truncated_total",
			Help: "Publications of this replica's prompt blocks in flight that left some out to stay within the bound " +
				"(KVGATE_SHARED_MAX_BLOCKS): other replicas then credit its pods with shorter prefixes."}),
		sharedRejects: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "shared_state_rejects_total",
			Help: "Values other gateway replicas shared through Redis that could not be decoded and were dropped, by kind: " +
				"blocks, output_histogram (one replica's history, of another shape than this replica's predictors'), value " +
				"(a count above 16777216 or a load or prefill value above 1e6)."}, []string{"kind"}),
		gateways: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "shared_gateways",
			Help: "Gateway replicas sharing state through Redis, this one included, as of the last read; 0 until the first."}),
		gatewaysSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "shared_gateways_skipped_total",
			Help: "Other gateway replicas whose shared state a read left out, at each read, by reason: limit (beyond the " +
				"64 replicas a read takes, this one included: the least recently published), clock_ahead (listed at a " +
				"time further ahead of the Redis server's clock than the shared state's TTL, which only another writer of " +
				"the list could cause), fields (a hash of more than 16384 " +
				"fields), bytes (a hash larger, by Redis's MEMORY USAGE, than 8 bytes per KVGATE_SHARED_MAX_BLOCKS plus " +
				"2 MiB: 2.25 MiB by default), not_hash (a key that holds no hash)."}, []string{"reason"}),
	}
	m.fieldsIgnored = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "shared_fields_ignored_total",
		Help: "Fields of other gateway replicas' shared state ignored, at each read, by reason: unknown_pod (about a pod " +
			"this replica has not registered), unknown_model (about a model the pod, or any pod, does not serve here). " +
			"They count from the read after the pod or model is registered."}, []string{"reason"})
	m.storedWrites = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "stored_response_writes_total",
		Help: "Records of the engine that made an OpenAI Responses API response, shared with the other gateway replicas " +
			"through Redis, by result: written, exists (Redis holds a record of the id already, which stands), dropped (the " +
			"queue of records to write was full), refused (a record longer " +
			"than 1 KiB, or whose pod name, UID or address holds a line break), error (Redis failed)."}, []string{"result"})
	m.storedLookups = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "stored_response_lookups_total",
		Help: "Look-ups in Redis of the engine that made a stored response this gateway replica has no record of, by " +
			"result: hit, miss (no record: never made through a replica, or expired), invalid (a value longer than 1 KiB, " +
			"malformed or not a string, ignored), timeout (no answer within KVGATE_STORED_RESPONSE_LOOKUP_TIMEOUT_MS), " +
			"error (Redis failed), coalesced (not asked: answered by the look-up of the same id in flight), busy (not asked: " +
			"the 64 look-ups this replica lets wait for Redis at once were waiting). But for a hit, or a coalesced look-up " +
			"answered by one, the request is served as one for a response the gateway has no record of."}, []string{"result"})
	for _, r := range []string{storedWritten, storedExists, storedDropped, storedRefused, storedError} {
		m.storedWrites.WithLabelValues(r)
	}
	for _, r := range []string{lookupHit, lookupMiss, lookupInvalid, lookupTimeout, lookupError, lookupCoalesced, lookupBusy} {
		m.storedLookups.WithLabelValues(r)
	}
	for _, r := range []string{profileRejectDecode, profileRejectSize, profileRejectLimit} {
		m.profileRejects.WithLabelValues(r)
	}
	for _, r := range []string{skipLimit, skipClockAhead, skipFields, skipBytes, skipNotHash} {
		m.gatewaysSkipped.WithLabelValues(r)
	}
	for _, r := range []string{ignoreUnknownPod, ignoreUnknownModel} {
		m.fieldsIgnored.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	if err := promreg.Register(reg, "Redis state", m.redisErrors, m.traceFlushes, m.traceFlushDelay, m.profileRejects, m.localOnly,
		m.blocksTruncated, m.sharedRejects, m.gateways, m.gatewaysSkipped, m.fieldsIgnored, m.storedWrites, m.storedLookups); err != nil {
		return nil, err
	}
	return m, nil
}
