package cache

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Request trace format. Autoscalers (AIBrix's GPU optimizer) read one trace
// per model and window from Redis, under RequestTraceKey, as a JSON object of
// integers:
//
//   - "<i>:<o>": the number of requests completed in the window with
//     round(log2(input tokens)/RequestTracePrecision) == i and
//     round(log2(output tokens)/RequestTracePrecision) == o (0 tokens count
//     as bucket 0);
//   - the meta keys of RequestTraceMetaKey.
const (
	// RequestTraceVersion is the format version in the meta_v key:
	// v1 had no meta keys; v2 added meta_v, meta_precision and
	// meta_interval_sec; v3 added meta_total_reqs and meta_pending_reqs;
	// v4 added meta_queueing_reqs.
	RequestTraceVersion = 4
	// RequestTraceWriteInterval is the default window length.
	RequestTraceWriteInterval = 10 * time.Second
	// MaxRequestTraceIntervalOffset is how late after the end of its window
	// a trace may be written: with a 10 s interval, before X:00.5, X:10.5, …
	// Later flushes are still written and are counted and logged.
	MaxRequestTraceIntervalOffset = 500 * time.Millisecond
	// RequestTracePrecision is the width of a bucket in log2(tokens).
	RequestTracePrecision = 0.1
	// RequestTraceTTL is how long a trace stays in Redis.
	RequestTraceTTL = 10 * time.Minute
)

// RequestTraceKey is the Redis key of model's trace for the window that
// ended at windowEnd, a Unix time in seconds that is a multiple of the
// interval: "aibrix:<model>_request_trace_<windowEnd>".
func RequestTraceKey(model string, windowEnd int64) string {
	return fmt.Sprintf("aibrix:%s_request_trace_%d", model, windowEnd)
}

// RequestTraceMetaKey names a meta entry of a request trace.
type RequestTraceMetaKey int

// The meta keys of version 4.
const (
	// MetaKeyVersionKey ("meta_v") holds RequestTraceVersion.
	MetaKeyVersionKey RequestTraceMetaKey = iota
	// MetaKeyIntervalInSeconds ("meta_interval_sec") holds the window
	// length in seconds.
	MetaKeyIntervalInSeconds
	// MetaKeyTracePrecision ("meta_precision") holds 1/RequestTracePrecision.
	MetaKeyTracePrecision
	// MetaKeyTotalRequests ("meta_total_reqs") counts the requests that
	// arrived in the window.
	MetaKeyTotalRequests
	// MetaKeyPendingRequests ("meta_pending_reqs") counts the requests in
	// flight when the window ended.
	MetaKeyPendingRequests
	// MetaKeyQueueingRequests ("meta_queueing_reqs") counts the requests in
	// flight but not yet routed to a pod when the window ended.
	MetaKeyQueueingRequests
)

var requestTraceMetaKeys = [...]string{"meta_v", "meta_interval_sec", "meta_precision", "meta_total_reqs", "meta_pending_reqs", "meta_queueing_reqs"}

// String returns the key as it appears in a trace, "" for an unknown key.
func (k RequestTraceMetaKey) String() string {
	if k < 0 || int(k) >= len(requestTraceMetaKeys) {
		return ""
	}
	return requestTraceMetaKeys[k]
}

// RequestTrace counts one model's requests in one window. The zero value is
// not usable: call NewRequestTrace. A RequestTrace is not safe for
// concurrent use.
type RequestTrace struct {
	interval time.Duration
	total    int
	buckets  map[traceBucket]int
}

type traceBucket struct{ in, out int64 }

// NewRequestTrace returns an empty trace for a window of the given length,
// a whole number of seconds.
func NewRequestTrace(interval time.Duration) *RequestTrace {
	return &RequestTrace{interval: interval, buckets: map[traceBucket]int{}}
}

// AddRequest counts a request that arrived in the window.
func (t *RequestTrace) AddRequest() { t.total++ }

// AddRequestTrace counts a request that completed in the window with the
// given token counts.
func (t *RequestTrace) AddRequestTrace(inputTokens, outputTokens int64) {
	t.buckets[traceBucket{traceBucketIndex(inputTokens), traceBucketIndex(outputTokens)}]++
}

// ToMap renders the trace in the stored format; pending and queueing fill
// the meta keys of the same names.
func (t *RequestTrace) ToMap(pending, queueing int) map[string]int {
	m := make(map[string]int, len(t.buckets)+len(requestTraceMetaKeys))
	for b, n := range t.buckets {
		m[strconv.FormatInt(b.in, 10)+":"+strconv.FormatInt(b.out, 10)] = n
	}
	m[MetaKeyVersionKey.String()] = RequestTraceVersion
	m[MetaKeyIntervalInSeconds.String()] = int(t.interval / time.Second)
	m[MetaKeyTracePrecision.String()] = int(math.Round(1 / RequestTracePrecision))
	m[MetaKeyTotalRequests.String()] = t.total
	m[MetaKeyPendingRequests.String()] = pending
	m[MetaKeyQueueingRequests.String()] = queueing
	return m
}

// traceBucketIndex is round(log2(tokens)/RequestTracePrecision), 0 for no
// tokens.
func traceBucketIndex(tokens int64) int64 {
	if tokens <= 0 {
		return 0
	}
	return int64(math.Round(math.Log2(float64(tokens)) / RequestTracePrecision))
}
