package routing

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

// engineState is what a fake vLLM engine reports on /metrics.
type engineState struct {
	running, waiting, kvUsage float64
	// promptTokens were computed in prefillSeconds of prefill, which
	// include a step of tpotSeconds per prefill: tokens per second of
	// prefill less those steps is the engine's prefill speed.
	promptTokens, prefillSeconds, prefills float64
	tpotSeconds                            float64
}

// exposition renders s in vLLM's Prometheus text format for model.
func (s engineState) exposition(model string) string {
	var b strings.Builder
	labels := fmt.Sprintf(`engine="0",model_name=%q`, model)
	gauge := func(name string, v float64) {
		fmt.Fprintf(&b, "# TYPE %s gauge\n%s{%s} %v\n", name, name, labels, v)
	}
	counter := func(name string, v float64) {
		fmt.Fprintf(&b, "# TYPE %s counter\n%s{%s} %v\n", name, name, labels, v)
	}
	histogram := func(name string, sum, count float64) {
		fmt.Fprintf(&b, "# TYPE %s histogram\n%s_bucket{%s,le=\"+Inf\"} %v\n%s_sum{%s} %v\n%s_count{%s} %v\n",
			name, name, labels, count, name, labels, sum, name, labels, count)
	}
	gauge("vllm:num_requests_running", s.running)
	gauge("vllm:num_requests_waiting", s.waiting)
	gauge("vllm:kv_cache_usage_perc", s.kvUsage)
	counter("vllm:prompt_tokens_total", s.promptTokens)
	counter("vllm:prefix_cache_hits_total", 0)
	counter("vllm:prefix_cache_queries_total", s.promptTokens)
	histogram("vllm:request_prefill_time_seconds", s.prefillSeconds, s.prefills)
	histogram("vllm:inter_token_latency_seconds", s.tpotSeconds*100, 100)
	fmt.Fprintf(&b, "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"%d\",num_gpu_blocks=\"4096\"} 1\n", testBlockSize)
	return b.String()
}

// fakeEngine serves an engineState on /metrics.
type fakeEngine struct {
	mu    sync.Mutex
	state engineState
	srv   *httptest.Server
}

func (e *fakeEngine) set(f func(*engineState)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(&e.state)
}

// storeFleet is a real Store scraping n fake engines, pods p0..p<n-1>.
type storeFleet struct {
	store   *cache.Store
	engines []*fakeEngine
}

// newStoreFleet starts n engines prefilling 10,000 tokens per second with a
// 20 ms inter-token latency, and a Store scraping them every 20 ms.
func newStoreFleet(t testing.TB, n int) *storeFleet {
	t.Helper()
	return newStoreFleetScraping(t, n, 20*time.Millisecond)
}

// newStoreFleetScraping is newStoreFleet with a Store scraping every
// interval.
func newStoreFleetScraping(t testing.TB, n int, interval time.Duration) *storeFleet {
	t.Helper()
	s, err := cache.New(cache.Config{PodMetricRefreshInterval: interval, AdapterRefreshInterval: -1})
	if err != nil {
		t.Fatalf("cache.New: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		<-done
	})
	f := &storeFleet{store: s}
	for i := range n {
		e := &fakeEngine{state: engineState{promptTokens: 20000, prefillSeconds: 2 + 10*0.02, prefills: 10, tpotSeconds: 0.02}}
		e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			e.mu.Lock()
			defer e.mu.Unlock()
			fmt.Fprint(w, e.state.exposition(testModel))
		}))
		t.Cleanup(e.srv.Close)
		_, port, _ := net.SplitHostPort(e.srv.Listener.Addr().String())
		p, _ := strconv.Atoi(port)
		s.AddOrUpdatePod(testPod(fmt.Sprintf("p%d", i), "127.0.0.1", p))
		f.engines = append(f.engines, e)
	}
	f.waitFor(t, func(pod string) (string, bool) {
		v, err := s.GetMetricValueByPod(endpoint.Key{Namespace: testNamespace, Name: pod}, cache.PrefillTokensPerSecond)
		return fmt.Sprintf("speed %v, %v", v.Value, err), err == nil && v.Value == 10000
	})
	return f
}

// pods returns the Store's routable pods of testModel.
func (f *storeFleet) pods(t testing.TB) []*endpoint.Endpoint {
	t.Helper()
	pods, err := f.store.ListPodsByModel(testModel)
	if err != nil || len(pods) != len(f.engines) {
		t.Fatalf("ListPodsByModel = %d pods, %v; want %d", len(pods), err, len(f.engines))
	}
	return pods
}

// waitFor waits until ok holds for every pod.
func (f *storeFleet) waitFor(t testing.TB, ok func(pod string) (string, bool)) {
	t.Helper()
	testsupport.EventuallyWhy(t, "the Store to catch up with every pod", func() (string, bool) {
		for i := range f.engines {
			pod := fmt.Sprintf("p%d", i)
			if why, good := ok(pod); !good {
				return pod + ": " + why, false
			}
		}
		return "", true
	})
}

