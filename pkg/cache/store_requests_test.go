package cache

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/types"
)

func running(t *testing.T, s *Store, pod string) float64 {
	t.Helper()
	v, err := s.GetMetricValueByPod(pkey("ns", pod), RealtimeNumRequestsRunning)
	if err != nil {
		t.Fatal(err)
	}
	return v.Value
}

func runningForModel(t *testing.T, s *Store, pod, model string) float64 {
	t.Helper()
	v, err := s.GetMetricValueByPodModel(pkey("ns", pod), model, RealtimeNumRequestsRunning)
	if err != nil {
		t.Fatal(err)
	}
	return v.Value
}

func routed(id, model string, pod *v1.Pod) *types.RoutingContext {
	ctx := types.NewRoutingContext(id, model)
	if pod != nil {
		ctx.SetTargetPod(pod)
	}
	return ctx
}

func TestAddRequestCountIsIdempotentAndFollowsRouting(t *testing.T) {
	s := newTestStore(t, nil, noScrape())
	a, b := testPod("ns", "a", "m", "10.0.0.1"), testPod("ns", "b", "m", "10.0.0.2")
	s.AddOrUpdatePod(a)
	s.AddOrUpdatePod(b)

	ctx := routed("r1", "m", nil)
	term := s.AddRequestCount(ctx, "r1", "m")
	if got := s.requests.model("m"); got.pending != 1 || got.routed != 0 {
		t.Fatalf("before routing: %+v, want 1 pending, 0 routed", got)
	}
	ctx.SetTargetPod(a)
	for range 3 {
		if again := s.AddRequestCount(ctx, "r1", "m"); again != term {
			t.Fatalf("term changed from %d to %d on a repeated add", term, again)
		}
	}
	if running(t, s, "a") != 1 || runningForModel(t, s, "a", "m") != 1 || running(t, s, "b") != 0 {
		t.Fatalf("after routing to a: a=%v b=%v", running(t, s, "a"), running(t, s, "b"))
	}
	// A retry on another pod moves the request.
	ctx.SetTargetPod(b)
	s.AddRequestCount(ctx, "r1", "m")
	if running(t, s, "a") != 0 || running(t, s, "b") != 1 {
		t.Fatalf("after rerouting to b: a=%v b=%v", running(t, s, "a"), running(t, s, "b"))
	}
	if got := s.requests.model("m"); got.pending != 1 || got.routed != 1 {
		t.Fatalf("model counts %+v, want 1 pending, 1 routed", got)
	}

	s.DoneRequestCount(ctx, "r1", "m", term)
	if running(t, s, "b") != 0 || s.requests.model("m") != (modelLoad{}) || s.requests.size.Load() != 0 {
		t.Fatalf("after done: b=%v model=%+v tracked=%d", running(t, s, "b"), s.requests.model("m"), s.requests.size.Load())
	}
}

func TestLateOrDuplicateDoneDoesNotCorruptCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := noScrape()
	cfg.Registerer = reg
	s := newTestStore(t, nil, cfg)
	pod := testPod("ns", "p", "m", "10.0.0.1")
	s.AddOrUpdatePod(pod)

	oldTerm := s.AddRequestCount(routed("r1", "m", pod), "r1", "m")
	s.DoneRequestCount(nil, "r1", "m", oldTerm)
	// The client retries with the same request id: a new term.
	newTerm := s.AddRequestCount(routed("r1", "m", pod), "r1", "m")
	if newTerm == oldTerm {
		t.Fatalf("retry got the old term %d", oldTerm)
	}
	s.DoneRequestCount(nil, "r1", "m", oldTerm) // late duplicate of the first completion
	s.DoneRequestTrace(nil, "r1", "m", 10, 10, oldTerm)
	if got := running(t, s, "p"); got != 1 {
		t.Fatalf("running after a stale completion = %v, want 1", got)
	}
	s.DoneRequestCount(nil, "r1", "m", newTerm)
	s.DoneRequestCount(nil, "r1", "m", newTerm) // duplicate
	if got := running(t, s, "p"); got != 0 {
		t.Fatalf("running after completion = %v, want 0", got)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_request_done_ignored_total", map[string]string{"reason": "stale_term"}); n != 2 {
		t.Fatalf("stale-term completions = %v, want 2", n)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_request_done_ignored_total", map[string]string{"reason": "unknown"}); n != 1 {
		t.Fatalf("unknown completions = %v, want 1", n)
	}
}

