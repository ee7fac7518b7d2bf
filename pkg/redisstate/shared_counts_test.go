package redisstate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
)

// sharedStore returns a Store of pods p and q whose counts are shared as
// gateway id, a ledger to route requests with, and the function that stops
// the sharing (also called when the test ends).
func sharedStore(t *testing.T, rc *redis.Client, id string) (*cache.Store, *inflight.Ledger, func()) {
	t.Helper()
	s := newTestStore(t)
	c, err := NewSharedCounts(rc, s, newTestMetrics(t, nil), SharedCountsConfig{GatewayID: id,
		Interval: 50 * time.Millisecond, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s, newTestLedger(t), run(t, c)
}

func waitRunning(t *testing.T, s *cache.Store, pod, model string, want float64) {
	t.Helper()
	key := endpoint.Key{Namespace: "ns", Name: pod}
	testsupport.EventuallyWhy(t, fmt.Sprintf("%v requests running on %s %s", want, pod, model), func() (string, bool) {
		var v cache.MetricValue
		var err error
		if model == "" {
			v, err = s.GetMetricValueByPod(key, cache.RealtimeNumRequestsRunning)
		} else {
			v, err = s.GetMetricValueByPodModel(key, model, cache.RealtimeNumRequestsRunning)
		}
		return fmt.Sprint(v.Value, err), err == nil && v.Value == want
	})
}

func TestGatewayReplicasSeeFleetWideRunningRequests(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	a, la, _ := sharedStore(t, rc, "gw-a")
	b, lb, stopB := sharedStore(t, rc, "gw-b")
	start := func(s *cache.Store, l *inflight.Ledger, id, pod string) *inflight.Handle {
		return l.Admit(id, "m").Route(inflight.Route{Pod: s.PodLoad(endpoint.Key{Namespace: "ns", Name: pod})})
	}
	for i := range 3 {
		start(a, la, fmt.Sprint("a", i), "p")
	}
	b0, b1 := start(b, lb, "b0", "p"), start(b, lb, "b1", "p")
	start(b, lb, "b2", "q")

	for _, s := range []*cache.Store{a, b} {
		waitRunning(t, s, "p", "", 5)
		waitRunning(t, s, "p", "m", 5)
		waitRunning(t, s, "q", "", 1)
	}
	b0.Close(inflight.Done, "")
	b1.Close(inflight.Done, "")
	waitRunning(t, a, "p", "", 3)

	// A replica that shuts down withdraws its counts at once.
	stopB()
	waitRunning(t, a, "q", "", 0)
	if n, err := rc.Exists(context.Background(), SharedCountsKeyPrefix+"gw-b").Result(); err != nil || n != 0 {
		t.Fatalf("stopped replica's hash still exists: %d, %v", n, err)
	}
}

func TestCountsOfACrashedReplicaExpire(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	a, _, _ := sharedStore(t, rc, "gw-a")
	ctx := context.Background()
	// A replica that published and then died without withdrawing.
	dead := SharedCountsKeyPrefix + "gw-dead"
	if err := rc.HSet(ctx, dead, "ns/p", 7, "ns/p|m", 7).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.PExpire(ctx, dead, 2*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.ZAdd(ctx, SharedGatewaysKey, redis.Z{Score: float64(time.Now().UnixMilli()), Member: "gw-dead"}).Err(); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, a, "p", "m", 7)
	waitRunning(t, a, "p", "", 0)
}

func TestSharedCountsTTLMustExceedTheInterval(t *testing.T) {
	_, err := NewSharedCounts(nil, newTestStore(t), newTestMetrics(t, nil), SharedCountsConfig{Interval: time.Second, TTL: time.Second})
	if err == nil {
		t.Fatal("a TTL equal to the interval was accepted")
	}
}
