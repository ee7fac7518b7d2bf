package gateway

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

// storeBlocks applies to x one BlockStored event of the first blocks of
// prompt, with engine hashes starting at first.
func storeBlocks(t *testing.T, x kvIndex, s kvevent.StreamID, prompt []uint32, blocks int, first uint64) {
	t.Helper()
	hashes := make([]kvevent.BlockHash, blocks)
	for i := range hashes {
		hashes[i] = kvevent.BlockHash(first + uint64(i))
	}
	ev := &kvevent.BlockStoredEvent{BlockHashes: hashes, TokenIDs: prompt[:blocks*4], BlockSize: 4,
		Medium: kvevent.MediumGPU, GroupIdx: kvevent.NoGroup}
	if err := x.ApplyBatch(s, &kvevent.EventBatch{Events: []kvevent.KVEvent{ev}, DataParallelRank: s.DPRank}); err != nil {
		t.Fatalf("ApplyBatch(%+v): %v", s, err)
	}
}

// tableMatches returns the leading blocks of prompt each pod holds.
func tableMatches(table *indexer.SyncPrefixHashTable, prompt []uint32, pods ...string) map[string]int {
	var res indexer.MatchResult
	table.MatchPrefix("llama", "", prompt, pods, &res)
	out := map[string]int{}
	for _, p := range res.Pods {
		out[p.Pod] = p.Blocks
	}
	return out
}

func TestKVIndexKeysStreamsByPodRankAndModel(t *testing.T) {
	table, err := indexer.NewSyncPrefixHashTable(indexer.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	x := kvIndex{table: table}
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	rank0 := kvevent.StreamID{PodKey: "ns/a", DPRank: 0, Model: "llama", LoraID: "3"}
	rank1 := kvevent.StreamID{PodKey: "ns/a", DPRank: 1, Model: "llama", LoraID: "3"}
	other := kvevent.StreamID{PodKey: "ns/b", Model: "llama"}
	storeBlocks(t, x, rank0, prompt, 2, 100)
	storeBlocks(t, x, rank1, prompt, 3, 200)
	storeBlocks(t, x, other, prompt, 1, 300)

	if got := tableMatches(table, prompt, "ns/a", "ns/b"); got["ns/a"] != 3 || got["ns/b"] != 1 {
		t.Fatalf("after storing: matched %v, want ns/a 3 (its longest rank), ns/b 1", got)
	}
	x.ResetStream(rank1)
	if got := tableMatches(table, prompt, "ns/a", "ns/b"); got["ns/a"] != 2 || got["ns/b"] != 1 {
		t.Fatalf("after resetting rank 1: matched %v, want ns/a 2 (rank 0 only), ns/b 1", got)
	}
	x.PurgePod("ns/a")
	if got := tableMatches(table, prompt, "ns/a", "ns/b"); got["ns/a"] != 0 || got["ns/b"] != 1 {
		t.Fatalf("after purging ns/a: matched %v, want ns/a 0, ns/b 1", got)
	}
}
