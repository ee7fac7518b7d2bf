//go:build !race

package indexer

import "testing"

// TestMatchPrefixDoesNotAllocate guards the hot path: a reused MatchResult
// makes a 512-block match allocate nothing, hit or miss. (The race detector
// instruments allocations, so the test runs without it.)
func TestMatchPrefixDoesNotAllocate(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	hit, miss := tokenRange(0, 16*512), tokenRange(1<<20, 16*512)
	mustApply(t, idx, podA, stored(hashSeq(1, 512), nil, hit, 16))
	mustApply(t, idx, podB, stored(hashSeq(1, 256), nil, hit[:16*256], 16))
	pods := []string{"ns/a", "ns/b", "ns/c"}
	var res MatchResult
	idx.MatchPrefix("llama", "", hit, pods, &res)
	for _, prompt := range [][]uint32{hit, miss} {
		if n := testing.AllocsPerRun(100, func() { idx.MatchPrefix("llama", "", prompt, pods, &res) }); n != 0 {
			t.Errorf("MatchPrefix allocated %v times per run, want 0", n)
		}
	}
	idx.MatchPrefix("llama", "", hit, pods, &res)
	if res.Pods[0].Blocks != 512 || res.Pods[1].Blocks != 256 || res.Pods[2].Blocks != 0 {
		t.Fatalf("match = %+v", res.Pods)
	}
}