func TestRequestCountsPerPodAndModel(t *testing.T) {
	s := newTestStore(t, nil, noScrape())
	pod := testPod("ns", "p", "base", "10.0.0.1")
	s.AddOrUpdatePod(pod)
	if err := s.SetPodAdapters(pkey("ns", "p"), []string{"lora"}); err != nil {
		t.Fatal(err)
	}
	terms := map[string]int64{}
	for i, model := range []string{"base", "lora", "lora"} {
		id := fmt.Sprint("r", i)
		terms[id] = s.AddRequestCount(routed(id, model, pod), id, model)
	}
	if running(t, s, "p") != 3 || runningForModel(t, s, "p", "base") != 1 || runningForModel(t, s, "p", "lora") != 2 {
		t.Fatalf("pod %v base %v lora %v, want 3, 1, 2", running(t, s, "p"), runningForModel(t, s, "p", "base"), runningForModel(t, s, "p", "lora"))
	}
	s.DoneRequestCount(nil, "r1", "lora", terms["r1"])
	if runningForModel(t, s, "p", "lora") != 1 {
		t.Fatalf("lora after one completion = %v, want 1", runningForModel(t, s, "p", "lora"))
	}
}

func TestRequestsRoutedToUnknownPodCountOnlyForTheModel(t *testing.T) {
	s := newTestStore(t, nil, noScrape())
	ghost := testPod("ns", "ghost", "m", "10.0.0.9")
	term := s.AddRequestCount(routed("r", "m", ghost), "r", "m")
	if got := s.requests.model("m"); got.pending != 1 || got.routed != 0 {
		t.Fatalf("model counts %+v, want 1 pending, 0 routed", got)
	}
	s.DoneRequestCount(nil, "r", "m", term)
	if got := s.requests.model("m"); got != (modelLoad{}) {
		t.Fatalf("model counts after done %+v, want none", got)
	}
}

func TestRequestWithoutCompletionExpires(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := noScrape()
	cfg.RequestTTL = 100 * time.Millisecond
	cfg.Registerer = reg
	s := newTestStore(t, nil, cfg)
	pod := testPod("ns", "p", "m", "10.0.0.1")
	s.AddOrUpdatePod(pod)
	term := s.AddRequestCount(routed("lost", "m", pod), "lost", "m")
	testsupport.EventuallyWhy(t, "the lost request to expire", func() (string, bool) {
		n := running(t, s, "p")
		return fmt.Sprint("running ", n), n == 0
	})
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_requests_expired_total", nil); n != 1 {
		t.Fatalf("expired = %v, want 1", n)
	}
	s.DoneRequestCount(nil, "lost", "m", term) // arrives after expiry: ignored
	if n := running(t, s, "p"); n != 0 {
		t.Fatalf("running after a completion of an expired request = %v", n)
	}
}

func TestPodReplacedWhileRequestsRunStartsAtZero(t *testing.T) {
	s := newTestStore(t, nil, noScrape())
	old := testPod("ns", "p", "m", "10.0.0.1")
	s.AddOrUpdatePod(old)
	term := s.AddRequestCount(routed("r", "m", old), "r", "m")
	s.AddOrUpdatePod(testPod("ns", "p", "m", "10.0.0.2", withUID("restarted")))
	if n := running(t, s, "p"); n != 0 {
		t.Fatalf("replacement pod starts with %v running", n)
	}
	term2 := s.AddRequestCount(routed("r2", "m", old), "r2", "m")
	s.DoneRequestCount(nil, "r", "m", term) // the old pod's request ends
	if n := running(t, s, "p"); n != 1 {
		t.Fatalf("running = %v, want 1: the old pod's completion must not touch the new pod", n)
	}
	s.DoneRequestCount(nil, "r2", "m", term2)
}

