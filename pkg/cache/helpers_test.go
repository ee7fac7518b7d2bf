package cache

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/endpoint"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
)

// podOpt adjusts a test pod.
type podOpt func(*v1.Pod)

// testPod returns a Running, Ready pod serving model at ip.
func testPod(namespace, name, model, ip string, opts ...podOpt) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name, UID: k8stypes.UID(namespace + "-" + name + "-uid"),
			Labels: map[string]string{},
		},
		Status: v1.PodStatus{
			Phase: v1.PodRunning, PodIP: ip,
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}},
		},
	}
	if model != "" {
		p.Labels[endpoint.ModelNameLabel] = model
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func withLabel(k, v string) podOpt { return func(p *v1.Pod) { p.Labels[k] = v } }

func withAnnotation(k, v string) podOpt {
	return func(p *v1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[k] = v
	}
}

func withPort(port int) podOpt { return withLabel(endpoint.ModelPortLabel, strconv.Itoa(port)) }

func withUID(uid string) podOpt { return func(p *v1.Pod) { p.UID = k8stypes.UID(uid) } }

func notReady(p *v1.Pod) { p.Status.Conditions[0].Status = v1.ConditionFalse }

// newTestStore returns a running Store, stopped when the test ends.
func newTestStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	stop := runStore(s)
	t.Cleanup(stop)
	return s
}

// runStore runs s until the returned function is called, which returns
// once Run has.
func runStore(s *Store) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// noScrape is a Config that reads nothing from pods: no metric scraping, no
// adapter listing.
func noScrape() Config { return Config{PodMetricRefreshInterval: -1, AdapterRefreshInterval: -1} }

func describe(v MetricValue, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("value %v stale %v", v.Value, v.Stale)
}

// pkey returns the key of pod namespace/name.
func pkey(namespace, name string) endpoint.Key { return endpoint.Key{Namespace: namespace, Name: name} }

// epOf parses pod as the Store does by default.
func epOf(pod *v1.Pod) *endpoint.Endpoint { return endpoint.Parse(pod, endpoint.Options{}) }

// projectedOnce returns what a pod's first scrape publishes when its page
// parses to families and the pod serves served.
func projectedOnce(at time.Time, families map[string]*dto.MetricFamily, served ...string) *podMetrics {
	m, _ := newProjector(time.Second, time.Second).project(at, families, nil, served)
	return m
}
