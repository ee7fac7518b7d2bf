package cache

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
)

// sharedStore returns a running Store sharing counts as gateway id, and the
// function that stops it (also called when the test ends).
func sharedStore(t *testing.T, rc *redis.Client, id string) (*Store, func()) {
	cfg := noScrape()
	cfg.SharedRequestCounts = true
	cfg.GatewayID = id
	cfg.SharedCountsInterval = 50 * time.Millisecond
	cfg.SharedCountsTTL = time.Second
	s, err := New(rc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := sync.OnceFunc(runStore(s))
	t.Cleanup(stop)
	for _, name := range []string{"p", "q"} {
		s.AddOrUpdatePod(testPod("ns", name, "m", "10.0.0.1"))
	}
	return s, stop
}

func waitRunning(t *testing.T, s *Store, pod, model string, want float64) {
	t.Helper()
	testsupport.EventuallyWhy(t, fmt.Sprintf("%v requests running on %s %s", want, pod, model), func() (string, bool) {
		var v MetricValue
		var err error
		if model == "" {
			v, err = s.GetMetricValueByPod(pkey("ns", pod), RealtimeNumRequestsRunning)
		} else {
			v, err = s.GetMetricValueByPodModel(pkey("ns", pod), model, RealtimeNumRequestsRunning)
		}
		return describe(v, err), err == nil && v.Value == want
	})
}

func TestGatewayReplicasSeeFleetWideRunningRequests(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	a, _ := sharedStore(t, rc, "gw-a")
	b, stopB := sharedStore(t, rc, "gw-b")
	start := func(s *Store, id, pod string) int64 {
		p, _ := s.GetPod(pkey("ns", pod))
		return s.AddRequestCount(routed(id, "m", p.Pod), id, "m")
	}
	for i := range 3 {
		start(a, fmt.Sprint("a", i), "p")
	}
	b0, b1 := start(b, "b0", "p"), start(b, "b1", "p")
	start(b, "b2", "q")

	for _, s := range []*Store{a, b} {
		waitRunning(t, s, "p", "", 5)
		waitRunning(t, s, "p", "m", 5)
		waitRunning(t, s, "q", "", 1)
	}
	b.DoneRequestCount(nil, "b0", "m", b0)
	b.DoneRequestCount(nil, "b1", "m", b1)
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
	a, _ := sharedStore(t, rc, "gw-a")
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
