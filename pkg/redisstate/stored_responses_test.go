package redisstate

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
)

var testStoredResponse = StoredResponse{Namespace: "ns", Name: "vllm-0", UID: "6f1c2d3e-0000-4000-8000-000000000001",
	Address: "10.0.0.1:8000", Model: "meta-llama/Llama-3.1-8B-Instruct"}

func TestStoredResponseRecordsDecodeAsEncodedWithinTheirBound(t *testing.T) {
	multiline := testStoredResponse
	multiline.Model = "a\nmodel"
	noUID := testStoredResponse
	noUID.UID, noUID.Namespace = "", ""
	for _, r := range []StoredResponse{testStoredResponse, multiline, noUID} {
		v, err := EncodeStoredResponse(r)
		if err != nil {
			t.Fatalf("encode %+v: %v", r, err)
		}
		if got, ok := DecodeStoredResponse(v); !ok || got != r {
			t.Errorf("%+v encoded as %q decodes as %+v, %v", r, v, got, ok)
		}
	}
	long := testStoredResponse
	long.Model = strings.Repeat("m", MaxStoredResponseBytes)
	broken := testStoredResponse
	broken.Address = "10.0.0.1:8000\nx"
	for name, r := range map[string]StoredResponse{"longer than the bound": long, "line break in the address": broken,
		"no pod name": {Address: "a:1"}, "no address": {Name: "p"}} {
		if v, err := EncodeStoredResponse(r); err == nil {
			t.Errorf("%s: encoded as %q", name, v)
		}
	}
	v, _ := EncodeStoredResponse(testStoredResponse)
	for name, bad := range map[string]string{
		"empty":                 "",
		"another version":       "2" + v[1:],
		"too few fields":        "1\nns\np\nuid",
		"no pod name":           "1\nns\n\nuid\na:1\nm",
		"no address":            "1\nns\np\nuid\n\nm",
		"longer than the bound": v + strings.Repeat("m", MaxStoredResponseBytes),
	} {
		if r, ok := DecodeStoredResponse(bad); ok {
			t.Errorf("%s: %q decodes as %+v", name, bad, r)
		}
	}
	if _, ok := DecodeStoredResponse("1\nns\np\nuid\na:1\n" + strings.Repeat("m", MaxStoredResponseBytes-len("1\nns\np\nuid\na:1\n"))); !ok {
		t.Error("a record of exactly the bound does not decode")
	}
}

