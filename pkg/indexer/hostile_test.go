package indexer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

// Each test here plays an engine that sends what no vLLM sends, by fault or
// on purpose, and asserts that the index stays bounded in time and exact.

// inverseMixA is the multiplicative inverse of mixA modulo 2^64.
func inverseMixA() uint64 {
	inv := uint64(mixA) // correct to 3 bits for an odd number; Newton doubles them
	for range 5 {
		inv *= 2 - mixA*inv
	}
	return inv
}

// laneProbes is the number of slots that looking up every entry of m reads.
func laneProbes(m *laneMap) int {
	c, probes := m.slots(), 0
	for i := range c {
		if m.key(i) != 0 {
			probes += (i-m.salt.home(m.hash(i), c)+c)%c + 1
		}
	}
	return probes
}

// TestCraftedEngineHashesDoNotShareAProbeSequence stores blocks whose engine
// hashes an attacker chose so that an unkeyed multiply places them all in
// the first slot of any lane map, which made each store probe every block
// before it. Placed by the table's secret, they cost what any hashes cost:
// a few probes per lookup, counted rather than timed.
func TestCraftedEngineHashesDoNotShareAProbeSequence(t *testing.T) {
	const n = 10000
	idx, _ := newTestTable(t, Config{})
	inv := inverseMixA()
	hashes := make([]uint64, n)
	for i := range hashes {
		// hash*mixA == i+1: the product's top bits are 0 for every one.
		hashes[i] = uint64(i+1) * inv
	}
	for from := 0; from < n; from += 500 {
		var parent *uint64
		if from > 0 {
			parent = &hashes[from-1]
		}
		mustApply(t, idx, podA, stored(hashes[from:from+500], parent, tokenRange(from*16, 500*16), 16))
	}
	ln := idx.model("llama").lanes[0]
	if ln.m.n != n {
		t.Fatalf("lane holds %d blocks, want %d", ln.m.n, n)
	}
	if probes := laneProbes(&ln.m); probes > 4*n {
		t.Fatalf("looking up the %d crafted hashes reads %d slots, want at most %d", n, probes, 4*n)
	}
	if blocks, _ := match(idx, "llama", "", tokenRange(0, n*16), "ns/a"); blocks["ns/a"] != n {
		t.Fatalf("matched %d blocks, want %d", blocks["ns/a"], n)
	}
	mustApply(t, idx, podA, &kvevent.BlockRemovedEvent{BlockHashes: hashes, Medium: kvevent.MediumGPU, GroupIdx: kvevent.NoGroup})
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
	if st := idx.Stats(); st[0].Entries != 0 {
		t.Fatalf("%d entries left after removing every crafted block", st[0].Entries)
	}
}

// keySetProbes is the number of slots that looking up every key of s reads.
func keySetProbes(s *keySet) int {
	c, probes := len(s.slots), 0
	for i, k := range s.slots {
		if k != 0 {
			probes += (i-s.home(k)+c)%c + 1
		}
	}
	return probes
}

// TestEvictionBatchesDoNotShareAProbeSequence builds the set of an eviction
// batch as a scan of the key table yields it: keys of one shard, in slot
// order, so that they share their top bits. Placed by those bits, a batch
// of n keys filled a sixteenth of the set's slots and each lookup probed
// through much of the batch: eviction grew with the square of the batch.
func TestEvictionBatchesDoNotShareAProbeSequence(t *testing.T) {
	const n = 20000
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = rng.Uint64()>>shardBits | 3<<(64-shardBits)
	}
	slices.Sort(keys)
	set := newKeySet(n)
	for _, k := range keys {
		set.add(k)
	}
	if probes := keySetProbes(&set); probes > 4*n {
		t.Fatalf("looking up the %d keys of a batch reads %d slots, want at most %d", n, probes, 4*n)
	}
	for _, k := range keys {
		if !set.has(k) {
			t.Fatalf("key %x lost", k)
		}
	}
	if set.has(keys[0] + 1) {
		t.Fatal("a key never added is in the set")
	}
}

