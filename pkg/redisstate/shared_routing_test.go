package redisstate

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/types"
)

// replica is one gateway's routing state: its Store, request ledger,
// Router and output predictors, wired as the gateway wires them.
type replica struct {
	id     string
	store  *cache.Store
	ledger *inflight.Ledger
	router *routing.Router
	preds  *cache.OutputPredictors
	reg    *prometheus.Registry
	// stop stops sharing, withdrawing the replica's state.
	stop func()
}

// newReplica returns replica id routing pods over idx, sharing its state
// through rc unless rc is nil.
func newReplica(t *testing.T, rc *redis.Client, id string, idx routing.PrefixIndex, pods ...string) *replica {
	t.Helper()
	replicaSeed++
	r := &replica{id: id, store: storeWithPods(t, pods...), ledger: newTestLedger(t), reg: prometheus.NewRegistry()}
	var err error
	if r.router, err = routing.New(routing.Config{Index: idx, Rand: rand.NewPCG(1, replicaSeed),
		// Prefills far slower than the test, so that queues do not drain
		// while it waits for the shared state.
		DefaultPrefillTokensPerSecond: 100}); err != nil {
		t.Fatal(err)
	}
	r.ledger.Observe(r.router.Observer())
	if r.preds, err = cache.NewOutputPredictors(r.store, cache.PredictorConfig{}); err != nil {
		t.Fatal(err)
	}
	r.ledger.Observe(r.preds.Observer())
	if rc == nil {
		return r
	}
	c, err := NewSharedCounts(rc, r.store, newTestMetrics(t, r.reg), SharedCountsConfig{GatewayID: id,
		Interval: 20 * time.Millisecond, TTL: time.Second, Prefixes: r.router, Predictors: r.preds})
	if err != nil {
		t.Fatal(err)
	}
	r.stop = run(t, c)
	return r
}

// replicaSeed seeds each replica's Router with a random source of its own.
var replicaSeed uint64

// send routes the request for tokens with kv-aware and opens its attempt
// on the chosen pod, as the gateway does; it returns the decision.
func (r *replica) send(t *testing.T, id string, tokens []uint32) *routing.Decision {
	t.Helper()
	rc := types.NewRoutingContext(id, "m")
	rc.Algorithm, rc.PromptTokenIDs = routing.KVAware, tokens
	pods, err := r.store.ListPodsByModel("m")
	if err != nil {
		t.Fatal(err)
	}
	d := new(routing.Decision)
	if err := r.router.Route(context.Background(), rc, r.store.Snapshots(pods, nil), d); err != nil {
		t.Fatal(err)
	}
	r.ledger.Admit(id, "m").Route(d.Route())
	return d
}

const testBlockSize = 16

// hotIndex returns a prefix index in which pod ns/hot holds tokens.
func hotIndex(t *testing.T, hot string, tokens []uint32) *indexer.SyncPrefixHashTable {
	t.Helper()
	idx, err := indexer.NewSyncPrefixHashTable(indexer.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := len(tokens) / testBlockSize
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = 1000 + uint64(i)
	}
	ev := &kvevent.BlockStoredEvent{BlockHashes: hashes, TokenIDs: tokens[:n*testBlockSize], BlockSize: testBlockSize,
		GroupIdx: kvevent.NoGroup}
	if err := idx.ApplyBatch(indexer.Stream{Pod: "ns/" + hot, Model: "m"}, &kvevent.EventBatch{Events: []kvevent.KVEvent{ev}}); err != nil {
		t.Fatal(err)
	}
	return idx
}

// tokens returns n token ids from from on.
func tokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// hotPrompt returns request i's prompt: the hot prefix and a suffix of its
// own.
func hotPrompt(hot []uint32, i, suffix int) []uint32 {
	return append(append([]uint32(nil), hot...), tokens(1_000_000+1000*i, suffix)...)
}

// waitShared waits until every replica counts every attempt open on every
// replica, pod by pod: their shared state is then current.
func waitShared(t *testing.T, rs []*replica, pods []string) {
	t.Helper()
	testsupport.EventuallyWhy(t, "every replica sees every replica's attempts", func() (string, bool) {
		want := map[string]int64{}
		for _, r := range rs {
			for _, p := range r.store.PodLoads() {
				for _, n := range p.Local() {
					want[p.ID()] += n
				}
			}
		}
		for _, r := range rs {
			for _, pod := range pods {
				if got := r.store.PodLoad(endpoint.Key{Namespace: "ns", Name: pod}).Running(); got != want["ns/"+pod] {
					return fmt.Sprintf("%s counts %d on %s, want %d", r.id, got, pod, want["ns/"+pod]), false
				}
			}
		}
		return "", true
	})
}

