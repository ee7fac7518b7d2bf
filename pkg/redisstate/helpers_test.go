package redisstate

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
)

// newTestMetrics returns the metrics, registered on reg when it is not nil.
func newTestMetrics(t testing.TB, reg prometheus.Registerer) *Metrics {
	t.Helper()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m
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

// newTestStore returns a Store reading nothing from its pods, holding pods
// p and q of model m.
func newTestStore(t testing.TB) *cache.Store {
	t.Helper()
	return storeWithPods(t, "p", "q")
}

// storeWithPods returns a Store reading nothing from its pods, holding the
// pods of names in namespace ns, serving model m.
func storeWithPods(t testing.TB, names ...string) *cache.Store {
	t.Helper()
	s, err := cache.New(cache.Config{PodMetricRefreshInterval: -1, AdapterRefreshInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		addPod(s, name)
	}
	return s
}

// addPod registers with s the ready pod name in namespace ns, serving
// model m.
func addPod(s *cache.Store, name string) {
	s.AddOrUpdatePod(&v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: k8stypes.UID("uid-" + name),
			Labels: map[string]string{endpoint.ModelNameLabel: "m"}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.0.0.1",
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
	})
}

// run runs component until the returned function is called, which returns
// once Run has; it is also called when the test ends.
func run(t testing.TB, component interface{ Run(context.Context) error }) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- component.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// admit admits request id of model to l and routes it to a pod of its own.
func admit(l *inflight.Ledger, id, model string) *inflight.Handle {
	return l.Admit(id, model).Route(inflight.Route{Pod: inflight.NewPodLoad("ns/p")})
}

// complete admits request id of model to l, routes it, and closes its
// attempt as done with the given usage.
func complete(l *inflight.Ledger, id, model string, prompt, completion int64) {
	h := admit(l, id, model)
	h.ReportUsage(inflight.Usage{PromptTokens: prompt, CompletionTokens: completion})
	h.Close(inflight.Done, "")
	h.Request().End()
}

// must fails t with err, unless nil.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// byReason returns the value of counter name's series for reason in reg.
func byReason(t testing.TB, reg prometheus.Gatherer, name, reason string) float64 {
	t.Helper()
	return testsupport.MetricValue(t, reg, name, map[string]string{"reason": reason})
}
