package indexer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// storePrompt stores prompt number p (blocks of 16 tokens, engine hashes
// p*1000+i) for s in one event.
func storePrompt(tb testing.TB, idx *SyncPrefixHashTable, s Stream, p, blocks int) {
	tb.Helper()
	mustApply(tb, idx, s, stored(hashSeq(uint64(p*1000), blocks), nil, tokenRange(p*100000, 16*blocks), 16))
}

func promptBlocks(idx *SyncPrefixHashTable, s Stream, p, blocks int) int {
	b, _ := match(idx, s.Model, "", tokenRange(p*100000, 16*blocks), s.Pod)
	return b[s.Pod]
}

func TestCapacityEvictsLeastRecentlyStoredOrMatched(t *testing.T) {
	idx, reg := newTestTable(t, Config{MaxPrefixesPerContext: 64})
	clock := testsupport.NewClock(time.Now())
	idx.now = clock.Now
	for p := 0; p < 8; p++ {
		clock.Advance(time.Second)
		storePrompt(t, idx, podA, p, 8)
	}
	clock.Advance(time.Second)
	if got := promptBlocks(idx, podA, 0, 8); got != 8 {
		t.Fatalf("prompt 0 before eviction: %d blocks, want 8", got)
	}
	clock.Advance(time.Second)
	storePrompt(t, idx, podA, 8, 8)
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
	if got := promptBlocks(idx, podA, 0, 8); got != 8 {
		t.Errorf("prompt 0, matched recently, lost blocks: %d, want 8", got)
	}
	if got := promptBlocks(idx, podA, 1, 8); got != 0 {
		t.Errorf("prompt 1, the least recently used, kept %d blocks, want 0", got)
	}
	if got := promptBlocks(idx, podA, 8, 8); got != 8 {
		t.Errorf("prompt 8, just stored, has %d blocks, want 8", got)
	}
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_evicted_blocks_total", map[string]string{"reason": reasonCapacity}); got != 8 {
		t.Errorf("capacity evictions = %v, want 8", got)
	}
	// The evicted blocks left the lane map too: their engine hashes are
	// unknown parents now, and removing them changes nothing.
	mustApply(t, idx, podA, stored(hashSeq(1008, 1), ptr[uint64](1007), tokenRange(100000+128, 16), 16),
		removed("GPU", 0, hashSeq(1000, 8)...))
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_parent_misses_total", nil); got != 1 {
		t.Errorf("parent misses after extending an evicted block = %v, want 1", got)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

func TestTotalBoundEvictsFromTheLeastRecentlyUsedModel(t *testing.T) {
	idx, reg := newTestTable(t, Config{MaxPrefixes: 40})
	clock := testsupport.NewClock(time.Now())
	idx.now = clock.Now
	old := Stream{Pod: "ns/old", Model: "old"}
	fresh := Stream{Pod: "ns/new", Model: "new"}
	for p := 0; p < 4; p++ {
		storePrompt(t, idx, old, p, 8)
	}
	clock.Advance(5 * time.Second)
	for p := 10; p < 12; p++ {
		storePrompt(t, idx, fresh, p, 8)
		if err := checkInvariants(idx); err != nil {
			t.Fatal(err)
		}
		if n := idx.total.Load(); n > 40 {
			t.Fatalf("total keys %d exceed MaxPrefixes 40", n)
		}
	}
	for p := 10; p < 12; p++ {
		if got := promptBlocks(idx, fresh, p, 8); got != 8 {
			t.Errorf("new model prompt %d has %d blocks, want 8", p, got)
		}
	}
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_evicted_blocks_total", map[string]string{"reason": reasonTotal}); got < 8 {
		t.Errorf("total_capacity evictions = %v, want >= 8", got)
	}
}

func TestMaxContextsDropsTheLeastRecentlyUsedModel(t *testing.T) {
	idx, reg := newTestTable(t, Config{MaxContexts: 2})
	clock := testsupport.NewClock(time.Now())
	idx.now = clock.Now
	streams := []Stream{{Pod: "ns/1", Model: "m1"}, {Pod: "ns/2", Model: "m2"}, {Pod: "ns/3", Model: "m3"}}
	for i, s := range streams {
		clock.Advance(time.Second)
		storePrompt(t, idx, s, i, 4)
	}
	if _, ok := idx.BlockSize("m1"); ok {
		t.Fatal("model m1 kept past MaxContexts")
	}
	if got := len(idx.Stats()); got != 2 {
		t.Fatalf("%d models indexed, want 2", got)
	}
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_evicted_blocks_total", map[string]string{"reason": reasonContext}); got != 4 {
		t.Errorf("context_capacity evictions = %v, want 4", got)
	}
	// Resetting or purging the dropped model's pod changes no count.
	idx.ResetStream(streams[0])
	idx.PurgePod(streams[0].Pod)
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
	// The dropped model's pod comes back on its next batch.
	clock.Advance(time.Second)
	storePrompt(t, idx, streams[0], 0, 4)
	if got := promptBlocks(idx, streams[0], 0, 4); got != 4 {
		t.Errorf("m1 after its pod's next batch: %d blocks, want 4", got)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

func TestBoundsHoldUnderRandomEvents(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			idx, _ := newTestTable(t, Config{MaxPrefixesPerContext: 50, MaxPrefixes: 80, MaxContexts: 2})
			clock := testsupport.NewClock(time.Now())
			idx.now = clock.Now
			models := []*refModel{
				newRefModel(rng, "m1", 4, 2, "ns/p0", "ns/p1"),
				newRefModel(rng, "m2", 4, 1, "ns/p2"),
				newRefModel(rng, "m3", 8, 1, "ns/p3"),
			}
			// The reference is not consulted: evictions make it diverge.
			ref := &reference{lanes: map[laneID]map[uint64]string{}}
			for step := 0; step < 800; step++ {
				if rng.IntN(4) == 0 {
					clock.Advance(time.Second)
				}
				m := models[rng.IntN(len(models))]
				s := Stream{Pod: m.pods[rng.IntN(len(m.pods))], Rank: rng.IntN(m.ranks), Model: m.name}
				switch op := rng.IntN(10); {
				case op < 6:
					stepStore(t, rng, idx, ref, m, s, 1, "")
				case op < 9:
					stepRemove(t, rng, idx, ref, s)
				default:
					idx.PurgePod(s.Pod)
				}
				if err := checkInvariants(idx); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if n := idx.total.Load(); n > 80 {
					t.Fatalf("step %d: %d keys exceed MaxPrefixes", step, n)
				}
				if n := len(*idx.models.Load()); n > 2 {
					t.Fatalf("step %d: %d models exceed MaxContexts", step, n)
				}
			}
		})
	}
}

func TestRunSweepsUntilCanceled(t *testing.T) {
	defer goleak.VerifyNone(t)
	idx, _ := newTestTable(t, Config{EvictionInterval: time.Millisecond, EvictionDuration: time.Millisecond})
	storePrompt(t, idx, podA, 0, 2)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- idx.Run(ctx) }()
	testsupport.Eventually(t, "the idle pod and its model to be swept", func() bool { return len(idx.Stats()) == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
}
