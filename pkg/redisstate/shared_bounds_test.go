package redisstate

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
)

// boundedReader returns the shared counts of s read as gateway "gw-self"
// at the fixed time now, configured by cfg, and the registry of its
// metrics. Tests call its read and publish themselves.
func boundedReader(t *testing.T, rc *redis.Client, s *cache.Store, now time.Time, cfg SharedCountsConfig) (*SharedCounts, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.GatewayID, cfg.Now = "gw-self", func() time.Time { return now }
	c, err := NewSharedCounts(rc, s, newTestMetrics(t, reg), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, reg
}

// fakeReplica writes the hash of gateway id, holding fields and values, and
// lists it as published at at.
func fakeReplica(t *testing.T, rc *redis.Client, id string, at time.Time, fieldsAndValues ...any) {
	t.Helper()
	ctx := context.Background()
	key := SharedCountsKeyPrefix + id
	if err := rc.HSet(ctx, key, fieldsAndValues...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Expire(ctx, key, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.ZAdd(ctx, SharedGatewaysKey, redis.Z{Score: float64(at.UnixMilli()), Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
}

const skippedMetric = "kvgate_cache_shared_gateways_skipped_total"

func TestReadTakesTheLatestReplicasUpToTheBound(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	s := storeWithPods(t, "p")
	now := time.Now()
	c, reg := boundedReader(t, rc, s, now, SharedCountsConfig{MaxReplicas: 4})
	// Six other replicas; gw-i published i tenths of a second ago and runs
	// 2^i requests on p.
	for i := range 6 {
		fakeReplica(t, rc, fmt.Sprint("gw-", i), now.Add(-time.Duration(i)*100*time.Millisecond), "ns/p", 1<<i)
	}
	must(t, c.read(context.Background()))
	if got := s.PodLoad(podP).Running(); got != 1+2+4 {
		t.Fatalf("running on p = %d, want 7: the three latest of the six other replicas", got)
	}
	if n := byReason(t, reg, skippedMetric, skipLimit); n != 3 {
		t.Fatalf("replicas left out = %v, want 3", n)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_shared_gateways", nil); n != 7 {
		t.Fatalf("shared gateways = %v, want 7: every live replica and this one", n)
	}

	// Once this replica has published, it takes one of the slots itself.
	if err := c.publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	must(t, c.read(context.Background()))
	if got := s.PodLoad(podP).Running(); got != 7 {
		t.Fatalf("running on p = %d after publishing, want 7", got)
	}
	if n := byReason(t, reg, skippedMetric, skipLimit); n != 6 {
		t.Fatalf("replicas left out after two reads = %v, want 6", n)
	}
}

func TestReadLeavesOutReplicasWhoseClockRunsAhead(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	s := storeWithPods(t, "p")
	now := time.Now()
	// Listed ahead of the Redis server's clock, which only another writer
	// of the list could do; the server's clock is read when c reads, at
	// most a second after now here.
	c, reg := boundedReader(t, rc, s, now, SharedCountsConfig{Interval: 100 * time.Millisecond, TTL: 2 * time.Second})
	fakeReplica(t, rc, "gw-ok", now.Add(time.Second), "ns/p", 2)
	fakeReplica(t, rc, "gw-ahead", now.Add(3*time.Second), "ns/p", 5)
	fakeReplica(t, rc, "gw-far-ahead", now.Add(time.Hour), "ns/p", 11)
	must(t, c.read(context.Background()))
	if got := s.PodLoad(podP).Running(); got != 2 {
		t.Fatalf("running on p = %d, want 2: only the replica within the TTL of now", got)
	}
	if n := byReason(t, reg, skippedMetric, skipClockAhead); n != 2 {
		t.Fatalf("replicas left out for their clock = %v, want 2", n)
	}

	// A publication prunes the replicas listed beyond a minute ahead, as
	// it prunes those a minute behind.
	fakeReplica(t, rc, "gw-dead", now.Add(-2*time.Minute), "ns/p", 1)
	if err := c.publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for id, listed := range map[string]bool{"gw-ok": true, "gw-ahead": true, "gw-self": true, "gw-far-ahead": false, "gw-dead": false} {
		err := rc.ZScore(ctx, SharedGatewaysKey, id).Err()
		if (err == nil) != listed || (err != nil && !errors.Is(err, redis.Nil)) {
			t.Errorf("%s listed: %v, want %v", id, err == nil, listed)
		}
	}
}

func TestReadLeavesOutHashesBeyondTheBounds(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	ctx := context.Background()
	s := storeWithPods(t, "p")
	now := time.Now()
	c, reg := boundedReader(t, rc, s, now, SharedCountsConfig{MaxHashFields: 10, MaxHashBytes: 16 << 10})
	fakeReplica(t, rc, "gw-ok", now, "ns/p", 2)
	wide := []any{"ns/p", 4}
	for i := range 10 {
		wide = append(wide, fmt.Sprintf("ns/p|model-%d", i), 1)
	}
	fakeReplica(t, rc, "gw-wide", now, wide...)
	fakeReplica(t, rc, "gw-big", now, "ns/p", 8, "ns/p#blocks", string(make([]byte, 64<<10)))
	// A key that holds no hash, listed as a replica.
	if err := rc.Set(ctx, SharedCountsKeyPrefix+"gw-string", "ns/p", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.ZAdd(ctx, SharedGatewaysKey, redis.Z{Score: float64(now.UnixMilli()), Member: "gw-string"}).Err(); err != nil {
		t.Fatal(err)
	}

	must(t, c.read(context.Background()))
	if got := s.PodLoad(podP).Running(); got != 2 {
		t.Fatalf("running on p = %d, want 2: the hashes beyond the bounds left out whole", got)
	}
	for _, reason := range []string{skipFields, skipBytes, skipNotHash} {
		if n := byReason(t, reg, skippedMetric, reason); n != 1 {
			t.Errorf("replicas left out for %s = %v, want 1", reason, n)
		}
	}

	// A hash within the bounds again is read again, and a Redis that lost
	// the script is given it again.
	if err := rc.HDel(ctx, SharedCountsKeyPrefix+"gw-big", "ns/p#blocks").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	must(t, c.read(context.Background()))
	if got := s.PodLoad(podP).Running(); got != 2+8 {
		t.Fatalf("running on p = %d, want 10 once gw-big's hash fits", got)
	}
}

func TestReadIgnoresPodsAndModelsNotRegisteredHere(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	s := storeWithPods(t, "p")
	preds, err := cache.NewOutputPredictors(s, cache.PredictorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c, reg := boundedReader(t, rc, s, now, SharedCountsConfig{Predictors: preds})
	// An output history of one request of up to 1 input token and 1024
	// output tokens.
	hist := make([]byte, 4*21*21)
	hist[4*10] = 1
	fakeReplica(t, rc, "gw-x", now,
		"ns/p", 5, "ns/p|m", 3, "ns/p|lora", 2,
		"ns/r", 4, "ns/r|m", 4, "ns/r#pending", "0.5", "ns/r#prefill", "2",
		fieldOutputPrefix+"lora", string(hist))

	must(t, c.read(context.Background()))
	p := s.PodLoad(podP)
	if got := [3]int64{p.Running(), p.RunningModel("m"), p.RunningModel("lora")}; got != [3]int64{5, 3, 0} {
		t.Fatalf("running on p in total, for m, for lora = %v, want [5 3 0]: lora is not served here", got)
	}
	const ignored = "kvgate_cache_shared_fields_ignored_total"
	if n, m := byReason(t, reg, ignored, ignoreUnknownPod), byReason(t, reg, ignored, ignoreUnknownModel); n != 4 || m != 2 {
		t.Fatalf("fields ignored for an unknown pod, model = %v, %v; want 4, 2", n, m)
	}

	// Once registered here, the pod and the adapter count from the next
	// read on.
	addPod(s, "r")
	if err := s.SetPodAdapters(podP, []string{"lora"}); err != nil {
		t.Fatal(err)
	}
	must(t, c.read(context.Background()))
	if got := p.RunningModel("lora"); got != 2 {
		t.Fatalf("running on p for lora = %d once p serves it, want 2", got)
	}
	r := s.PodLoad(endpoint.Key{Namespace: "ns", Name: "r"})
	if r.Running() != 4 || r.RunningModel("m") != 4 || r.PendingLoad() != 0.5 {
		t.Fatalf("r once registered: running %d, for m %d, pending %v; want 4, 4, 0.5", r.Running(), r.RunningModel("m"), r.PendingLoad())
	}
	pr, err := preds.GetOutputPredictor("lora")
	if err != nil {
		t.Fatal(err)
	}
	if got := pr.Predict(1); got != 1024 {
		t.Fatalf("lora's predictor predicts %d output tokens, want 1024 from gw-x's history", got)
	}
}
