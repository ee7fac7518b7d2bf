package sim

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

const testBS = 4

func newTestCache(t *testing.T, numBlocks int) *KVCache {
	t.Helper()
	c, err := NewKVCache(KVCacheConfig{NumBlocks: numBlocks, BlockSize: testBS, HashSeed: "test", Events: true})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// seqTokens returns n tokens starting at first: first, first+1, ...
func seqTokens(first, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(first + i)
	}
	return out
}

// admit schedules a new sequence the way the scheduler does: reuse the hit
// blocks, then compute the rest in one step.
func admit(t *testing.T, c *KVCache, s *Sequence) (hitBlocks int) {
	t.Helper()
	hit := c.ComputedBlocks(s)
	if !c.AllocateSlots(s, 0, hit, s.Len()-hit*c.BlockSize()) {
		t.Fatalf("AllocateSlots failed with %d free blocks", c.NumFreeBlocks())
	}
	return hit
}

func hashesOf(s *Sequence) []kvevent.BlockHash {
	out := make([]kvevent.BlockHash, len(s.digests))
	for i, d := range s.digests {
		out[i] = d.blockHash()
	}
	return out
}

func stored(t *testing.T, ev kvevent.KVEvent) *kvevent.BlockStoredEvent {
	t.Helper()
	st, ok := ev.(*kvevent.BlockStoredEvent)
	if !ok {
		t.Fatalf("event %T, want BlockStored", ev)
	}
	return st
}

func removedHashes(t *testing.T, evs []kvevent.KVEvent) []kvevent.BlockHash {
	t.Helper()
	var out []kvevent.BlockHash
	for _, ev := range evs {
		rm, ok := ev.(*kvevent.BlockRemovedEvent)
		if !ok {
			t.Fatalf("event %T, want BlockRemoved", ev)
		}
		if len(rm.BlockHashes) != 1 || rm.Medium != kvevent.MediumGPU {
			t.Fatalf("BlockRemoved %+v: want one GPU hash per event", rm)
		}
		out = append(out, rm.BlockHashes...)
	}
	return out
}

func TestPrefillCachesOnlyFullBlocksInOneEvent(t *testing.T) {
	c := newTestCache(t, 8)
	s := c.NewSequence(seqTokens(100, 10), nil) // 2 full blocks + 2 tokens
	admit(t, c, s)
	if s.NumBlocks() != 3 {
		t.Fatalf("holds %d blocks, want 3", s.NumBlocks())
	}
	evs := c.TakeEvents()
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1 BlockStored", len(evs))
	}
	st := stored(t, evs[0])
	if !slices.Equal(st.BlockHashes, hashesOf(s)) || st.HasParent {
		t.Errorf("hashes %v parent %v, want %v without parent", st.BlockHashes, st.HasParent, hashesOf(s))
	}
	if !slices.Equal(st.TokenIDs, seqTokens(100, 8)) || st.BlockSize != testBS {
		t.Errorf("tokens %v block size %d, want the 8 tokens of the full blocks", st.TokenIDs, st.BlockSize)
	}
	if st.Medium != kvevent.MediumGPU || st.GroupIdx != 0 || len(st.ExtraKeys) != 2 || st.ExtraKeys[0] != nil {
		t.Errorf("event %+v: want GPU medium, group 0, one nil extra key per block", st)
	}
	if len(c.TakeEvents()) != 0 {
		t.Error("TakeEvents returned the same events twice")
	}
}

func TestChunkedPrefillChainsEventsThroughParents(t *testing.T) {
	c := newTestCache(t, 8)
	s := c.NewSequence(seqTokens(0, 11), nil)
	if !c.AllocateSlots(s, 0, 0, 6) { // first chunk: block 0 full
		t.Fatal("allocate chunk 1")
	}
	if !c.AllocateSlots(s, 6, 0, 5) { // second chunk: block 1 full, block 2 partial
		t.Fatal("allocate chunk 2")
	}
	evs := c.TakeEvents()
	if len(evs) != 2 {
		t.Fatalf("%d events, want one BlockStored per step", len(evs))
	}
	h := hashesOf(s)
	first, second := stored(t, evs[0]), stored(t, evs[1])
	if !slices.Equal(first.BlockHashes, h[:1]) || first.HasParent {
		t.Errorf("chunk 1 stored %v parent %v, want %v without parent", first.BlockHashes, first.HasParent, h[:1])
	}
	if !slices.Equal(second.BlockHashes, h[1:2]) || !second.HasParent || second.ParentBlockHash != h[0] {
		t.Errorf("chunk 2 stored %v parent %x, want %v with parent %x", second.BlockHashes, second.ParentBlockHash, h[1:2], h[0])
	}
	if !slices.Equal(second.TokenIDs, seqTokens(4, 4)) {
		t.Errorf("chunk 2 tokens %v, want block 1's", second.TokenIDs)
	}
}