// routeHot sends rounds of requests sharing the hot prefix, one per replica
// per round, and returns how many each pod received; between requests it
// waits for the shared state to be current when shared is true, as it is
// when requests arrive further apart than the sharing interval.
func routeHot(t *testing.T, rs []*replica, hot []uint32, suffix int, pods []string, rounds int, shared bool) map[string]int {
	t.Helper()
	got := map[string]int{}
	n := 0
	for range rounds {
		for _, r := range rs {
			d := r.send(t, fmt.Sprint(r.id, "-", n), hotPrompt(hot, n, suffix))
			got[d.PodKey]++
			n++
			if shared {
				waitShared(t, rs, pods)
			}
		}
	}
	return got
}

func TestReplicasDoNotStampedeAHotPrefix(t *testing.T) {
	// Pod hot holds a 4096-token prefix; 36 requests share it, each with a
	// 512-token suffix of its own, none ending its prefill. One gateway
	// sends to hot until its queue of suffixes outweighs prefilling the
	// whole prompt elsewhere, then spreads. Three replicas that share their
	// state over Redis must do as well; three that do not each fill hot's
	// queue on their own, and stampede it.
	pods := []string{"hot", "a", "b", "c"}
	hot := tokens(1, 4096)
	idx := hotIndex(t, "hot", hot)
	const rounds, suffix = 12, 512

	one := newReplica(t, nil, "single", idx, pods...)
	single := routeHot(t, []*replica{one}, hot, suffix, pods, 3*rounds, false)

	var alone []*replica
	for i := range 3 {
		alone = append(alone, newReplica(t, nil, fmt.Sprint("alone-", i), idx, pods...))
	}
	unshared := routeHot(t, alone, hot, suffix, pods, rounds, false)

	rc := testredis.Start(t).NewClient(t)
	var rs []*replica
	for i := range 3 {
		rs = append(rs, newReplica(t, rc, fmt.Sprint("gw-", i), idx, pods...))
	}
	shared := routeHot(t, rs, hot, suffix, pods, rounds, true)

	t.Logf("requests per pod: one gateway %v, three sharing %v, three not sharing %v", single, shared, unshared)
	if shared["ns/hot"] > single["ns/hot"]+1 {
		t.Errorf("replicas sharing state sent %d requests to the hot pod, one gateway %d", shared["ns/hot"], single["ns/hot"])
	}
	if unshared["ns/hot"] < 3*shared["ns/hot"]/2 {
		t.Errorf("replicas not sharing state sent %d requests to the hot pod, sharing %d: the test does not tell them apart",
			unshared["ns/hot"], shared["ns/hot"])
	}
}

func TestReplicasCreditPrefixesAnotherSentToAPod(t *testing.T) {
	// No pod holds the prefix yet: replica b sends the first request to
	// some pod. Replica a, asked for a request sharing that prefix, must
	// credit the pod with the prefix in flight there and follow it.
	rc := testredis.Start(t).NewClient(t)
	pods := []string{"p", "q", "r"}
	idx, err := indexer.NewSyncPrefixHashTable(indexer.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	hotIndexBlockSize(t, idx)
	a := newReplica(t, rc, "gw-a", idx, pods...)
	b := newReplica(t, rc, "gw-b", idx, pods...)
	prefix := tokens(50_000, 4096)
	first := b.send(t, "b-0", append(append([]uint32(nil), prefix...), tokens(90_000, 64)...))
	waitShared(t, []*replica{a, b}, pods)

	d := a.send(t, "a-0", append(append([]uint32(nil), prefix...), tokens(80_000, 64)...))
	if d.PodKey != first.PodKey {
		t.Fatalf("replica a routed to %s, away from %s where replica b's request holds the prefix", d.PodKey, first.PodKey)
	}
	if c := d.Chosen(); c.InFlightMatchedTokens != len(prefix) {
		t.Fatalf("replica a credited %s with %d tokens in flight, want %d", d.PodKey, c.InFlightMatchedTokens, len(prefix))
	}
}

// hotIndexBlockSize stores on pod ns/p one unrelated block, so that the
// index knows the block size and matches prompts.
func hotIndexBlockSize(t *testing.T, idx *indexer.SyncPrefixHashTable) {
	t.Helper()
	ev := &kvevent.BlockStoredEvent{BlockHashes: []uint64{1}, TokenIDs: tokens(7_000_000, testBlockSize), BlockSize: testBlockSize,
		GroupIdx: kvevent.NoGroup}
	if err := idx.ApplyBatch(indexer.Stream{Pod: "ns/p", Model: "m"}, &kvevent.EventBatch{Events: []kvevent.KVEvent{ev}}); err != nil {
		t.Fatal(err)
	}
}

func TestReplicasPredictOutputFromEachOthersHistory(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	a := newReplica(t, rc, "gw-a", nil, "p")
	b := newReplica(t, rc, "gw-b", nil, "p")
	for i := range 20 {
		complete(b.ledger, fmt.Sprint("b", i), "m", 1000, 1000)
	}
	pa, err := a.preds.GetOutputPredictor("m")
	if err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "replica a predicts from b's completed requests", func() bool { return pa.Predict(1000) == 1024 })

	b.stop()
	testsupport.Eventually(t, "replica a forgets b's history once b stops", func() bool { return pa.Predict(1000) == 1 })
}

