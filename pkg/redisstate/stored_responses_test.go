package redisstate

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
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
	// rather than the client's read timeout (3 s), freeing their slot
	// among the look-ups in flight.
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
			s, reg := newStoredResponses(t, c, StoredResponsesConfig{LookupTimeout: 50 * time.Millisecond, MaxLookups: 1})
			// The second look-up finds the slot of the first free: it asks
			// too, rather than being counted as busy.
			const lookups = 2
			for i := range lookups {
				start := time.Now()
				if r, ok := s.Lookup("resp_" + strconv.Itoa(i)); ok {
					t.Fatalf("found %+v", r)
				}
				// Far beyond the bound of 50 ms, to hold on a loaded
				// machine, and below the client's read timeout.
				if d := time.Since(start); d > 2*time.Second {
					t.Errorf("look-up %d took %v, bounded at 50 ms", i, d)
				}
			}
			// A refused connection may fail at once, or be retried until
			// the bound.
			failed := storedCount(t, reg, "lookups", lookupTimeout) + storedCount(t, reg, "lookups", lookupError)
			if n := storedCount(t, reg, "lookups", tc.result); n != lookups && (tc.result == lookupTimeout || failed != lookups) {
				t.Errorf("look-ups counted as %s: %v, want %d (timeouts and errors: %v)", tc.result, n, lookups, failed)
			}
			if n := storedCount(t, reg, "lookups", lookupBusy); n != 0 {
				t.Errorf("look-ups counted as busy: %v, want 0", n)
			}
			if n := testsupport.MetricValue(t, reg, "kvgate_cache_redis_errors_total",
				map[string]string{"operation": opStoredLookup}); n != lookups {
				t.Errorf("Redis errors counted: %v, want %d", n, lookups)
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

// heldReplies is a proxy to a Redis server that passes the commands on at
// once and holds the server's replies until release is called.
type heldReplies struct {
	addr    string
	release func()
}

// holdReplies starts a heldReplies proxy to the server at addr, stopped
// when the test ends.
func holdReplies(t *testing.T, addr string) *heldReplies {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	released, ended := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(ended)
		_ = l.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", addr)
			if err != nil {
				_ = client.Close()
				continue
			}
			wg.Add(3)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(server, client)
			}()
			go func() {
				defer wg.Done()
				select {
				case <-released:
					_, _ = io.Copy(client, server)
				case <-ended:
				}
			}()
			go func() {
				defer wg.Done()
				<-ended
				_ = client.Close()
				_ = server.Close()
			}()
		}
	}()
	return &heldReplies{addr: l.Addr().String(), release: func() { once.Do(func() { close(released) }) }}
}

// newClient returns a client of the server through h, closed when the test
// ends, whose commands and connections' handshakes wait for held replies
// as long as their contexts allow, rather than its dial and read timeouts.
func (h *heldReplies) newClient(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: h.addr, ContextTimeoutEnabled: true, DialTimeout: testsupport.WaitTimeout,
		ReadTimeout: testsupport.WaitTimeout})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// getRangeCalls returns the GETRANGE commands the Redis server of c ran.
func getRangeCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_getrange:calls="); ok {
			calls, _, _ := strings.Cut(rest, ",")
			n, err := strconv.Atoi(calls)
			if err != nil {
				t.Fatalf("commandstats line %q: %v", line, err)
			}
			return n
		}
	}
	return 0
}

// inFlight returns the reads of s in flight, and the look-ups waiting for
// the read of id.
func (s *StoredResponses) inFlight(id string) (reads, waiters int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.lookups[id]; ok {
		waiters = l.waiters
	}
	return len(s.lookups), waiters
}

// lookUp starts a look-up of id by s and returns where its answer arrives.
func lookUp(s *StoredResponses, id string) <-chan StoredResponse {
	answer := make(chan StoredResponse, 1)
	go func() {
		r, _ := s.Lookup(id)
		answer <- r
	}()
	return answer
}

// receive returns the answer of a look-up started by lookUp.
func receive(t *testing.T, answer <-chan StoredResponse) StoredResponse {
	t.Helper()
	select {
	case r := <-answer:
		return r
	case <-time.After(testsupport.WaitTimeout):
		t.Fatal("a look-up did not return")
		return StoredResponse{}
	}
}