func TestDecodeFilledBlockIsStoredWhenItsLastTokenIsScheduled(t *testing.T) {
	c := newTestCache(t, 8)
	s := c.NewSequence(seqTokens(0, 7), nil)
	admit(t, c, s) // block 0 stored, block 1 holds 3 tokens
	c.TakeEvents()

	s.Append(900) // sampled by the prefill step: block 1 is now full
	if !c.AllocateSlots(s, 7, 0, 1) {
		t.Fatal("decode step 1")
	}
	evs := c.TakeEvents()
	if len(evs) != 1 {
		t.Fatalf("%d events after the decode step that fills block 1, want 1", len(evs))
	}
	st := stored(t, evs[0])
	h := hashesOf(s)
	if !slices.Equal(st.BlockHashes, h[1:2]) || st.ParentBlockHash != h[0] || !st.HasParent {
		t.Errorf("stored %v parent %x, want %v under %x", st.BlockHashes, st.ParentBlockHash, h[1:2], h[0])
	}
	if want := []uint32{4, 5, 6, 900}; !slices.Equal(st.TokenIDs, want) {
		t.Errorf("tokens %v, want %v (prompt tail and sampled token)", st.TokenIDs, want)
	}

	s.Append(901)
	if !c.AllocateSlots(s, 8, 0, 1) {
		t.Fatal("decode step 2")
	}
	if evs := c.TakeEvents(); len(evs) != 0 {
		t.Errorf("decode step into a fresh block emitted %v", evs)
	}
	if s.NumBlocks() != 3 {
		t.Errorf("holds %d blocks, want 3", s.NumBlocks())
	}
}

func TestComputedBlocksNeverCoversTheLastToken(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tokens  int
		wantHit int
	}{
		{"prompt ends on a block boundary recomputes that block", 8, 1},
		{"one token past a boundary hits both blocks", 9, 2},
		{"shorter than a block hits nothing", 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCache(t, 8)
			a := c.NewSequence(seqTokens(0, 12), nil)
			admit(t, c, a)
			b := c.NewSequence(seqTokens(0, tc.tokens), nil)
			if got := c.ComputedBlocks(b); got != tc.wantHit {
				t.Errorf("ComputedBlocks = %d, want %d", got, tc.wantHit)
			}
			if got, want := c.CachedPrefixBlocks(seqTokens(0, tc.tokens), nil), tc.tokens/testBS; got != want {
				t.Errorf("CachedPrefixBlocks = %d, want every full block (%d)", got, want)
			}
		})
	}
}

func TestSharedBlocksAreRefCounted(t *testing.T) {
	c := newTestCache(t, 8) // 7 usable
	a := c.NewSequence(seqTokens(0, 9), nil)
	admit(t, c, a) // 3 blocks
	b := c.NewSequence(seqTokens(0, 9), nil)
	if hit := admit(t, c, b); hit != 2 {
		t.Fatalf("second request hit %d blocks, want 2", hit)
	}
	if c.NumFreeBlocks() != 3 {
		t.Fatalf("%d free blocks, want 3 (2 shared + 2 private in use)", c.NumFreeBlocks())
	}
	if !slices.Equal(a.blocks[:2], b.blocks[:2]) || a.blocks[2] == b.blocks[2] {
		t.Fatalf("blocks %v and %v: want the two full blocks shared, the partial one private", a.blocks, b.blocks)
	}
	c.Free(a)
	if c.NumFreeBlocks() != 4 {
		t.Errorf("%d free after the first owner finished, want 4: shared blocks stay held", c.NumFreeBlocks())
	}
	c.Free(b)
	if c.NumFreeBlocks() != 7 {
		t.Errorf("%d free after both finished, want 7", c.NumFreeBlocks())
	}
	if got := c.CachedPrefixBlocks(seqTokens(0, 8), nil); got != 2 {
		t.Errorf("after free %d blocks still cached, want 2: freeing does not evict", got)
	}
}