func TestUndecodableSharedStateIsDroppedAndCounted(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	a := newReplica(t, rc, "gw-a", nil, "p", "q")
	ctx := context.Background()
	// A replica publishing a torn block list and a history of the wrong
	// size, beside counts and a block list that are fine.
	key := SharedCountsKeyPrefix + "gw-bad"
	if err := rc.HSet(ctx, key, map[string]any{
		"ns/p":                  3,
		"ns/p" + fieldBlocks:    []byte{1, 2, 3},
		"ns/q" + fieldBlocks:    []byte{7, 0, 0, 0, 0, 0, 0, 0},
		fieldOutputPrefix + "m": []byte{1, 0, 0, 0, 2, 0, 0, 0},
	}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.ZAdd(ctx, SharedGatewaysKey, redis.Z{Score: float64(time.Now().UnixMilli()), Member: "gw-bad"}).Err(); err != nil {
		t.Fatal(err)
	}
	p, q := a.store.PodLoad(endpoint.Key{Namespace: "ns", Name: "p"}), a.store.PodLoad(endpoint.Key{Namespace: "ns", Name: "q"})
	testsupport.Eventually(t, "the decodable values count", func() bool { return p.Running() == 3 && q.RemoteBlock(7) })
	if p.HasRemoteBlocks() {
		t.Error("a torn block list was applied")
	}
	for _, kind := range []string{rejectBlocks, rejectHistogram} {
		testsupport.Eventually(t, kind+" rejects counted", func() bool {
			return testsupport.MetricValue(t, a.reg, "kvgate_cache_shared_state_rejects_total", map[string]string{"kind": kind}) > 0
		})
	}
}

func TestASoleReplicaComplainsWhenOthersAppear(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	var mu sync.Mutex
	var lines []string
	reg := prometheus.NewRegistry()
	c, err := NewSharedCounts(rc, newTestStore(t), newTestMetrics(t, reg), SharedCountsConfig{GatewayID: "gw-bind",
		Interval: 20 * time.Millisecond, TTL: time.Second, SoleReplica: "bind mode",
		Logger: funcr.New(func(prefix, args string) { mu.Lock(); lines = append(lines, args); mu.Unlock() }, funcr.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	complaints := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, l := range lines {
			if strings.Contains(l, "must be the only one") && strings.Contains(l, `"why"="bind mode"`) {
				n++
			}
		}
		return n
	}
	gauge := func() float64 { return testsupport.MetricValue(t, reg, "kvgate_cache_shared_gateways", nil) }
	testsupport.Eventually(t, "the replica counts itself", func() bool { return gauge() == 1 })
	if n := complaints(); n != 0 {
		t.Fatalf("%d complaints while alone", n)
	}
	other, lo, _ := sharedStore(t, rc, "gw-other")
	testsupport.Eventually(t, "two replicas counted", func() bool { return gauge() == 2 })
	testsupport.Eventually(t, "the sole replica complains", func() bool { return complaints() == 1 })
	// Later reads, which see the other replica's new request, do not
	// complain again.
	lo.Admit("o", "m").Route(inflight.Route{Pod: other.PodLoad(podP)})
	testsupport.Eventually(t, "a later read", func() bool { return c.pods.PodLoads()[0].Running()+c.pods.PodLoads()[1].Running() == 1 })
	if n := complaints(); n != 1 {
		t.Fatalf("%d complaints with the same replicas, want 1", n)
	}
}