func TestConcurrentRequestsBalanceToZero(t *testing.T) {
	s := newTestStore(t, nil, noScrape())
	pods := []*v1.Pod{testPod("ns", "a", "m", "10.0.0.1"), testPod("ns", "b", "m", "10.0.0.2")}
	for _, p := range pods {
		s.AddOrUpdatePod(p)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				id := fmt.Sprintf("w%d-%d", w, i)
				ctx := routed(id, "m", nil)
				term := s.AddRequestCount(ctx, id, "m")
				ctx.SetTargetPod(pods[i%2])
				s.AddRequestCount(ctx, id, "m")
				if i%3 == 0 {
					ctx.SetTargetPod(pods[(i+1)%2])
					s.AddRequestCount(ctx, id, "m")
				}
				if i%2 == 0 {
					s.DoneRequestTrace(ctx, id, "m", 100, 10, term)
				} else {
					s.DoneRequestCount(ctx, id, "m", term)
				}
				s.DoneRequestCount(ctx, id, "m", term)
			}
		}()
	}
	wg.Wait()
	if running(t, s, "a") != 0 || running(t, s, "b") != 0 || s.requests.size.Load() != 0 || len(s.requests.modelsWithPending()) != 0 {
		t.Fatalf("counts left: a=%v b=%v tracked=%d models=%v", running(t, s, "a"), running(t, s, "b"),
			s.requests.size.Load(), s.requests.modelsWithPending())
	}
}

func TestDoneRequestTraceFeedsTheModelPredictor(t *testing.T) {
	s := newTestStore(t, nil, noScrape())
	pod := testPod("ns", "p", "m", "10.0.0.1")
	s.AddOrUpdatePod(pod)
	for i := range 20 {
		id := fmt.Sprint(i)
		term := s.AddRequestCount(routed(id, "m", pod), id, "m")
		s.DoneRequestTrace(nil, id, "m", 1000, 256, term)
	}
	p, err := s.GetOutputPredictor("m")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Predict(1000); got != 256 {
		t.Fatalf("Predict(1000) = %d, want 256: every completed request had 256 output tokens", got)
	}
	if _, err := s.GetOutputPredictor("unknown"); err == nil {
		t.Fatal("predictor for a model no pod serves")
	}
}

func BenchmarkAddDoneRequest(b *testing.B) {
	s := newTestStore(b, nil, noScrape())
	pods := make([]*v1.Pod, 8)
	for i := range pods {
		pods[i] = testPod("ns", fmt.Sprint("p", i), "m", "10.0.0.1")
		s.AddOrUpdatePod(pods[i])
	}
	var worker atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := worker.Add(1)
		ctxs := make([]*types.RoutingContext, 64)
		for i := range ctxs {
			id := fmt.Sprintf("w%d-%d", w, i)
			ctxs[i] = routed(id, "m", pods[i%len(pods)])
		}
		for i := 0; pb.Next(); i++ {
			ctx := ctxs[i%len(ctxs)]
			term := s.AddRequestCount(ctx, ctx.RequestID, "m")
			s.DoneRequestTrace(ctx, ctx.RequestID, "m", 512, 128, term)
		}
	})
}

func BenchmarkGetMetricValueByPod(b *testing.B) {
	s := newTestStore(b, nil, noScrape())
	s.AddOrUpdatePod(testPod("ns", "p", "m", "10.0.0.1"))
	fam := parseExposition(b, "vllm_v1_t0.txt")
	e := s.reg.entry(pkey("ns", "p"))
	e.state.metrics.Store(newProjector(time.Second, time.Second).project(time.Now(), fam, nil))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.GetMetricValueByPod(pkey("ns", "p"), KVCacheUsagePerc); err != nil {
				b.Fatal(err)
			}
			if _, err := s.GetMetricValueByPod(pkey("ns", "p"), RealtimeNumRequestsRunning); err != nil {
				b.Fatal(err)
			}
		}
	})
}
