package indexer

import (
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/sim"
)

// vLLM caches a second copy of a block when a running request fills a block
// that another request cached in the meantime: here a prefill in two
// chunks, overtaken by an identical prompt between them. Evicting one copy
// sends a BlockRemoved of the hash while the other stays cached. The second
// copy is stored a step after the first, so counting only repeats within
// one batch as copies would not catch it, and the index cannot tell a
// second copy from a re-announced block (see the package documentation): it
// may forget the block until the engine stores the prefix again, but it
// must never credit the pod with more than the engine caches.
func TestDuplicatedBlocksNeverCreditMoreThanTheEngineCaches(t *testing.T) {
	const bs = 16
	c, err := sim.NewKVCache(sim.KVCacheConfig{NumBlocks: 9, BlockSize: bs, HashSeed: "s", Events: true})
	if err != nil {
		t.Fatal(err)
	}
	idx, reg := newTestTable(t, Config{})
	// step applies the events of one engine step as one batch and checks
	// that the index credits no more leading blocks of prompts than the
	// engine caches.
	step := func(what string, prompts ...[]uint32) {
		t.Helper()
		mustApply(t, idx, podA, c.TakeEvents()...)
		for _, p := range prompts {
			engine := c.CachedPrefixBlocks(p, nil)
			blocks, _ := match(idx, "llama", "", p, "ns/a")
			if blocks["ns/a"] > engine {
				t.Fatalf("%s: the engine caches %d leading blocks of a prompt, the index credits %d", what, engine, blocks["ns/a"])
			}
			t.Logf("%s: engine caches %d leading blocks of a %d-token prompt, index credits %d",
				what, engine, len(p), blocks["ns/a"])
		}
		if err := checkInvariants(idx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	prompt := tokenRange(0, 3*bs+1)
	longer := tokenRange(0, 4*bs+1)

	a := c.NewSequence(prompt, nil)
	if !c.AllocateSlots(a, 0, c.ComputedBlocks(a), bs) {
		t.Fatal("allocate the first chunk of a")
	}
	step("a's first chunk", prompt)
	b := c.NewSequence(prompt, nil)
	hit := c.ComputedBlocks(b)
	if hit != 1 || !c.AllocateSlots(b, 0, hit, len(prompt)-hit*bs) {
		t.Fatalf("b hits %d blocks, want a's first; or could not allocate", hit)
	}
	step("b overtakes a", prompt)
	// a's second chunk caches its own copies of blocks 1 and 2.
	if !c.AllocateSlots(a, bs, 0, len(prompt)-bs) {
		t.Fatal("allocate the rest of a")
	}
	step("a's second chunk", prompt)
	c.Free(a)
	c.Free(b)
	// An unrelated request evicts a's copies, the head of the free queue.
	u := c.NewSequence(tokenRange(5000, 4*bs), nil)
	if !c.AllocateSlots(u, 0, 0, 4*bs) {
		t.Fatal("allocate u")
	}
	step("one copy evicted", prompt)
	c.Free(u)
	if got := c.CachedPrefixBlocks(prompt, nil); got != 3 {
		t.Fatalf("setup: the engine caches %d blocks of the prompt, want b's 3", got)
	}
	// A request extending the prompt hits b's copies and caches block 3,
	// chained from a block the index no longer holds.
	d := c.NewSequence(longer, nil)
	hit = c.ComputedBlocks(d)
	if hit != 3 || !c.AllocateSlots(d, 0, hit, len(longer)-hit*bs) {
		t.Fatalf("d hits %d blocks, want 3; or could not allocate", hit)
	}
	step("extension", prompt, longer)
	misses := testsupport.MetricValue(t, reg, "kvgate_indexer_parent_misses_total", nil)
	t.Logf("parent misses: %v", misses)
	// Storing the prefix again from block 0 heals the chain.
	c.Free(d)
	if err := c.ResetPrefixCache(); err != nil {
		t.Fatal(err)
	}
	e := c.NewSequence(longer, nil)
	if !c.AllocateSlots(e, 0, c.ComputedBlocks(e), len(longer)) {
		t.Fatal("allocate e")
	}
	step("recomputed", prompt, longer)
	if blocks, _ := match(idx, "llama", "", longer, "ns/a"); blocks["ns/a"] != 4 {
		t.Fatalf("after the engine recomputed the prompt the index credits %d blocks, want 4", blocks["ns/a"])
	}
}
