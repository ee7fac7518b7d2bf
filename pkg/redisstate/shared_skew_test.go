package redisstate

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
)

// skewed returns the shared counts of s as gateway id, whose clock reads
// off from the real one, and the registry of its metrics.
func skewed(t *testing.T, rc *redis.Client, s *cache.Store, id string, off time.Duration, cfg SharedCountsConfig) (*SharedCounts, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.GatewayID, cfg.Now = id, func() time.Time { return time.Now().Add(off) }
	c, err := NewSharedCounts(rc, s, newTestMetrics(t, reg), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, reg
}

// Which replicas are live is decided on the Redis server's clock alone: a
// replica whose clock is minutes ahead neither prunes the others from the
// list nor is left out, and one whose clock is behind by more than the TTL
// still counts.
func TestReplicasClocksDoNotDecideWhoIsLive(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	ctx := context.Background()
	for _, off := range []time.Duration{2 * time.Minute, -6 * time.Second, -time.Hour} {
		must(t, rc.FlushAll(ctx).Err())
		healthyStore := storeWithPods(t, "p")
		newTestLedger(t).Admit("c", "m").Route(inflight.Route{Pod: healthyStore.PodLoad(podP)})
		healthy, _ := skewed(t, rc, healthyStore, "gw-healthy", 0, SharedCountsConfig{})
		must(t, healthy.publish(ctx))

		offStore := storeWithPods(t, "p")
		l := newTestLedger(t)
		for range 2 {
			l.Admit("o", "m").Route(inflight.Route{Pod: offStore.PodLoad(podP)})
		}
		off, _ := skewed(t, rc, offStore, "gw-off", off, SharedCountsConfig{})
		must(t, off.publish(ctx))

		s := storeWithPods(t, "p")
		reader, reg := skewed(t, rc, s, "gw-reader", 0, SharedCountsConfig{})
		must(t, reader.read(ctx))
		if got := s.PodLoad(podP).Running(); got != 3 {
			t.Errorf("clock off by %v: the reader counts %d requests on p, want 3 (1 of the healthy replica, 2 of the other)", off, got)
		}
		if n := byReason(t, reg, skippedMetric, skipClockAhead); n != 0 {
			t.Errorf("clock off by %v: %v replicas left out for their clock, want 0", off, n)
		}
		// The skewed replica reads the others as any replica does.
		must(t, off.read(ctx))
		if got := offStore.PodLoad(podP).Running(); got != 3 {
			t.Errorf("clock off by %v: that replica counts %d requests on p, want 3", off, got)
		}
	}
}

// A count or a work value too large for any replica to hold is dropped and
// counted, never summed into a negative load or an overflowing duration,
// and the other replicas' values still count.
func TestOutOfRangeSharedValuesAreDropped(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	ctx := context.Background()
	s := storeWithPods(t, "p")
	now := time.Now()
	c, reg := boundedReader(t, rc, s, now, SharedCountsConfig{})
	fakeReplica(t, rc, "gw-1", now, "ns/p", int64(5e18), "ns/p|m", int64(math.MaxInt64), "ns/p#prefill", "1e10")
	fakeReplica(t, rc, "gw-2", now, "ns/p", int64(5e18), "ns/p|m", 2, "ns/p#pending", "+Inf")
	fakeReplica(t, rc, "gw-3", now, "ns/p", 3, "ns/p#prefill", "2")
	must(t, c.read(ctx))
	p := s.PodLoad(podP)
	if p.Running() != 3 || p.RunningModel("m") != 2 {
		t.Errorf("running on p %d, for m %d; want 3 and 2: the values out of range dropped, the others kept", p.Running(), p.RunningModel("m"))
	}
	if q := p.Queue(now, time.Time{}, 0); q.Seconds < 1.5 || q.Seconds > 2.5 {
		t.Errorf("prefill queued on p %v s, want about 2: gw-3's alone", q.Seconds)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_shared_state_rejects_total", map[string]string{"kind": rejectValue}); n != 5 {
		t.Errorf("values rejected = %v, want 5", n)
	}
}

// A replica's output history of another shape than this replica's
// predictors' (another version's, or one configured otherwise) is left
// out alone: the others' still count; and a remote history that does not
// fit clears the one held before rather than freezing it.
func TestAMisshapenOutputHistoryIsLeftOutAlone(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	ctx := context.Background()
	s := storeWithPods(t, "p")
	preds, err := cache.NewOutputPredictors(s, cache.PredictorConfig{})
	must(t, err)
	size := preds.HistogramSize()
	good := make([]byte, 4*size)
	good[4*10] = 1 // one request of 1 input token and about 1024 output tokens
	now := time.Now()
	c, reg := boundedReader(t, rc, s, now, SharedCountsConfig{Predictors: preds})
	fakeReplica(t, rc, "gw-good", now.Add(-100*time.Millisecond), fieldOutputPrefix+"m", string(good))
	fakeReplica(t, rc, "gw-bad", now, fieldOutputPrefix+"m", string(make([]byte, 4*(size-1))))
	must(t, c.read(ctx))
	pr, err := preds.GetOutputPredictor("m")
	must(t, err)
	if got := pr.Predict(1); got != 1024 {
		t.Errorf("predicts %d output tokens, want 1024 from gw-good's history", got)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_shared_state_rejects_total", map[string]string{"kind": rejectHistogram}); n != 1 {
		t.Errorf("histories rejected = %v, want 1", n)
	}
	cold, err := cache.NewOutputPredictors(s, cache.PredictorConfig{})
	must(t, err)
	coldPr, err := cold.GetOutputPredictor("m")
	must(t, err)
	if err := pr.SetRemoteHistogram(make([]int32, size+1)); err == nil {
		t.Fatal("a remote history of the wrong size was taken")
	}
	if got, want := pr.Predict(1), coldPr.Predict(1); got != want {
		t.Errorf("after a remote history that does not fit, predicts %d, want %d as with none", got, want)
	}
}

// A key of another type where the list of replicas belongs is replaced by
// the next publication, and the replicas share again.
func TestAGatewaysKeyOfAnotherTypeIsReplaced(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	must(t, rc.Set(context.Background(), SharedGatewaysKey, "not a sorted set", 0).Err())
	a, _, _ := sharedStore(t, rc, "gw-a")
	b, lb, _ := sharedStore(t, rc, "gw-b")
	lb.Admit("b0", "m").Route(inflight.Route{Pod: b.PodLoad(podP)})
	waitRunning(t, a, "p", "", 1)
}