func TestEvictionIsLRUWithAFinishedRequestsTailFirst(t *testing.T) {
	c := newTestCache(t, 5) // usable blocks 1..4
	a := c.NewSequence(seqTokens(0, 12), nil)
	admit(t, c, a) // blocks 1,2,3 all full and cached
	c.Free(a)      // free queue: 4, then a's blocks last first: 3, 2, 1
	c.TakeEvents()
	if evs := c.TakeEvents(); len(evs) != 0 {
		t.Fatalf("freeing emitted %v; BlockRemoved must wait for eviction", evs)
	}

	h := hashesOf(a)
	b := c.NewSequence(seqTokens(1000, 5), nil) // needs 2 blocks: 4 (never cached), then 3
	admit(t, c, b)
	evs := c.TakeEvents()
	if got := removedHashes(t, evs[:len(evs)-1]); !slices.Equal(got, h[2:3]) {
		t.Errorf("first eviction removed %x, want a's last block %x", got, h[2:3])
	}
	d := c.NewSequence(seqTokens(2000, 5), nil) // 2 more: evicts a's block 1, then block 0
	admit(t, c, d)
	evs = c.TakeEvents()
	if got := removedHashes(t, evs[:len(evs)-1]); !slices.Equal(got, []kvevent.BlockHash{h[1], h[0]}) {
		t.Errorf("evictions removed %x, want %x then %x", got, h[1], h[0])
	}
	if c.CachedPrefixBlocks(seqTokens(0, 12), nil) != 0 {
		t.Error("evicted blocks are still found")
	}
}

func TestHitBlocksLeaveTheFreeQueueBeforeAllocation(t *testing.T) {
	c := newTestCache(t, 5) // usable 1..4
	a := c.NewSequence(seqTokens(0, 8), nil)
	admit(t, c, a) // blocks 1,2
	c.Free(a)      // queue: 3, 4, 2, 1
	c.TakeEvents()

	// Same first block, then 9 new tokens: needs its hit block 1 and 3 new
	// blocks, exactly the 4 usable ones. The hit must not be evicted.
	b := c.NewSequence(append(seqTokens(0, 4), seqTokens(500, 9)...), nil)
	if hit := admit(t, c, b); hit != 1 {
		t.Fatalf("hit %d blocks, want 1", hit)
	}
	evs := c.TakeEvents()
	if got := removedHashes(t, evs[:1]); !slices.Equal(got, hashesOf(a)[1:2]) {
		t.Errorf("evicted %x, want only a's second block %x", got, hashesOf(a)[1])
	}
	st := stored(t, evs[1])
	if !st.HasParent || st.ParentBlockHash != hashesOf(a)[0] || len(st.BlockHashes) != 2 {
		t.Errorf("stored %+v: want the 2 new full blocks chained under the hit block", st)
	}
}

func TestAllocationFailureChangesNothing(t *testing.T) {
	c := newTestCache(t, 4) // 3 usable
	a := c.NewSequence(seqTokens(0, 8), nil)
	admit(t, c, a)
	c.Free(a)
	c.TakeEvents()
	b := c.NewSequence(append(seqTokens(0, 4), seqTokens(50, 9)...), nil) // needs 1 hit + 3 new = 4 > 3
	hit := c.ComputedBlocks(b)
	if c.AllocateSlots(b, 0, hit, b.Len()-hit*testBS) {
		t.Fatal("AllocateSlots succeeded beyond capacity")
	}
	if b.NumBlocks() != 0 || c.NumFreeBlocks() != 3 || len(c.TakeEvents()) != 0 {
		t.Errorf("failed allocation left %d blocks held, %d free, events behind", b.NumBlocks(), c.NumFreeBlocks())
	}
	if c.CachedPrefixBlocks(seqTokens(0, 8), nil) != 2 {
		t.Error("failed allocation evicted cached blocks")
	}
}

