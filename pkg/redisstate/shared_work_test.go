package redisstate

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/types"
)

var podP = endpoint.Key{Namespace: "ns", Name: "p"}

func TestReplicasSeeEachOthersPendingLoadAndQueuedPrefills(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	a, _, _ := sharedStore(t, rc, "gw-a")
	b, lb, _ := sharedStore(t, rc, "gw-b")
	var hs []*inflight.Handle
	for i := range 2 {
		hs = append(hs, lb.Admit(fmt.Sprint("b", i), "m").Route(inflight.Route{Pod: b.PodLoad(podP),
			PendingLoad: 0.3, PrefillSeconds: 30}))
	}
	p := a.PodLoad(podP)
	testsupport.EventuallyWhy(t, "replica a sees b's pending load and prefills on p", func() (string, bool) {
		q := p.Queue(time.Now(), time.Time{}, 0)
		why := fmt.Sprintf("pending %v, queue %v s", p.PendingLoad(), q.Seconds)
		return why, math.Abs(p.PendingLoad()-0.6) < 1e-9 && q.Seconds > 50 && q.Seconds <= 60 && q.Prefills == 0
	})
	for _, h := range hs {
		h.Close(inflight.Done, "")
	}
	testsupport.EventuallyWhy(t, "b's work on p stops counting once closed", func() (string, bool) {
		q := p.Queue(time.Now(), time.Time{}, 0)
		return fmt.Sprintf("pending %v, queue %v s", p.PendingLoad(), q.Seconds), p.PendingLoad() == 0 && q.Seconds == 0
	})
}

func TestReplicasDoNotAdmitIntoCapacityAnotherTook(t *testing.T) {
	// Both replicas route model m on pods p and q of one deployment whose
	// profile gives each request half a pod. Replica b fills p; replica a,
	// asked next, must see p full and take q.
	rc := testredis.Start(t).NewClient(t)
	profiles, err := cache.NewProfiles(endpoint.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	profiles.UpdateModelProfile(cache.ModelGPUProfileKey("m", "dep"), &cache.ModelGPUProfile{
		Indexes: [][]float64{{1}, {1}}, Tputs: [][]float64{{2}}, E2E: [][]float64{{1}}}, true)
	a, _, _ := sharedStore(t, rc, "gw-a")
	b, lb, _ := sharedStore(t, rc, "gw-b")
	for _, s := range []*cache.Store{a, b} {
		for _, ep := range s.ListPods() {
			pod := ep.Pod.DeepCopy()
			pod.Labels[endpoint.DefaultDeploymentLabel] = "dep"
			s.AddOrUpdatePod(pod)
		}
	}
	load := cache.NewPendingLoadProvider(b, profiles)
	rcB := sloRequest()
	for range 2 {
		ep, _ := b.GetPod(podP)
		consumption, err := load.RequestLoad(rcB, ep)
		if err != nil || consumption != 0.5 {
			t.Fatalf("request load %v, %v; want 0.5", consumption, err)
		}
		lb.Admit("b", "m").Route(inflight.Route{Pod: b.PodLoad(podP), Endpoint: ep, PendingLoad: consumption})
	}
	testsupport.Eventually(t, "replica a sees p full", func() bool { return a.PodLoad(podP).PendingLoad() == 1 })

	r, err := routing.New(routing.Config{Profiles: profiles, Rand: rand.NewPCG(1, 2)})
	if err != nil {
		t.Fatal(err)
	}
	pods, _ := a.ListPodsByModel("m")
	var d routing.Decision
	for range 5 {
		if err := r.Route(context.Background(), sloRequest(), a.Snapshots(pods, nil), &d); err != nil {
			t.Fatal(err)
		}
		if d.PodKey != "ns/q" {
			t.Fatalf("replica a routed to %s with p full by replica b's requests, want q", d.PodKey)
		}
	}
	full := 0
	for _, c := range d.Candidates {
		if c.Pod == "ns/p" && c.SLOVerdict == routing.SLOFull {
			full++
		}
	}
	if full != 1 {
		t.Fatalf("candidates %+v, want p judged full", d.Candidates)
	}
}

// sloRequest returns a request for m with an SLO, for the SLO-aware
// algorithms.
func sloRequest() *types.RoutingContext {
	rc := types.NewRoutingContext("r", "m")
	rc.Algorithm, rc.PromptTokenCount, rc.PredictedOutputTokens = routing.SLO, 100, 1
	rc.SLO = types.SLO{TTFT: 10 * time.Second}
	return rc
}

func TestReplicasRouteOnTheirOwnRequestsWhileRedisIsDown(t *testing.T) {
	srv := testredis.Start(t)
	rc := srv.NewClient(t)
	reg := prometheus.NewRegistry()
	a := newTestStore(t)
	c, err := NewSharedCounts(rc, a, newTestMetrics(t, reg), SharedCountsConfig{GatewayID: "gw-a",
		Interval: 50 * time.Millisecond, TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	b, lb, _ := sharedStore(t, rc, "gw-b")
	lb.Admit("b", "m").Route(inflight.Route{Pod: b.PodLoad(podP), PendingLoad: 0.25})
	testsupport.Eventually(t, "a sees b's pending load", func() bool { return a.PodLoad(podP).PendingLoad() == 0.25 })

	srv.Stop()
	testsupport.Eventually(t, "a drops b's work once Redis is unreadable for longer than the TTL", func() bool {
		return a.PodLoad(podP).PendingLoad() == 0 && a.PodLoad(podP).Running() == 0
	})
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_shared_counts_local_only_total", nil); n != 1 {
		t.Fatalf("kvgate_cache_shared_counts_local_only_total = %v, want 1", n)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_redis_errors_total", map[string]string{"operation": opSharedRead}); n == 0 {
		t.Fatal("failed reads were not counted")
	}
}
