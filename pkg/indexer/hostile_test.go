package indexer

import (
	"math/rand/v2"
	"slices"
	"testing"

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