// TestLanesPerStreamAreBounded plays an engine that names a new medium or
// KV-cache group in every event. Each lane is a holder id, and every 64 ids
// widen every slot of the model's table: unbounded, one batch of such events
// rebuilt the whole table again and again and made every match copy more
// words per block, for the other pods' keys too.
func TestLanesPerStreamAreBounded(t *testing.T) {
	const events = 1000
	idx, reg := newTestTable(t, Config{})
	mustApply(t, idx, podA, stored(hashSeq(1, 2), nil, tokenRange(0, 32), 16))
	mustApply(t, idx, podB, stored(hashSeq(1, 2), nil, tokenRange(0, 32), 16))
	batch := &kvevent.EventBatch{}
	for i := range events {
		e := stored([]uint64{uint64(1000 + i)}, nil, tokenRange(10000+16*i, 16), 16)
		if i%2 == 0 {
			e.Medium = "tier-" + itoa(i)
		} else {
			e.GroupIdx = i
		}
		batch.Events = append(batch.Events, e)
	}
	if err := idx.ApplyBatch(podA, batch); err == nil {
		t.Error("a batch whose blocks were skipped at the lane limit returned no error")
	}
	m := idx.model("llama")
	if n := len(idx.pods["ns/a"].streams[0].lanes); n != maxLanesPerStream {
		t.Fatalf("the stream has %d lanes, want %d", n, maxLanesPerStream)
	}
	if len(m.lanes) != maxLanesPerStream+1 || m.keys.width != 1 {
		t.Fatalf("%d holder ids in %d words, want %d in 1", len(m.lanes), m.keys.width, maxLanesPerStream+1)
	}
	want := float64(events - (maxLanesPerStream - 1))
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_skipped_blocks_total", map[string]string{"reason": reasonLaneLimit}); got != want {
		t.Errorf("skipped lane_limit blocks = %v, want %v", got, want)
	}
	// The engine's blocks in its first lanes stay indexed; a new medium
	// finds no lane while every lane holds blocks.
	blocks, _ := match(idx, "llama", "", tokenRange(0, 32), "ns/a", "ns/b")
	if blocks["ns/a"] != 2 || blocks["ns/b"] != 2 {
		t.Fatalf("a=%d b=%d, want 2 2", blocks["ns/a"], blocks["ns/b"])
	}
	cpu := stored(hashSeq(50, 1), nil, tokenRange(500, 16), 16)
	cpu.Medium = kvevent.MediumCPU
	if err := idx.ApplyBatch(podA, &kvevent.EventBatch{Events: []kvevent.KVEvent{cpu}}); err == nil {
		t.Error("a block past the lane limit was stored without an error")
	}
	if blocks, _ := match(idx, "llama", "", tokenRange(500, 16), "ns/a"); blocks["ns/a"] != 0 {
		t.Fatalf("a block past the lane limit matched %d blocks", blocks["ns/a"])
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
	// Once cleared, the stream's empty lanes take new media and groups,
	// with the holder ids the stream already has.
	mustApply(t, idx, podA, &kvevent.AllBlocksClearedEvent{}, cpu)
	if blocks, gpu := match(idx, "llama", "", tokenRange(500, 16), "ns/a"); blocks["ns/a"] != 1 || gpu["ns/a"] != 0 {
		t.Fatalf("after a clear, a CPU block matched %d blocks (%d on GPU), want 1 (0)", blocks["ns/a"], gpu["ns/a"])
	}
	if len(m.lanes) != maxLanesPerStream+1 {
		t.Fatalf("%d holder ids after the clear, want %d", len(m.lanes), maxLanesPerStream+1)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

// TestLongMediumNamesAreKeptCut plays an engine that names its media with
// megabytes: each lane kept the whole name for as long as the stream lived.
func TestLongMediumNamesAreKeptCut(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	long := strings.Repeat("x", 1<<20)
	for _, medium := range []string{long + "a", long + "b"} {
		e := stored(hashSeq(1, 1), nil, tokenRange(0, 16), 16)
		e.Medium = medium
		mustApply(t, idx, podA, e)
	}
	lanes := idx.Stats()[0].Pods[0].Streams[0].Lanes
	if len(lanes) != 2 || lanes[0].Medium == lanes[1].Medium {
		t.Fatalf("two long media made %d lanes: %+v", len(lanes), lanes)
	}
	for _, ls := range lanes {
		if len(ls.Medium) > maxMediumBytes || !strings.HasPrefix(ls.Medium, "xxxx") {
			t.Fatalf("a lane keeps a medium name of %d bytes (%.8q...), want at most %d from the name", len(ls.Medium), ls.Medium, maxMediumBytes)
		}
	}
	// The names still tell the lanes apart.
	mustApply(t, idx, podA, removed(long+"a", kvevent.NoGroup, 1))
	if blocks, _ := match(idx, "llama", "", tokenRange(0, 16), "ns/a"); blocks["ns/a"] != 1 {
		t.Fatalf("removing a block from one long medium left %d blocks, want the other medium's 1", blocks["ns/a"])
	}
	mustApply(t, idx, podA, removed(long+"b", kvevent.NoGroup, 1))
	if st := idx.Stats(); st[0].Entries != 0 {
		t.Fatalf("%d entries left after both media removed the block", st[0].Entries)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}