func TestResetPrefixCacheRefusedWhileBlocksAreInUse(t *testing.T) {
	c := newTestCache(t, 8)
	a := c.NewSequence(seqTokens(0, 8), nil)
	admit(t, c, a)
	c.TakeEvents()
	if err := c.ResetPrefixCache(); !errors.Is(err, ErrBlocksInUse) {
		t.Fatalf("reset while in use: %v, want ErrBlocksInUse", err)
	}
	if len(c.TakeEvents()) != 0 || c.CachedPrefixBlocks(seqTokens(0, 8), nil) != 2 {
		t.Fatal("refused reset changed the cache")
	}
	c.Free(a)
	if err := c.ResetPrefixCache(); err != nil {
		t.Fatalf("reset when idle: %v", err)
	}
	evs := c.TakeEvents()
	if len(evs) != 1 || evs[0].GetType() != kvevent.EventTypeAllCleared {
		t.Fatalf("reset emitted %v, want one AllBlocksCleared", evs)
	}
	if c.CachedPrefixBlocks(seqTokens(0, 8), nil) != 0 {
		t.Error("blocks still cached after reset")
	}
	b := c.NewSequence(seqTokens(100, 28), nil) // uses all 7 blocks
	admit(t, c, b)
	for _, ev := range c.TakeEvents() {
		if ev.GetType() == kvevent.EventTypeBlockRemoved {
			t.Errorf("reused a cleared block and announced its removal: %+v", ev)
		}
	}
}

// vLLM looks the prefix cache up only when it schedules a waiting request,
// and caches a block as soon as a request is allocated the tokens that fill
// it, so identical prompts admitted in one step share their blocks. A
// second copy arises when a running request, which never looks the cache up
// again, fills a block that another request cached since: here A's prefill
// is chunked, B takes A's first block from the cache and computes the
// second itself, and A's next chunk computes that second block again.
func TestDuplicateBlocksAreCachedAndEvictedSeparately(t *testing.T) {
	c := newTestCache(t, 6) // usable 1..5, allocated in that order
	a := c.NewSequence(seqTokens(0, 9), nil)
	b := c.NewSequence(seqTokens(0, 9), nil)
	h := hashesOf(a)
	// Step 1: A's first chunk fills and caches its block 0 (block 1).
	if hit := c.ComputedBlocks(a); hit != 0 || !c.AllocateSlots(a, 0, 0, testBS) {
		t.Fatalf("allocate A's first chunk (hit %d)", hit)
	}
	// B, admitted in the same step, takes it from the cache and caches
	// its block 1 (block 2); its block 2 (block 3) is partial.
	hitB := c.ComputedBlocks(b)
	if hitB != 1 || !c.AllocateSlots(b, 0, hitB, 9-testBS) {
		t.Fatalf("allocate B (hit %d), want a hit on A's first block", hitB)
	}
	// Step 2: A, running, computes the rest of its prompt without looking
	// the cache up, and caches a second copy of block 1 (block 4).
	if !c.AllocateSlots(a, testBS, 0, 9-testBS) {
		t.Fatal("allocate A's second chunk")
	}
	evs := c.TakeEvents()
	if len(evs) != 3 || !slices.Equal(stored(t, evs[0]).BlockHashes, h[:1]) ||
		!slices.Equal(stored(t, evs[1]).BlockHashes, h[1:2]) || !slices.Equal(stored(t, evs[2]).BlockHashes, h[1:2]) {
		t.Fatalf("events %v: want block 0 stored once and block 1 twice", evs)
	}
	c.Free(a) // queue: A's partial block 5, its copy 4 (block 1 is B's too)
	c.Free(b) // then B's: 3, 2, 1
	d := c.NewSequence(seqTokens(100, 8), nil)
	admit(t, c, d) // evicts block 5 (uncached) and A's copy, block 4
	if got := removedHashes(t, c.TakeEvents()[:1]); !slices.Equal(got, h[1:2]) {
		t.Errorf("removed %x, want A's copy %x", got, h[1:2])
	}
	if n := c.CachedPrefixBlocks(seqTokens(0, 8), nil); n != 2 {
		t.Errorf("cached prefix blocks = %d after one copy was evicted, want 2: B's copy was lost with A's", n)
	}
}

