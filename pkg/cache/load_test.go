package cache

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
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

// newTestLedger returns a request ledger.
func newTestLedger(t testing.TB) *inflight.Ledger {
	t.Helper()
	l, err := inflight.New(inflight.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// routeTo admits request id for model and routes it to the registered pod
// of key, with pendingLoad.
func routeTo(t testing.TB, s *Store, l *inflight.Ledger, id, model string, key endpoint.Key, pendingLoad float64) *inflight.Handle {
	t.Helper()
	load := s.PodLoad(key)
	if load == nil {
		t.Fatalf("%s is not registered", key)
	}
	return l.Admit(id, model).Route(inflight.Route{Pod: load, PendingLoad: pendingLoad})
}

func TestRealtimeMetricsFollowTheRequestsRoutedToThePod(t *testing.T) {
	s := newTestStore(t, noScrape())
	l := newTestLedger(t)
	a, b := testPod("ns", "a", "m", "10.0.0.1"), testPod("ns", "b", "m", "10.0.0.2")
	s.AddOrUpdatePod(a)
	s.AddOrUpdatePod(b)

	h := routeTo(t, s, l, "r1", "m", pkey("ns", "a"), 0.25)
	if running(t, s, "a") != 1 || runningForModel(t, s, "a", "m") != 1 || running(t, s, "b") != 0 {
		t.Fatalf("after routing to a: a=%v b=%v", running(t, s, "a"), running(t, s, "b"))
	}
	if v, _ := s.GetMetricValueByPod(pkey("ns", "a"), RealtimeNormalizedPendings); v.Value != 0.25 {
		t.Fatalf("pending load of a = %v, want 0.25", v.Value)
	}
	// A retry on another pod moves the request.
	h.Close(inflight.Failed, "connection_refused")
	h = h.Request().Route(inflight.Route{Pod: s.PodLoad(pkey("ns", "b"))})
	if running(t, s, "a") != 0 || running(t, s, "b") != 1 {
		t.Fatalf("after rerouting to b: a=%v b=%v", running(t, s, "a"), running(t, s, "b"))
	}
	h.Close(inflight.Done, "")
	h.Request().End()
	if running(t, s, "b") != 0 {
		t.Fatalf("after done: b=%v", running(t, s, "b"))
	}
}

func TestRequestCountsPerPodAndModel(t *testing.T) {
	s := newTestStore(t, noScrape())
	l := newTestLedger(t)
	pod := testPod("ns", "p", "base", "10.0.0.1")
	s.AddOrUpdatePod(pod)
	if err := s.SetPodAdapters(pkey("ns", "p"), []string{"lora"}); err != nil {
		t.Fatal(err)
	}
	var hs []*inflight.Handle
	for i, model := range []string{"base", "lora", "lora"} {
		hs = append(hs, routeTo(t, s, l, fmt.Sprint("r", i), model, pkey("ns", "p"), 0))
	}
	if running(t, s, "p") != 3 || runningForModel(t, s, "p", "base") != 1 || runningForModel(t, s, "p", "lora") != 2 {
		t.Fatalf("pod %v base %v lora %v, want 3, 1, 2", running(t, s, "p"), runningForModel(t, s, "p", "base"), runningForModel(t, s, "p", "lora"))
	}
	hs[1].Close(inflight.Done, "")
	if runningForModel(t, s, "p", "lora") != 1 {
		t.Fatalf("lora after one completion = %v, want 1", runningForModel(t, s, "p", "lora"))
	}
}

func TestARequestRoutedToAPodThatLeftCountsOnNoRegisteredPod(t *testing.T) {
	s := newTestStore(t, noScrape())
	l := newTestLedger(t)
	s.AddOrUpdatePod(testPod("ns", "ghost", "m", "10.0.0.9"))
	load := s.PodLoad(pkey("ns", "ghost"))
	s.DeletePod(pkey("ns", "ghost"))
	if s.PodLoad(pkey("ns", "ghost")) != nil {
		t.Fatal("a deleted pod has a load record")
	}
	h := l.Admit("r", "m").Route(inflight.Route{Pod: load})
	s.AddOrUpdatePod(testPod("ns", "ghost", "m", "10.0.0.9", withUID("back")))
	if running(t, s, "ghost") != 0 {
		t.Fatalf("the pod back under the same name counts %v requests, want 0", running(t, s, "ghost"))
	}
	h.Close(inflight.Done, "")
}

func TestPodReplacedWhileRequestsRunStartsAtZero(t *testing.T) {
	s := newTestStore(t, noScrape())
	l := newTestLedger(t)
	old := testPod("ns", "p", "m", "10.0.0.1")
	s.AddOrUpdatePod(old)
	h := routeTo(t, s, l, "r", "m", pkey("ns", "p"), 0)
	s.AddOrUpdatePod(testPod("ns", "p", "m", "10.0.0.2", withUID("restarted")))
	if n := running(t, s, "p"); n != 0 {
		t.Fatalf("replacement pod starts with %v running", n)
	}
	h2 := routeTo(t, s, l, "r2", "m", pkey("ns", "p"), 0)
	h.Close(inflight.Done, "") // the old pod's request ends
	if n := running(t, s, "p"); n != 1 {
		t.Fatalf("running = %v, want 1: the old pod's completion must not touch the new pod", n)
	}
	h2.Close(inflight.Done, "")
}

func TestOutputPredictorsLearnFromCompletedRequests(t *testing.T) {
	s := newTestStore(t, noScrape())
	l := newTestLedger(t)
	preds, err := NewOutputPredictors(s, PredictorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	l.Observe(preds.Observer())
	s.AddOrUpdatePod(testPod("ns", "p", "m", "10.0.0.1"))
	for i := range 20 {
		h := routeTo(t, s, l, fmt.Sprint(i), "m", pkey("ns", "p"), 0)
		h.ReportUsage(inflight.Usage{PromptTokens: 1000, CompletionTokens: 256})
		h.Close(inflight.Done, "")
	}
	// A failed attempt's usage teaches nothing.
	h := routeTo(t, s, l, "failed", "m", pkey("ns", "p"), 0)
	h.ReportUsage(inflight.Usage{PromptTokens: 1000, CompletionTokens: 1})
	h.Close(inflight.Failed, "body")
	p, err := preds.GetOutputPredictor("m")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Predict(1000); got != 256 {
		t.Fatalf("Predict(1000) = %d, want 256: every completed request had 256 output tokens", got)
	}
	if _, err := preds.GetOutputPredictor("unknown"); err == nil {
		t.Fatal("predictor for a model no pod serves")
	}
}

func BenchmarkGetMetricValueByPod(b *testing.B) {
	s := newTestStore(b, noScrape())
	s.AddOrUpdatePod(testPod("ns", "p", "m", "10.0.0.1"))
	fam := parseExposition(b, "vllm_v1_t0.txt")
	e := s.reg.entry(pkey("ns", "p"))
	e.state.metrics.Store(projectedOnce(time.Now(), fam, "m"))
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