// newStoredResponses returns the component on client, running until the
// test ends, and its metrics' registry.
func newStoredResponses(t *testing.T, client *redis.Client, cfg StoredResponsesConfig) (*StoredResponses, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := NewStoredResponses(client, newTestMetrics(t, reg), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s, reg
}

func storedCount(t *testing.T, reg *prometheus.Registry, family, result string) float64 {
	t.Helper()
	return testsupport.MetricValue(t, reg, "kvgate_cache_stored_response_"+family+"_total", map[string]string{"result": result})
}

func TestStoredResponsesWrittenByOneReplicaAreFoundByAnother(t *testing.T) {
	srv := testredis.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	// The look-ups here wait for no client: the bound only keeps a
	// loaded machine from failing them.
	cfg := StoredResponsesConfig{TTL: 2 * time.Hour, LookupTimeout: 5 * time.Second}
	writer, wreg := newStoredResponses(t, c, cfg)
	reader, rreg := newStoredResponses(t, c, cfg)

	if _, ok := reader.Lookup("resp_1"); ok {
		t.Fatal("a response never recorded is found")
	}
	writer.Record("resp_1", testStoredResponse)
	unencodable := testStoredResponse
	unencodable.Model = strings.Repeat("m", MaxStoredResponseBytes)
	writer.Record("resp_2", unencodable)
	testsupport.Eventually(t, "the record to be written", func() bool { return storedCount(t, wreg, "writes", storedWritten) == 1 })
	got, ok := reader.Lookup("resp_1")
	if !ok || got != testStoredResponse {
		t.Fatalf("look-up of resp_1: %+v, %v; want %+v", got, ok, testStoredResponse)
	}
	if ttl := srv.NewClient(t).TTL(context.Background(), StoredResponseKeyPrefix+"resp_1").Val(); ttl <= time.Hour || ttl > 2*time.Hour {
		t.Errorf("the record expires in %v, want the TTL of 2h", ttl)
	}
	testsupport.Eventually(t, "the record too long to be refused", func() bool { return storedCount(t, wreg, "writes", storedRefused) == 1 })
	// The same id made again, by another engine (a client may choose the
	// id): the first record stands.
	other := testStoredResponse
	other.Name = "other"
	reader.Record("resp_1", other)
	testsupport.Eventually(t, "the second record of resp_1 to be kept out", func() bool {
		return storedCount(t, rreg, "writes", storedExists) == 1
	})
	if got, ok := reader.Lookup("resp_1"); !ok || got != testStoredResponse {
		t.Errorf("look-up of resp_1 after another record: %+v, %v; want the first, %+v", got, ok, testStoredResponse)
	}
	if _, ok := reader.Lookup("resp_2"); ok {
		t.Error("a record longer than the bound was written")
	}
	for result, want := range map[string]float64{lookupHit: 2, lookupMiss: 2, lookupInvalid: 0, lookupTimeout: 0, lookupError: 0} {
		if n := storedCount(t, rreg, "lookups", result); n != want {
			t.Errorf("look-ups counted as %s: %v, want %v", result, n, want)
		}
	}
}

func TestStoredResponseValuesThatAreNotRecordsAreIgnoredAndCounted(t *testing.T) {
	srv := testredis.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s, reg := newStoredResponses(t, c, StoredResponsesConfig{LookupTimeout: 5 * time.Second})
	ctx := context.Background()
	v, _ := EncodeStoredResponse(testStoredResponse)
	for key, value := range map[string]string{"garbled": "not a record", "long": v + strings.Repeat("m", 1<<20)} {
		if err := c.Set(ctx, StoredResponseKeyPrefix+key, value, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.RPush(ctx, StoredResponseKeyPrefix+"list", "x").Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"garbled", "long", "list"} {
		if r, ok := s.Lookup(id); ok {
			t.Errorf("%s: found %+v", id, r)
		}
	}
	if n := storedCount(t, reg, "lookups", lookupInvalid); n != 3 {
		t.Errorf("invalid look-ups counted: %v, want 3", n)
	}
}

func TestAStoredResponseLookUpEndsWithinItsBoundWhenRedisDoesNotAnswer(t *testing.T) {
	// A listener that accepts connections and never answers, and one
	// closed: look-ups fail, counted, and return within their bound
	// rather than the client's read timeout (3 s).
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mute.Close() })
	go func() {
		for {
			conn, err := mute.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = conn.Close() })
		}
	}()
	stopped := testredis.Start(t)
	stopped.Stop()
	for _, tc := range []struct {
		name, addr, result string
	}{{"no answer", mute.Addr().String(), lookupTimeout}, {"stopped", stopped.Addr, lookupError}} {
		t.Run(tc.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: tc.addr, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			s, reg := newStoredResponses(t, c, StoredResponsesConfig{LookupTimeout: 50 * time.Millisecond})
			start := time.Now()
			if r, ok := s.Lookup("resp_1"); ok {
				t.Fatalf("found %+v", r)
			}
			// Far beyond the bound of 50 ms, to hold on a loaded machine,
			// and below the client's read timeout.
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("the look-up took %v, bounded at 50 ms", d)
			}
			// A refused connection may fail at once, or be retried until
			// the bound.
			failed := storedCount(t, reg, "lookups", lookupTimeout) + storedCount(t, reg, "lookups", lookupError)
			if n := storedCount(t, reg, "lookups", tc.result); n != 1 && (tc.result == lookupTimeout || failed != 1) {
				t.Errorf("look-ups counted as %s: %v, want 1 (timeouts and errors: %v)", tc.result, n, failed)
			}
			if n := testsupport.MetricValue(t, reg, "kvgate_cache_redis_errors_total",
				map[string]string{"operation": opStoredLookup}); n != 1 {
				t.Errorf("Redis errors counted: %v, want 1", n)
			}
		})
	}
}

func TestStoredResponseRecordsBeyondTheQueueAreDroppedAndCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s, err := NewStoredResponses(c, newTestMetrics(t, reg), StoredResponsesConfig{Queue: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Not running: nothing leaves the queue.
	for range 5 {
		s.Record("resp_1", testStoredResponse)
	}
	if n := storedCount(t, reg, "writes", storedDropped); n != 3 {
		t.Errorf("records dropped: %v, want 3 beyond the queue of 2", n)
	}
}

func TestNewStoredResponsesRefusesAClientThatIgnoresDeadlines(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	if _, err := NewStoredResponses(c, newTestMetrics(t, nil), StoredResponsesConfig{}); err == nil {
		t.Error("a client without ContextTimeoutEnabled accepted: its look-ups would wait its read timeout")
	}
	c2 := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c2.Close() })
	if _, err := NewStoredResponses(c2, newTestMetrics(t, nil), StoredResponsesConfig{TTL: 1500 * time.Millisecond}); err == nil {
		t.Error("a TTL of 1.5 s accepted: SET EX takes whole seconds")
	}
}