func TestHashesDependOnSeedAndLoRA(t *testing.T) {
	mk := func(seed string) *KVCache {
		c, err := NewKVCache(KVCacheConfig{NumBlocks: 8, BlockSize: testBS, HashSeed: seed, Events: true})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1, c2 := mk("engine-a"), mk("engine-b")
	base := hashesOf(c1.NewSequence(seqTokens(0, 8), nil))
	if !slices.Equal(base, hashesOf(mk("engine-a").NewSequence(seqTokens(0, 8), nil))) {
		t.Error("same seed and tokens hashed differently")
	}
	if slices.Equal(base, hashesOf(c2.NewSequence(seqTokens(0, 8), nil))) {
		t.Error("engines with different seeds share hashes")
	}
	lora := &LoRA{Name: "sql-adapter", ID: 3}
	s := c1.NewSequence(seqTokens(0, 8), lora)
	if slices.Equal(base, hashesOf(s)) {
		t.Error("LoRA sequence shares the base model's hashes")
	}
	admit(t, c1, s)
	st := stored(t, c1.TakeEvents()[0])
	want := append([]byte{0x91, 0xa0 | 11}, "sql-adapter"...)
	if st.LoraName != "sql-adapter" || st.LoraID != 3 || !slices.Equal(st.ExtraKeys[1], want) {
		t.Errorf("LoRA event name %q id %d extra %x, want sql-adapter, 3, %x", st.LoraName, st.LoraID, st.ExtraKeys[1], want)
	}
	if c1.CachedPrefixBlocks(seqTokens(0, 8), nil) != 0 || c1.CachedPrefixBlocks(seqTokens(0, 8), lora) != 2 {
		t.Error("LoRA blocks visible to the base model or invisible to the adapter")
	}
}

func TestUsageCountsHeldBlocksOverUsableOnes(t *testing.T) {
	c := newTestCache(t, 5)
	if c.Usage() != 0 {
		t.Fatalf("empty usage %v", c.Usage())
	}
	s := c.NewSequence(seqTokens(0, 6), nil)
	admit(t, c, s)
	if c.Usage() != 0.5 {
		t.Errorf("usage %v with 2 of 4 usable blocks held, want 0.5", c.Usage())
	}
	c.Free(s)
	if c.Usage() != 0 {
		t.Errorf("usage %v after free, want 0: cached free blocks are not in use", c.Usage())
	}
}

// BenchmarkKVCacheAllocateFree admits and frees 512-token requests (32
// blocks of 16) that share a 256-token system prompt, on a pool of 4096
// blocks that holds a quarter of the distinct blocks, so most allocations
// evict: the block-pool path of every scheduler admission, events included.
func BenchmarkKVCacheAllocateFree(b *testing.B) {
	c, err := NewKVCache(KVCacheConfig{NumBlocks: 4096, BlockSize: 16, HashSeed: "bench", Events: true})
	if err != nil {
		b.Fatal(err)
	}
	system := seqTokens(1, 256)
	seqs := make([]*Sequence, 512)
	for i := range seqs {
		seqs[i] = c.NewSequence(append(slices.Clone(system), seqTokens(1000+i*256, 256)...), nil)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s := seqs[i%len(seqs)]
		i++
		hit := c.ComputedBlocks(s)
		if !c.AllocateSlots(s, 0, hit, s.Len()-hit*16) {
			b.Fatal("allocate")
		}
		c.Free(s)
		c.TakeEvents()
	}
}

// BenchmarkSequenceHash hashes the 32 blocks of a 512-token prompt.
func BenchmarkSequenceHash(b *testing.B) {
	c, err := NewKVCache(KVCacheConfig{NumBlocks: 16, BlockSize: 16, HashSeed: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	prompt := seqTokens(7, 512)
	b.SetBytes(int64(4 * len(prompt)))
	b.ReportAllocs()
	for b.Loop() {
		c.NewSequence(prompt, nil)
	}
}

// BenchmarkCachedPrefixBlocks looks up an 8,192-token prompt whose first
// quarter is cached, as a router's oracle does for every engine.
func BenchmarkCachedPrefixBlocks(b *testing.B) {
	c, err := NewKVCache(KVCacheConfig{NumBlocks: 1024, BlockSize: 16, HashSeed: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	prompt := seqTokens(7, 8192)
	if s := c.NewSequence(prompt[:2048], nil); !c.AllocateSlots(s, 0, 0, s.Len()) {
		b.Fatal("AllocateSlots failed")
	}
	b.ReportAllocs()
	for b.Loop() {
		if n := c.CachedPrefixBlocks(prompt, nil); n != 128 {
			b.Fatalf("%d blocks cached, want 128", n)
		}
	}
}
