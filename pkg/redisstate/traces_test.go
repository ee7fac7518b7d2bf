package redisstate

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// newTestTracer returns a Tracer of hour-long windows writing to rc and
// observing a ledger of its own, which it returns; it does not run, so
// that the test decides when windows end.
func newTestTracer(t *testing.T, rc *redis.Client, reg prometheus.Registerer) (*Tracer, *inflight.Ledger) {
	t.Helper()
	l := newTestLedger(t)
	tr, err := NewTracer(rc, l, newTestMetrics(t, reg), TracerConfig{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l.Observe(tr.Observer())
	return tr, l
}

func readTrace(t *testing.T, rc *redis.Client, key string) map[string]int {
	t.Helper()
	raw, err := rc.Get(context.Background(), key).Bytes()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	var m map[string]int
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("trace %s is not a JSON object of integers: %v: %s", key, err, raw)
	}
	return m
}

func TestFlushWritesEveryModelsTraceToRedis(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	s, l := newTestTracer(t, rc, nil)
	for i := range 2 {
		complete(l, fmt.Sprint("m1-", i), "m1", 1024, 128)
	}
	admit(l, "m1-2", "m1")
	l.Admit("m2-0", "m2") // not routed yet
	if got := s.DumpRequestTrace("m1"); got["100:70"] != 2 || got["meta_pending_reqs"] != 1 {
		t.Fatalf("DumpRequestTrace(m1) = %v", got)
	}

	end := time.Unix(1_700_000_010, 0)
	s.flush(context.Background(), end)

	m1 := readTrace(t, rc, "aibrix:m1_request_trace_1700000010")
	want := map[string]int{"100:70": 2, "meta_v": 4, "meta_interval_sec": 3600, "meta_precision": 10,
		"meta_total_reqs": 3, "meta_pending_reqs": 1, "meta_queueing_reqs": 0}
	if !reflect.DeepEqual(m1, want) {
		t.Fatalf("m1 trace = %v\nwant       %v", m1, want)
	}
	m2 := readTrace(t, rc, "aibrix:m2_request_trace_1700000010")
	if m2["meta_total_reqs"] != 1 || m2["meta_pending_reqs"] != 1 || m2["meta_queueing_reqs"] != 1 {
		t.Fatalf("m2 trace = %v, want one request pending and queueing", m2)
	}
	ttl, err := rc.TTL(context.Background(), "aibrix:m1_request_trace_1700000010").Result()
	if err != nil || ttl <= cache.RequestTraceTTL-time.Minute || ttl > cache.RequestTraceTTL {
		t.Fatalf("TTL = %v, %v; want about %v", ttl, err, cache.RequestTraceTTL)
	}
	if got := s.DumpRequestTrace("m1"); got != nil {
		t.Fatalf("the flushed window is still current: %v", got)
	}

	// The next window has no new requests, but m1 still has one in flight.
	s.flush(context.Background(), end.Add(time.Hour))
	next := readTrace(t, rc, "aibrix:m1_request_trace_1700003610")
	if next["meta_total_reqs"] != 0 || next["meta_pending_reqs"] != 1 {
		t.Fatalf("trace of a window with only a pending request = %v", next)
	}
}

func TestTracesOfTwoGatewaysMerge(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	key := "aibrix:m_request_trace_1700000010"
	// A value that is not a trace is replaced.
	if err := rc.Set(context.Background(), key, "not json", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for g, requests := range []int{2, 3} {
		s, l := newTestTracer(t, rc, nil)
		for i := range requests {
			complete(l, fmt.Sprint(g, "-", i), "m", 100, int64(10*(g+1)))
		}
		l.Admit("pending", "m")
		s.flush(context.Background(), time.Unix(1_700_000_010, 0))
	}
	got := readTrace(t, rc, key)
	want := map[string]int{"66:33": 2, "66:43": 3, "meta_v": 4, "meta_interval_sec": 3600, "meta_precision": 10,
		"meta_total_reqs": 2 + 1 + 3 + 1, "meta_pending_reqs": 2, "meta_queueing_reqs": 2}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("merged trace = %v\nwant           %v", got, want)
	}
}

func TestStoppingWritesTheWindowInProgress(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	s, l := newTestTracer(t, rc, nil)
	stop := run(t, s)
	complete(l, "done", "m", 4, 4)
	stop()

	// The window in progress is the one that ends at the next hour boundary
	// after Run returned; should an hour boundary pass during the test, the request
	// lands in whichever window was in progress, so read every window.
	keys, err := rc.Keys(context.Background(), "aibrix:m_request_trace_*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("no trace written when Run returned: keys %v, err %v", keys, err)
	}
	total, bucket := 0, 0
	for _, key := range keys {
		got := readTrace(t, rc, key)
		total += got["meta_total_reqs"]
		bucket += got["20:20"]
	}
	if total != 1 || bucket != 1 {
		t.Fatalf("traces written when Run returned (%v) hold %d requests, %d in bucket 20:20; want 1 and 1", keys, total, bucket)
	}
}

func TestFlusherWritesAtIntervalBoundaries(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	reg := prometheus.NewRegistry()
	l := newTestLedger(t)
	s, err := NewTracer(rc, l, newTestMetrics(t, reg), TracerConfig{Interval: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l.Observe(s.Observer())
	run(t, s)
	l.Admit("r", "m")

	var key string
	testsupport.EventuallyWhy(t, "a request trace in Redis", func() (string, bool) {
		keys, err := rc.Keys(context.Background(), "aibrix:m_request_trace_*").Result()
		if err != nil || len(keys) == 0 {
			return fmt.Sprint("no trace key yet: ", err), false
		}
		key = keys[0]
		return "", true
	})
	end, err := strconv.ParseInt(strings.TrimPrefix(key, "aibrix:m_request_trace_"), 10, 64)
	if err != nil || end%2 != 0 {
		t.Fatalf("trace key %s does not end at a multiple of the 2s interval", key)
	}
	if got := readTrace(t, rc, key); got["meta_interval_sec"] != 2 || got["meta_pending_reqs"] != 1 {
		t.Fatalf("trace = %v", got)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "kvgate_cache_request_trace_flush_delay_seconds" {
			h := f.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() == 0 || h.GetSampleSum()/float64(h.GetSampleCount()) > cache.MaxRequestTraceIntervalOffset.Seconds() {
				t.Fatalf("flushes started %v s late on average over %d, want within %v", h.GetSampleSum()/float64(h.GetSampleCount()), h.GetSampleCount(), cache.MaxRequestTraceIntervalOffset)
			}
			return
		}
	}
	t.Fatal("no flush delay metric")
}

func TestFlushToUnreachableRedisIsCountedNotFatal(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there any more
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rc.Close() })
	reg := prometheus.NewRegistry()
	s, l := newTestTracer(t, rc, reg)
	l.Admit("r", "m")
	s.flush(context.Background(), time.Unix(1_700_000_010, 0))
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_request_trace_flushes_total", map[string]string{"result": "error"}); n != 1 {
		t.Fatalf("failed flushes = %v, want 1", n)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_redis_errors_total", map[string]string{"operation": "trace_flush"}); n != 1 {
		t.Fatalf("redis errors = %v, want 1", n)
	}
}

func TestTraceIntervalsAreWholeSeconds(t *testing.T) {
	if _, err := NewTracer(nil, newTestLedger(t), newTestMetrics(t, nil), TracerConfig{Interval: 1500 * time.Millisecond}); err == nil {
		t.Error("a trace interval of 1.5 s was accepted")
	}
}

func TestOnlyCompletedAttemptsWithUsageAreTraced(t *testing.T) {
	s, l := newTestTracer(t, nil, nil)
	failed := admit(l, "failed", "m")
	failed.ReportUsage(inflight.Usage{PromptTokens: 1024, CompletionTokens: 1})
	failed.Close(inflight.Failed, "body")
	retried := failed.Request().Route(inflight.Route{Pod: inflight.NewPodLoad("ns/q")})
	retried.ReportUsage(inflight.Usage{PromptTokens: 1024, CompletionTokens: 128})
	retried.Close(inflight.Done, "")
	admit(l, "no usage", "m").Close(inflight.Done, "")
	got := s.DumpRequestTrace("m")
	if got["100:70"] != 1 || got["100:0"] != 0 || got["meta_total_reqs"] != 2 {
		t.Fatalf("trace %v; want the retried request traced once with its completed attempt's usage, two arrivals", got)
	}
}
