package indexer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
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
	idx, reg, clock := newClockedTable(t, Config{MaxPrefixesPerContext: 64})
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
	idx, reg, clock := newClockedTable(t, Config{MaxPrefixes: 40})
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
	idx, reg, clock := newClockedTable(t, Config{MaxContexts: 2})
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
			idx, _, clock := newClockedTable(t, Config{MaxPrefixesPerContext: 50, MaxPrefixes: 80, MaxContexts: 2})
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

func TestWaterLevel(t *testing.T) {
	for _, tc := range []struct {
		charges      []int
		batch, level int
	}{
		{[]int{1000, 100, 100}, 50, 950},
		{[]int{1000, 100, 100}, 900, 100},
		{[]int{1000, 100, 100}, 901, 99},
		{[]int{600, 600}, 100, 550},
		{[]int{600, 600}, 101, 549},
		{[]int{10}, 10, 0},
		{[]int{5, 3}, 8, 0},
		{nil, 1, 0},
	} {
		if got := waterLevel(tc.charges, tc.batch); got != tc.level {
			t.Errorf("waterLevel(%v, %d) = %d, want %d", tc.charges, tc.batch, got, tc.level)
		}
	}
}

// residents returns the blocks each stream of the model holds, all lanes
// together.
func residents(idx *SyncPrefixHashTable, model string) map[Stream]int {
	out := map[Stream]int{}
	for _, ln := range idx.model(model).lanes {
		if ln != nil {
			out[Stream{Pod: ln.stream.id.pod, Rank: ln.stream.id.rank, Model: model}] += ln.m.blocks()
		}
	}
	return out
}

// chain stores n blocks of one chain for s, tokens from tok, engine hashes
// from hash, in events of 100 blocks applied as one batch.
func chain(tb testing.TB, idx *SyncPrefixHashTable, s Stream, hash uint64, tok, n int) {
	tb.Helper()
	batch := &kvevent.EventBatch{}
	for from := 0; from < n; from += 100 {
		k := min(100, n-from)
		var parent *uint64
		if from > 0 {
			parent = ptr(hash + uint64(from) - 1)
		}
		batch.Events = append(batch.Events, stored(hashSeq(hash+uint64(from), k), parent, tokenRange(tok+16*from, 16*k), 16))
	}
	if err := idx.ApplyBatch(s, batch); err != nil {
		tb.Fatal(err)
	}
}

func TestAFloodingPodEvictsOnlyItsOwnBlocks(t *testing.T) {
	idx, reg, clock := newClockedTable(t, Config{MaxPrefixesPerContext: 1000})
	flooder := Stream{Pod: "ns/flood", Model: "llama"}
	quiet := Stream{Pod: "ns/quiet", Model: "llama"}
	dp0 := Stream{Pod: "ns/dp", Model: "llama"}
	dp1 := Stream{Pod: "ns/dp", Rank: 1, Model: "llama"}
	// A prefix every pod holds, then each stream's own blocks, all older
	// than anything the flooder sends next.
	for _, s := range []Stream{flooder, quiet, dp0, dp1} {
		chain(t, idx, s, 1, 0, 10)
	}
	chain(t, idx, quiet, 1000, 1<<20, 140)
	chain(t, idx, dp0, 1000, 2<<20, 140)
	chain(t, idx, dp1, 1000, 3<<20, 140)
	chain(t, idx, flooder, 1000, 4<<20, 50)
	clock.Advance(10 * time.Second)
	chain(t, idx, flooder, 10000, 5<<20, 3000)
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
	res := residents(idx, "llama")
	for _, s := range []Stream{quiet, dp0, dp1} {
		if res[s] != 150 {
			t.Errorf("%s rank %d holds %d blocks after the flood, want all its 150", s.Pod, s.Rank, res[s])
		}
	}
	// The flooder ends at the bound less the others' blocks that are not
	// its own: 1,000 keys, 430 of which only others hold.
	if got := res[flooder]; got < 540 || got > 570 {
		t.Errorf("the flooder holds %d blocks, want about 570", got)
	}
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_evicted_blocks_total", map[string]string{"reason": reasonCapacity}); int(got) != 3060-res[flooder] {
		t.Errorf("capacity evictions = %v, want %d", got, 3060-res[flooder])
	}
	// Its oldest blocks went first: the shared prefix and its older chain.
	blocks, _ := match(idx, "llama", "", tokenRange(0, 160), "ns/flood", "ns/quiet", "ns/dp")
	if blocks["ns/flood"] != 0 || blocks["ns/quiet"] != 10 || blocks["ns/dp"] != 10 {
		t.Errorf("shared prefix after the flood: %v, want the flooder's copy gone and the others' kept", blocks)
	}
	if b, _ := match(idx, "llama", "", tokenRange(4<<20, 16*50), "ns/flood"); b["ns/flood"] != 0 {
		t.Errorf("the flooder's older chain kept %d blocks, want 0", b["ns/flood"])
	}
}

func TestEvictionTakesFromTheStreamsThatHoldTheMost(t *testing.T) {
	idx, _, clock := newClockedTable(t, Config{MaxPrefixesPerContext: 1000})
	x := Stream{Pod: "ns/x", Model: "llama"}
	y := Stream{Pod: "ns/y", Model: "llama"}
	z := Stream{Pod: "ns/z", Model: "llama"}
	chain(t, idx, x, 1000, 1<<20, 700)
	chain(t, idx, z, 1000, 2<<20, 100)
	clock.Advance(10 * time.Second)
	// y's blocks are newer than x's, but x holds more: x pays until they
	// hold as many, then both do, and z, which holds the least, nothing.
	for i := 0; i < 6; i++ {
		chain(t, idx, y, uint64(10000+100*i), 3<<20+1600*i, 100)
		clock.Advance(time.Second)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
	res := residents(idx, "llama")
	if res[z] != 100 {
		t.Errorf("z holds %d blocks, want its 100", res[z])
	}
	if d := res[x] - res[y]; d < -40 || d > 40 || res[x]+res[y] > 900 {
		t.Errorf("x holds %d and y %d blocks, want about 450 each", res[x], res[y])
	}
}
