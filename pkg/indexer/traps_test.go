package indexer

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

// Each test here replays a scenario that a prefix index of another project
// gets wrong, and asserts the answer a router needs.

var (
	podA = Stream{Pod: "ns/a", Model: "llama"}
	podB = Stream{Pod: "ns/b", Model: "llama"}
)

func TestMultiBlockEventChainsEveryBlockFromThePreviousOne(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	// vLLM sends a whole prefill as one event: 4 blocks of 16 tokens.
	mustApply(t, idx, podA, stored(hashSeq(100, 4), nil, tokenRange(0, 64), 16))
	blocks, gpu := match(idx, "llama", "", tokenRange(0, 64), "ns/a")
	if blocks["ns/a"] != 4 || gpu["ns/a"] != 4 {
		t.Fatalf("4-block event matched %d blocks (%d on GPU), want 4", blocks["ns/a"], gpu["ns/a"])
	}
	// A continuation event chains from its parent's key.
	mustApply(t, idx, podA, stored(hashSeq(104, 2), ptr[uint64](103), tokenRange(64, 32), 16))
	if blocks, _ := match(idx, "llama", "", tokenRange(0, 96), "ns/a"); blocks["ns/a"] != 6 {
		t.Fatalf("after continuation matched %d blocks, want 6", blocks["ns/a"])
	}
}

func TestUnknownParentIsSkippedNotRootedAtTheStart(t *testing.T) {
	idx, reg := newTestTable(t, Config{})
	// Pod A announces blocks 2..3 of a prompt whose first blocks it stored
	// before the index started: their tokens are those of the prompt's
	// blocks 2..3, which happen to equal another prompt's blocks 0..1.
	mustApply(t, idx, podA, stored(hashSeq(10, 2), ptr[uint64](9), tokenRange(0, 32), 16))
	blocks, _ := match(idx, "llama", "", tokenRange(0, 32), "ns/a")
	if blocks["ns/a"] != 0 {
		t.Fatalf("blocks with an unknown parent matched %d blocks from the root, want 0", blocks["ns/a"])
	}
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_parent_misses_total", nil); got != 1 {
		t.Errorf("parent misses = %v, want 1", got)
	}
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_skipped_blocks_total", map[string]string{"reason": reasonParent}); got != 2 {
		t.Errorf("skipped unknown_parent blocks = %v, want 2", got)
	}
	// Children of a skipped block are unknown too.
	mustApply(t, idx, podA, stored(hashSeq(12, 1), ptr[uint64](11), tokenRange(32, 16), 16))
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_parent_misses_total", nil); got != 2 {
		t.Errorf("parent misses after a child of a skipped block = %v, want 2", got)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