// storedBehindHeldReplies starts a Redis server holding the record of
// resp_1, and a StoredResponses of cfg reaching it through a heldReplies
// proxy; it returns a client reaching the server directly, the proxy, the
// StoredResponses and its metrics' registry.
func storedBehindHeldReplies(t *testing.T, cfg StoredResponsesConfig) (*redis.Client, *heldReplies, *StoredResponses,
	*prometheus.Registry) {
	t.Helper()
	srv := testredis.Start(t)
	direct := srv.NewClient(t)
	v, _ := EncodeStoredResponse(testStoredResponse)
	must(t, direct.Set(context.Background(), StoredResponseKeyPrefix+"resp_1", v, 0).Err())
	held := holdReplies(t, srv.Addr)
	s, reg := newStoredResponses(t, held.newClient(t), cfg)
	return direct, held, s, reg
}

func TestStoredResponseLookUpsOfOneIDAtOnceReadRedisOnce(t *testing.T) {
	direct, held, s, reg := storedBehindHeldReplies(t, StoredResponsesConfig{LookupTimeout: testsupport.WaitTimeout})

	const lookups = 8
	answers := []<-chan StoredResponse{lookUp(s, "resp_1")}
	testsupport.Eventually(t, "the first look-up to read", func() bool { reads, _ := s.inFlight("resp_1"); return reads == 1 })
	for range lookups - 1 {
		answers = append(answers, lookUp(s, "resp_1"))
	}
	testsupport.Eventually(t, "the other look-ups to wait for the first's answer", func() bool {
		_, waiters := s.inFlight("resp_1")
		return waiters == lookups-1
	})
	held.release()
	for _, a := range answers {
		if r := receive(t, a); r != testStoredResponse {
			t.Errorf("look-up answered %+v, want %+v", r, testStoredResponse)
		}
	}
	if n := getRangeCalls(t, direct); n != 1 {
		t.Errorf("Redis read %d records, want 1 for %d look-ups of one id at once", n, lookups)
	}
	for result, want := range map[string]float64{lookupHit: 1, lookupCoalesced: lookups - 1, lookupBusy: 0} {
		if n := storedCount(t, reg, "lookups", result); n != want {
			t.Errorf("look-ups counted as %s: %v, want %v", result, n, want)
		}
	}
	// Once answered, a look-up of the id reads again.
	if r, ok := s.Lookup("resp_1"); !ok || r != testStoredResponse {
		t.Errorf("look-up after the others: %+v, %v", r, ok)
	}
	if n := getRangeCalls(t, direct); n != 2 {
		t.Errorf("Redis read %d records, want 2", n)
	}
}

func TestStoredResponseLookUpsBeyondTheBoundDoNotAskRedis(t *testing.T) {
	direct, held, s, reg := storedBehindHeldReplies(t, StoredResponsesConfig{LookupTimeout: testsupport.WaitTimeout,
		MaxLookups: 2})

	first, second := lookUp(s, "resp_1"), lookUp(s, "resp_2")
	testsupport.Eventually(t, "two look-ups to read", func() bool { reads, _ := s.inFlight("resp_1"); return reads == 2 })
	// The bound reached, a look-up of a third id returns at once, while
	// the two wait for Redis.
	if r, ok := s.Lookup("resp_3"); ok {
		t.Errorf("a look-up beyond the bound found %+v", r)
	}
	if n := storedCount(t, reg, "lookups", lookupBusy); n != 1 {
		t.Errorf("look-ups counted as busy: %v, want 1", n)
	}
	// A look-up of an id in flight waits for its answer: it does not
	// count against the bound.
	coalesced := lookUp(s, "resp_1")
	testsupport.Eventually(t, "a look-up to wait for the first's answer", func() bool {
		_, waiters := s.inFlight("resp_1")
		return waiters == 1
	})
	held.release()
	for _, a := range []<-chan StoredResponse{first, coalesced} {
		if r := receive(t, a); r != testStoredResponse {
			t.Errorf("look-up of resp_1 answered %+v, want %+v", r, testStoredResponse)
		}
	}
	if r := receive(t, second); r != (StoredResponse{}) {
		t.Errorf("look-up of resp_2 answered %+v, want none", r)
	}
	// The reads done, their slots are free.
	if r, ok := s.Lookup("resp_1"); !ok || r != testStoredResponse {
		t.Errorf("look-up once the others returned: %+v, %v", r, ok)
	}
	for result, want := range map[string]float64{lookupHit: 2, lookupMiss: 1, lookupCoalesced: 1, lookupBusy: 1} {
		if n := storedCount(t, reg, "lookups", result); n != want {
			t.Errorf("look-ups counted as %s: %v, want %v", result, n, want)
		}
	}
	if n := getRangeCalls(t, direct); n != 3 {
		t.Errorf("Redis read %d records, want 3", n)
	}
}