// waitForMetric waits until the Store reports metric v for pod.
func (f *storeFleet) waitForMetric(t testing.TB, pod, metric string, want float64) {
	t.Helper()
	f.waitFor(t, func(p string) (string, bool) {
		if p != pod {
			return "", true
		}
		v, err := f.store.GetMetricValueByPod(endpoint.Key{Namespace: testNamespace, Name: pod}, metric)
		return fmt.Sprintf("%s = %v, %v", metric, v.Value, err), err == nil && v.Value == want
	})
}

func TestKVAwareWithTheStoreAndIndexFollowsScrapedQueues(t *testing.T) {
	fleet := newStoreFleet(t, 4)
	idx := newTestIndex(t)
	p := prompt(0, 2048)
	holds(t, idx, "p2", p[:1536], kvevent.MediumGPU)
	r, _ := newTestRouter(t, fleet.store, idx)

	d := route(t, r, request("r1", KVAware, p), fleet.pods(t))
	if d.PodKey != key("p2") || d.Outcome != OutcomePrefixHit || d.Chosen().SpeedSource != SpeedMeasured {
		t.Fatalf("chose %s (%s) with %+v, want p2 (prefix_hit) at its measured speed", d.PodKey, d.Outcome, d.Chosen())
	}

	fleet.engines[2].set(func(s *engineState) { s.waiting = 3 })
	fleet.waitForMetric(t, "p2", cache.NumRequestsWaiting, 3)
	d = route(t, r, request("r2", KVAware, p), fleet.pods(t))
	if d.PodKey == key("p2") || d.Outcome != OutcomeLoadOverPrefix {
		t.Fatalf("with 3 requests waiting on p2 the request went to %s (%s); p2 %+v", d.PodKey, d.Outcome, candidate(t, d, "p2"))
	}
}

func TestPrefixCacheWithTheStoreCountsTheGatewaysRequests(t *testing.T) {
	fleet := newStoreFleet(t, 4)
	idx := newTestIndex(t)
	p := prompt(0, 2048)
	holds(t, idx, "p1", p, kvevent.MediumGPU)
	r, _ := newTestRouter(t, fleet.store, idx)
	pods := fleet.pods(t)

	// Nine requests in flight on p1, as the gateway tracks them, put it
	// more than 8 above the idle pods.
	ledger, err := inflight.New(inflight.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var busy []*inflight.Handle
	for i := range 9 {
		req := ledger.Admit(fmt.Sprint("busy", i), testModel)
		busy = append(busy, req.Route(inflight.Route{Pod: fleet.store.PodLoad(pods[1].Key), Endpoint: pods[1]}))
	}
	d := route(t, r, request("r1", PrefixCache, p), pods)
	if d.Outcome != OutcomeImbalanceGuard || d.PodKey == key("p1") || candidate(t, d, "p1").Running != 9 {
		t.Fatalf("chose %s (%s), p1 %+v; want the guard to send the request to an idle pod", d.PodKey, d.Outcome, candidate(t, d, "p1"))
	}

	for _, h := range busy {
		h.Close(inflight.Done, "")
	}
	if d := route(t, r, request("r2", PrefixCache, p), pods); d.PodKey != key("p1") || d.Outcome != OutcomePrefixHit {
		t.Fatalf("with p1 idle again the request went to %s (%s), want p1 (prefix_hit)", d.PodKey, d.Outcome)
	}
}

func TestLoadAlgorithmsWithTheStore(t *testing.T) {
	fleet := newStoreFleet(t, 3)
	usage := []float64{0.7, 0.6, 0.2}
	for i, e := range fleet.engines {
		e.set(func(s *engineState) { s.kvUsage = usage[i] })
	}
	for i := range fleet.engines {
		fleet.waitForMetric(t, fmt.Sprintf("p%d", i), cache.KVCacheUsagePerc, usage[i])
	}
	r, _ := newTestRouter(t, fleet.store, nil)
	pods := fleet.pods(t)

	if d := route(t, r, request("r1", LeastKVCache, nil), pods); d.PodKey != key("p2") {
		t.Fatalf("least-kv-cache chose %s, want p2 at 20%% usage", d.PodKey)
	}
	// Requests routed by least-request count at once for the next one.
	seen := map[string]bool{}
	for i := range 3 {
		ctx := request(fmt.Sprint("r", i), LeastRequest, nil)
		d := route(t, r, ctx, pods)
		startPrefill(r, d)
		seen[d.PodKey] = true
	}
	if len(seen) != 3 {
		t.Fatalf("three least-request decisions used pods %v, want all three", seen)
	}
}