func TestRemovalFromOnePodLeavesTheOthers(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	toks := tokenRange(0, 48)
	// Pods that share the engine seed name blocks by the same hashes.
	mustApply(t, idx, podA, stored(hashSeq(1, 3), nil, toks, 16))
	mustApply(t, idx, podB, stored(hashSeq(1, 3), nil, toks, 16))
	mustApply(t, idx, podA, removed("GPU", 0, 2))
	blocks, _ := match(idx, "llama", "", toks, "ns/a", "ns/b")
	if blocks["ns/a"] != 1 || blocks["ns/b"] != 3 {
		t.Fatalf("after pod A removed block 1: a=%d b=%d, want a=1 (no credit past the gap) b=3", blocks["ns/a"], blocks["ns/b"])
	}
	// The last holder going removes the key; entries never go negative.
	mustApply(t, idx, podB, removed("GPU", 0, 1, 2, 3))
	mustApply(t, idx, podA, removed("GPU", 0, 1, 3), removed("GPU", 0, 3))
	if st := idx.Stats(); st[0].Entries != 0 {
		t.Fatalf("entries after every holder removed every block = %d, want 0", st[0].Entries)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

func TestLoRAAdaptersNeverShareEntries(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	toks := tokenRange(0, 32)
	ev := stored(hashSeq(1, 2), nil, toks, 16)
	ev.LoraName, ev.LoraID = "sql", 3
	// vLLM puts the adapter name first in every block's extra keys.
	ev.ExtraKeys = [][]byte{msgpackExtras("sql", ""), msgpackExtras("sql", "")}
	mustApply(t, idx, podA, ev)
	idOnly := stored(hashSeq(11, 2), nil, toks, 16)
	idOnly.LoraID = 7
	mustApply(t, idx, podB, idOnly)

	for _, tc := range []struct {
		lora   string
		a, b   int
		reason string
	}{
		{"sql", 2, 0, "the adapter's own prompt matches its blocks"},
		{"", 0, 0, "a base-model prompt never matches adapter blocks"},
		{"chat", 0, 0, "another adapter never matches"},
		{"7", 0, 0, "an adapter known by id only is isolated from names"},
	} {
		blocks, _ := match(idx, "llama", tc.lora, toks, "ns/a", "ns/b")
		if blocks["ns/a"] != tc.a || blocks["ns/b"] != tc.b {
			t.Errorf("lora %q: a=%d b=%d, want a=%d b=%d: %s", tc.lora, blocks["ns/a"], blocks["ns/b"], tc.a, tc.b, tc.reason)
		}
	}
}

func TestRouterChunksByTheEngineBlockSizeInTokens(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	if _, ok := idx.BlockSize("llama"); ok {
		t.Fatal("block size known before any event")
	}
	// The engine runs with 32-token blocks; the router must not assume 16
	// nor count bytes.
	mustApply(t, idx, podA, stored(hashSeq(1, 2), nil, tokenRange(1000, 64), 32))
	if bs, ok := idx.BlockSize("llama"); !ok || bs != 32 {
		t.Fatalf("BlockSize = %d, %v; want 32, true", bs, ok)
	}
	var res MatchResult
	// 64 tokens and a partial third block: only whole blocks count.
	idx.MatchPrefix("llama", "", tokenRange(1000, 80), []string{"ns/a"}, &res)
	if res.BlockSize != 32 || res.PromptBlocks != 2 || res.Pods[0].Blocks != 2 || res.Pods[0].Tokens != 64 {
		t.Fatalf("MatchPrefix = %+v, want block size 32, 2 prompt blocks, pod credited 2 blocks / 64 tokens", res)
	}
	// A group-1 event of another block size does not change the router's.
	g1 := stored(hashSeq(50, 1), nil, tokenRange(1000, 48), 48)
	g1.GroupIdx = 1
	mustApply(t, idx, podA, g1)
	if bs, _ := idx.BlockSize("llama"); bs != 32 {
		t.Fatalf("BlockSize after a group-1 event = %d, want 32", bs)
	}
}

func TestEventsKeepAPodAliveAndIdlePodsArePurged(t *testing.T) {
	idx, reg, clock := newClockedTable(t, Config{EvictionDuration: 20 * 60e9})
	mustApply(t, idx, podA, stored(hashSeq(1, 2), nil, tokenRange(0, 32), 16))
	mustApply(t, idx, podB, stored(hashSeq(1, 2), nil, tokenRange(0, 32), 16))
	// Pod A keeps sending events and is never matched; pod B goes quiet.
	for i := 0; i < 30; i++ {
		clock.Advance(60e9)
		mustApply(t, idx, podA, stored(hashSeq(uint64(100+i), 1), nil, tokenRange(100*i, 16), 16))
		idx.sweep(clock.Now())
	}
	blocks, _ := match(idx, "llama", "", tokenRange(0, 32), "ns/a", "ns/b")
	if blocks["ns/a"] != 2 {
		t.Errorf("pod A, active only through events, matched %d blocks after 30 minutes, want 2", blocks["ns/a"])
	}
	if blocks["ns/b"] != 0 {
		t.Errorf("pod B, idle for 30 minutes, matched %d blocks, want 0 (purged)", blocks["ns/b"])
	}
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_evicted_blocks_total", map[string]string{"reason": reasonIdle}); got != 2 {
		t.Errorf("idle evictions = %v, want 2", got)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

func TestMatchesKeepAPodAlive(t *testing.T) {
	idx, _, clock := newClockedTable(t, Config{EvictionDuration: 10 * 60e9})
	mustApply(t, idx, podA, stored(hashSeq(1, 2), nil, tokenRange(0, 32), 16))
	for i := 0; i < 20; i++ {
		clock.Advance(60e9)
		match(idx, "llama", "", tokenRange(0, 32), "ns/a")
		idx.sweep(clock.Now())
	}
	if blocks, _ := match(idx, "llama", "", tokenRange(0, 32), "ns/a"); blocks["ns/a"] != 2 {
		t.Fatalf("pod matched every minute was purged: %d blocks, want 2", blocks["ns/a"])
	}
}

func TestHybridGroupsDoNotEvictEachOther(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	toks := tokenRange(0, 32)
	mustApply(t, idx, podA, stored(hashSeq(1, 2), nil, toks, 16))
	g1 := stored(hashSeq(1, 2), nil, toks, 16)
	g1.GroupIdx, g1.KVCacheSpecKind, g1.KVCacheSpecSlidingWindow = 1, "sliding_window", 64
	mustApply(t, idx, podA, g1)
	// The sliding-window group drops its copy of the same hashes.
	mustApply(t, idx, podA, removed("GPU", 1, 1, 2))
	if blocks, _ := match(idx, "llama", "", toks, "ns/a"); blocks["ns/a"] != 2 {
		t.Fatalf("removal in group 1 evicted group 0: %d blocks, want 2", blocks["ns/a"])
	}
	// Group 1 alone is not credited: group 0 decides reuse.
	mustApply(t, idx, podA, g1, removed("GPU", 0, 1, 2))
	if blocks, _ := match(idx, "llama", "", toks, "ns/a"); blocks["ns/a"] != 0 {
		t.Fatalf("only group 1 holds the blocks: %d blocks credited, want 0", blocks["ns/a"])
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

func TestMediaAreTrackedPerResidency(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	toks := tokenRange(0, 48)
	mustApply(t, idx, podA, stored(hashSeq(1, 3), nil, toks, 16))
	cpu := stored(hashSeq(1, 3), nil, toks, 16)
	cpu.Medium = kvevent.MediumCPU
	mustApply(t, idx, podA, cpu)
	// The GPU evicts block 2 (offloaded to CPU); the prefix stays usable.
	mustApply(t, idx, podA, removed("", kvevent.NoGroup, 3))
	blocks, gpu := match(idx, "llama", "", toks, "ns/a")
	if blocks["ns/a"] != 3 || gpu["ns/a"] != 2 {
		t.Fatalf("any=%d gpu=%d, want any=3 gpu=2", blocks["ns/a"], gpu["ns/a"])
	}
	// The CPU tier dropping block 0 leaves the GPU copy.
	mustApply(t, idx, podA, removed(kvevent.MediumCPU, kvevent.NoGroup, 1))
	blocks, gpu = match(idx, "llama", "", toks, "ns/a")
	if blocks["ns/a"] != 3 || gpu["ns/a"] != 2 {
		t.Fatalf("after CPU removal of block 0: any=%d gpu=%d, want any=3 gpu=2", blocks["ns/a"], gpu["ns/a"])
	}
}

func TestAPrefixSplitAcrossRanksIsCreditedToNeither(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	r0, r1 := podA, podA
	r1.Rank = 1
	toks := tokenRange(0, 64)
	mustApply(t, idx, r0, stored(hashSeq(1, 2), nil, toks[:32], 16))
	mustApply(t, idx, r1, stored(hashSeq(1, 4), nil, toks, 16))
	mustApply(t, idx, r1, removed("GPU", 0, 2))
	// Rank 0 holds blocks 0-1, rank 1 holds 0 and 2-3: best single rank is 2.
	if blocks, _ := match(idx, "llama", "", toks, "ns/a"); blocks["ns/a"] != 2 {
		t.Fatalf("pod credited %d blocks, want 2 (its best rank)", blocks["ns/a"])
	}
}

func TestExtraKeysKeepMultimodalBlocksFromPlainPrompts(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	toks := tokenRange(0, 48)
	ev := stored(hashSeq(1, 3), nil, toks, 16)
	// An image starts in block 1; cache_salt-like extras behave the same.
	ev.ExtraKeys = [][]byte{nil, msgpackExtras("", "img-1"), nil}
	mustApply(t, idx, podA, ev)
	if blocks, _ := match(idx, "llama", "", toks, "ns/a"); blocks["ns/a"] != 1 {
		t.Fatalf("plain prompt matched %d blocks of a prompt with an image in block 1, want 1", blocks["ns/a"])
	}
}

func TestMisalignedTokensAreSkippedWithAnError(t *testing.T) {
	idx, reg := newTestTable(t, Config{})
	// A sparse model sent more tokens than hashes: keys cannot be aligned.
	bad := stored(hashSeq(1, 2), nil, tokenRange(0, 40), 16)
	good := stored(hashSeq(7, 1), nil, tokenRange(500, 16), 16)
	err := idx.ApplyBatch(podA, &kvevent.EventBatch{Events: []kvevent.KVEvent{bad, good}})
	if err == nil || !strings.Contains(err.Error(), "event 0") || !strings.Contains(err.Error(), "40 tokens") {
		t.Fatalf("ApplyBatch error = %v, want one naming event 0 and its 40 tokens", err)
	}
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_skipped_blocks_total", map[string]string{"reason": reasonTokens}); got != 2 {
		t.Errorf("skipped token_mismatch blocks = %v, want 2", got)
	}
	if blocks, _ := match(idx, "llama", "", tokenRange(500, 16), "ns/a"); blocks["ns/a"] != 1 {
		t.Fatalf("the good event after a bad one was lost: %d blocks, want 1", blocks["ns/a"])
	}
}

func TestABlockSizeThatOverflowsTheTokenCountIsSkipped(t *testing.T) {
	idx, reg := newTestTable(t, Config{})
	// 4 blocks of 2^62 tokens are 2^64: a product that wraps to the 0
	// tokens sent.
	bad := stored(hashSeq(1, 4), nil, nil, 1<<62)
	good := stored(hashSeq(7, 1), nil, tokenRange(500, 16), 16)
	err := idx.ApplyBatch(podA, &kvevent.EventBatch{Events: []kvevent.KVEvent{bad, good}})
	if err == nil || !strings.Contains(err.Error(), "event 0") {
		t.Fatalf("ApplyBatch error = %v, want one naming event 0", err)
	}
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_skipped_blocks_total", map[string]string{"reason": reasonTokens}); got != 4 {
		t.Errorf("skipped token_mismatch blocks = %v, want 4", got)
	}
	if blocks, _ := match(idx, "llama", "", tokenRange(500, 16), "ns/a"); blocks["ns/a"] != 1 {
		t.Fatalf("the good event after a bad one was lost: %d blocks, want 1", blocks["ns/a"])
	}
}

func TestReannouncedBlocksAreIdempotent(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	toks := tokenRange(0, 64)
	mustApply(t, idx, podA, stored(hashSeq(1, 2), nil, toks[:32], 16))
	// kv_cache_report_mode="full": reused blocks come again from block 0.
	mustApply(t, idx, podA, stored(hashSeq(1, 4), nil, toks, 16))
	mustApply(t, idx, podA, stored(hashSeq(1, 4), nil, toks, 16))
	st := idx.Stats()
	if st[0].Entries != 4 || st[0].Pods[0].Streams[0].Lanes[0].Blocks != 4 {
		t.Fatalf("after re-announcements: %+v, want 4 entries and 4 resident blocks", st)
	}
	mustApply(t, idx, podA, removed("GPU", 0, 1, 2, 3, 4))
	if st := idx.Stats(); st[0].Entries != 0 {
		t.Fatalf("entries after removing each block once = %d, want 0", st[0].Entries)
	}
}

func TestAllBlocksClearedAndPurgeRemoveOnlyThatPod(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	toks := tokenRange(0, 32)
	podC := Stream{Pod: "ns/c", Model: "llama"}
	for _, s := range []Stream{podA, podB, podC} {
		mustApply(t, idx, s, stored(hashSeq(1, 2), nil, toks, 16))
	}
	mustApply(t, idx, podA, &kvevent.AllBlocksClearedEvent{})
	idx.PurgePod("ns/b")
	blocks, _ := match(idx, "llama", "", toks, "ns/a", "ns/b", "ns/c")
	if blocks["ns/a"] != 0 || blocks["ns/b"] != 0 || blocks["ns/c"] != 2 {
		t.Fatalf("a=%d b=%d c=%d, want 0 0 2", blocks["ns/a"], blocks["ns/b"], blocks["ns/c"])
	}
	// A cleared stream keeps its chain knowledge of nothing: a child of a
	// cleared block is an unknown parent.
	mustApply(t, idx, podA, stored(hashSeq(3, 1), ptr[uint64](2), tokenRange(32, 16), 16))
	if blocks, _ := match(idx, "llama", "", tokenRange(0, 48), "ns/a"); blocks["ns/a"] != 0 {
		t.Fatalf("child of a cleared block credited %d blocks, want 0", blocks["ns/a"])
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

func TestMoreThan64PodsPerModel(t *testing.T) {
	idx, _, clock := newClockedTable(t, Config{})
	const pods = 150
	names := make([]string, pods)
	for i := range pods {
		s := Stream{Pod: "ns/p" + itoa(i), Model: "llama"}
		names[i] = s.Pod
		// Pod i holds the first i%7+1 blocks of the shared prompt.
		n := i%7 + 1
		mustApply(t, idx, s, stored(hashSeq(1, n), nil, tokenRange(0, 16*n), 16))
	}
	var res MatchResult
	idx.MatchPrefix("llama", "", tokenRange(0, 16*8), names, &res)
	for i, p := range res.Pods {
		if want := i%7 + 1; p.Blocks != want {
			t.Fatalf("pod %s credited %d blocks, want %d", p.Pod, p.Blocks, want)
		}
	}
	// Purge the low half; the high ids keep working, then ids are reused.
	for i := range pods / 2 {
		idx.PurgePod(names[i])
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
	idx.MatchPrefix("llama", "", tokenRange(0, 16*8), names, &res)
	for i, p := range res.Pods {
		want := i%7 + 1
		if i < pods/2 {
			want = 0
		}
		if p.Blocks != want {
			t.Fatalf("after purge: pod %s credited %d blocks, want %d", p.Pod, p.Blocks, want)
		}
	}
	// New pods take fresh holder ids up to the key table's width (3 words),
	// then reuse released ones once their grace period is over, whether or
	// not the key table still has their bits.
	clock.Advance(holderReuseDelay)
	for i := range pods / 2 {
		s := Stream{Pod: "ns/q" + itoa(i), Model: "llama"}
		names[i] = s.Pod
		n := i%7 + 1
		mustApply(t, idx, s, stored(hashSeq(1, n), nil, tokenRange(0, 16*n), 16))
		if err := checkInvariants(idx); err != nil {
			t.Fatalf("new pod %d: %v", i, err)
		}
	}
	if m := idx.model("llama"); len(m.lanes) != 192 || m.keys.width != 3 {
		t.Errorf("%d holder ids in %d words for %d pods, want 192 in 3: released ids reused", len(m.lanes), m.keys.width, pods)
	}
	idx.MatchPrefix("llama", "", tokenRange(0, 16*8), names, &res)
	for i, p := range res.Pods {
		if want := i%7 + 1; p.Blocks != want {
			t.Fatalf("after reuse: pod %s credited %d blocks, want %d", p.Pod, p.Blocks, want)
		}
	}
}

func TestParentHashZeroStartsAChainUnlessTheStreamHoldsBlockZero(t *testing.T) {
	idx, reg := newTestTable(t, Config{})
	// llm-d-inference-sim sends parent_block_hash 0, not nil, for the
	// first block of a prompt.
	mustApply(t, idx, podA, stored(hashSeq(101, 3), ptr[uint64](0), tokenRange(0, 48), 16))
	mustApply(t, idx, podA, stored(hashSeq(104, 1), ptr[uint64](103), tokenRange(48, 16), 16))
	if blocks, _ := match(idx, "llama", "", tokenRange(0, 64), "ns/a"); blocks["ns/a"] != 4 {
		t.Fatalf("a chain whose first parent is 0 matched %d blocks, want 4", blocks["ns/a"])
	}
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_parent_misses_total", nil); got != 0 {
		t.Errorf("parent misses = %v, want 0", got)
	}
	// An engine whose hashes include 0 names a real block by it: its
	// children chain from that block, not from the root.
	mustApply(t, idx, podB, stored([]uint64{0}, nil, tokenRange(500, 16), 16))
	mustApply(t, idx, podB, stored([]uint64{1}, ptr[uint64](0), tokenRange(516, 16), 16))
	blocks, _ := match(idx, "llama", "", tokenRange(500, 32), "ns/b")
	if blocks["ns/b"] != 2 {
		t.Fatalf("the child of block 0 matched %d blocks after it, want 2", blocks["ns/b"])
	}
	if blocks, _ := match(idx, "llama", "", tokenRange(516, 16), "ns/b"); blocks["ns/b"] != 0 {
		t.Fatalf("the child of block 0 was indexed from the root")
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

func TestBlocksNamingTheirAdapterByIdOnlyAreCountedNotIndexed(t *testing.T) {
	idx, reg := newTestTable(t, Config{})
	// vLLM 0.9 names the adapter of a block by its engine id only; requests
	// name adapters, so no match could ever use these blocks.
	ev := stored(hashSeq(1, 3), nil, tokenRange(0, 48), 16)
	ev.LoraID = 2
	mustApply(t, idx, podA, ev)
	next := stored(hashSeq(4, 1), ptr[uint64](3), tokenRange(48, 16), 16)
	next.LoraID = 2
	mustApply(t, idx, podA, next)
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_skipped_blocks_total", map[string]string{"reason": reasonLoraID}); got != 4 {
		t.Errorf("skipped lora_id_only blocks = %v, want 4", got)
	}
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_parent_misses_total", nil); got != 0 {
		t.Errorf("parent misses = %v, want 0: the continuation is skipped for its adapter", got)
	}
	st := idx.Stats()
	if len(st) != 1 || st[0].Entries != 0 || len(st[0].Pods) != 1 || len(st[0].Pods[0].Streams[0].Lanes) != 0 {
		t.Fatalf("Stats = %+v, want the stream known and nothing indexed", st)
	}
	// A block that names its adapter is indexed, whatever its id.
	named := stored(hashSeq(1, 3), nil, tokenRange(0, 48), 16)
	named.LoraID, named.LoraName = 2, "sql"
	mustApply(t, idx, podA, named)
	if blocks, _ := match(idx, "llama", "sql", tokenRange(0, 48), "ns/a"); blocks["ns/a"] != 3 {
		t.Fatalf("named adapter's blocks matched %d, want 3", blocks["ns/a"])
	}
}

func TestEachPodIsMatchedAtItsOwnBlockSize(t *testing.T) {
	idx, reg := newTestTable(t, Config{})
	prompt := tokenRange(0, 128)
	small, large := podA, podB
	// Events of the two pods interleave: neither may flip the other's size.
	for i := 0; i < 3; i++ {
		mustApply(t, idx, small, stored(hashSeq(1, 8), nil, prompt, 16))
		mustApply(t, idx, large, stored(hashSeq(101, 4), nil, prompt, 32))
	}
	var res MatchResult
	idx.MatchPrefix("llama", "", append(prompt, 1, 2, 3), []string{"ns/a", "ns/b", "ns/c"}, &res)
	want := []PodMatch{
		{Pod: "ns/a", BlockSize: 16, Blocks: 8, Tokens: 128, GPUBlocks: 8, GPUTokens: 128},
		{Pod: "ns/b", BlockSize: 32, Blocks: 4, Tokens: 128, GPUBlocks: 4, GPUTokens: 128},
		{Pod: "ns/c"},
	}
	if !slices.Equal(res.Pods, want) || res.BlockSize != 16 || res.PromptBlocks != 8 {
		t.Fatalf("MatchPrefix = %+v, want %+v at primary block size 16 (the smaller of two as common)", res, want)
	}
	// A third pod at 32 makes 32 the primary size.
	mustApply(t, idx, Stream{Pod: "ns/c", Model: "llama"}, stored(hashSeq(201, 2), nil, prompt[:64], 32))
	if bs, _ := idx.BlockSize("llama"); bs != 32 {
		t.Errorf("BlockSize = %d, want 32, the size of two streams of three", bs)
	}
	for size, want := range map[string]float64{"16": 1, "32": 2} {
		if got := testsupport.MetricValue(t, reg, "kvgate_indexer_block_size_streams", map[string]string{"model": "llama", "block_size": size}); got != want {
			t.Errorf("streams of block size %s = %v, want %v", size, got, want)
		}
	}
	st := idx.Stats()
	if !slices.Equal(st[0].BlockSizes, []int{16, 32}) || st[0].BlockSize != 32 || st[0].Pods[0].Streams[0].Lanes[0].BlockSize != 16 {
		t.Errorf("Stats = %+v, want block sizes [16 32], primary 32, pod a's lane of 16", st)
	}
	// A parent in a lane of another size is no parent: the key chained from
	// it would name no prompt's prefix.
	cpu := stored(hashSeq(9, 1), ptr[uint64](8), tokenRange(128, 64), 64)
	cpu.Medium = kvevent.MediumCPU
	mustApply(t, idx, small, cpu)
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_parent_misses_total", nil); got != 1 {
		t.Errorf("parent misses = %v, want 1", got)
	}
	// An engine whose blocks change size restarted unseen: its blocks of the
	// old size go, and it is matched at the new one.
	mustApply(t, idx, small, stored(hashSeq(301, 4), nil, prompt, 32))
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_evicted_blocks_total", map[string]string{"reason": reasonBlockSize}); got != 8 {
		t.Errorf("block_size_changed evictions = %v, want 8", got)
	}
	idx.MatchPrefix("llama", "", prompt, []string{"ns/a"}, &res)
	if p := res.Pods[0]; p.BlockSize != 32 || p.Blocks != 4 {
		t.Errorf("pod a after its size changed: %+v, want 4 blocks of 32", p)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

func TestAPodWhoseMediaUseTwoBlockSizesIsCreditedItsLongestRuns(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	prompt := tokenRange(0, 256)
	// GPU blocks of 16 hold the first 80 tokens; an offload tier with
	// blocks of 64 holds the first 192.
	mustApply(t, idx, podA, stored(hashSeq(1, 5), nil, prompt[:80], 16))
	cpu := stored(hashSeq(101, 3), nil, prompt[:192], 64)
	cpu.Medium = kvevent.MediumCPU
	mustApply(t, idx, podA, cpu)
	var res MatchResult
	idx.MatchPrefix("llama", "", prompt, []string{"ns/a"}, &res)
	want := PodMatch{Pod: "ns/a", BlockSize: 64, Blocks: 3, Tokens: 192, GPUBlocks: 1, GPUTokens: 80}
	if res.Pods[0] != want {
		t.Fatalf("match = %+v, want %+v", res.Pods[0], want)
	}
}

// TestPurgedLanesStopWideningTheTable purges the pods whose lanes have the
// highest holder ids. Their ids kept every slot of the model's table one
// word wider, and every match copying it, for as long as the model lived.
func TestPurgedLanesStopWideningTheTable(t *testing.T) {
	idx, _, clock := newClockedTable(t, Config{})
	const pods = 100
	names := make([]string, pods)
	for i := range pods {
		names[i] = "ns/p" + itoa(i)
		n := i%7 + 1
		mustApply(t, idx, Stream{Pod: names[i], Model: "llama"}, stored(hashSeq(1, n), nil, tokenRange(0, 16*n), 16))
	}
	m := idx.model("llama")
	if m.keys.width != 2 {
		t.Fatalf("%d pods' lanes take %d words, want 2", pods, m.keys.width)
	}
	for i := 64; i < pods; i++ {
		idx.PurgePod(names[i])
	}
	width := func() (table int, shards []int, matches int) {
		for s := range m.keys.shards {
			shards = append(shards, m.keys.shards[s].arr.Load().width())
		}
		return m.keys.width, shards, m.pods.Load().width
	}
	checkMatches := func(when string, live int) {
		t.Helper()
		var res MatchResult
		idx.MatchPrefix("llama", "", tokenRange(0, 16*8), names, &res)
		for i, p := range res.Pods {
			want := i%7 + 1
			if i >= live {
				want = 0
			}
			if p.Blocks != want {
				t.Fatalf("%s: pod %s credited %d blocks, want %d", when, p.Pod, p.Blocks, want)
			}
		}
		if err := checkInvariants(idx); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	// The released ids keep their grace period, and the width with it.
	idx.sweep(clock.Now())
	if w, _, _ := width(); w != 2 {
		t.Fatalf("a sweep within the ids' grace period narrowed the table to %d words", w)
	}
	checkMatches("after the purge", 64)
	clock.Advance(holderReuseDelay)
	idx.sweep(clock.Now())
	w, shards, mw := width()
	if w != 1 || mw != 1 || slices.Max(shards) != 1 || len(m.lanes) != 64 {
		t.Fatalf("after the grace period: table %d words, shards %v, matches %d, %d holder ids; want 1, all 1, 1, 64",
			w, shards, mw, len(m.lanes))
	}
	checkMatches("after narrowing", 64)
	// New pods take the next ids and widen the table again.
	for i := 64; i < pods; i++ {
		names[i] = "ns/q" + itoa(i)
		n := i%7 + 1
		mustApply(t, idx, Stream{Pod: names[i], Model: "llama"}, stored(hashSeq(1, n), nil, tokenRange(0, 16*n), 16))
	}
	if len(m.lanes) != pods || m.keys.width != 2 {
		t.Fatalf("%d holder ids in %d words for %d pods, want %d in 2", len(m.lanes), m.keys.width, pods, pods)
	}
	checkMatches("after new pods", pods)
}

// TestTrimmedHolderIdsAreScrubbedBeforeReuse purges the pods with the
// highest holder ids, whose bits stay in the slots of the blocks they held,
// and gives their ids to new pods holding other blocks.
func TestTrimmedHolderIdsAreScrubbedBeforeReuse(t *testing.T) {
	idx, _, clock := newClockedTable(t, Config{})
	for i := range 10 {
		mustApply(t, idx, Stream{Pod: "ns/p" + itoa(i), Model: "llama"}, stored(hashSeq(1, 3), nil, tokenRange(0, 48), 16))
	}
	for i := 5; i < 10; i++ {
		idx.PurgePod("ns/p" + itoa(i))
	}
	clock.Advance(holderReuseDelay)
	for i := 5; i < 10; i++ {
		mustApply(t, idx, Stream{Pod: "ns/q" + itoa(i), Model: "llama"}, stored(hashSeq(1, 1), nil, tokenRange(1000, 16), 16))
		if err := checkInvariants(idx); err != nil {
			t.Fatalf("new pod %d: %v", i, err)
		}
	}
	if m := idx.model("llama"); len(m.lanes) != 10 {
		t.Fatalf("%d holder ids for 10 pods, want the purged pods' 10 reused", len(m.lanes))
	}
	if blocks, _ := match(idx, "llama", "", tokenRange(0, 48), "ns/q5", "ns/p4"); blocks["ns/q5"] != 0 || blocks["ns/p4"] != 3 {
		t.Fatalf("q5=%d p4=%d, want 0 (a new pod credited with a purged one's blocks) and 3", blocks["ns/q5"], blocks["ns/p4"])
	}
}
