package indexer

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// TestRunsEndWhereTheyEndAcrossBatches checks long prompts, whose walk keys
// and looks up blocks a batch at a time: each pod's run must end exactly at
// its first missing block, wherever that falls against the batches, whether
// the holder set changes there or not.
func TestRunsEndWhereTheyEndAcrossBatches(t *testing.T) {
	const bs, n = 4, 70
	idx, _ := newTestTable(t, Config{})
	// Three tokens past the last whole block, which no match may use.
	prompt := tokenRange(1000, n*bs+3)
	hash := func(pod, block int) uint64 { return uint64(pod)<<32 | uint64(block) + 1 }
	store := func(pod int, s Stream, medium string, from, to int) {
		e := stored(nil, nil, prompt[from*bs:to*bs], bs)
		e.Medium = medium
		for b := from; b < to; b++ {
			e.BlockHashes = append(e.BlockHashes, hash(pod, b))
		}
		if from > 0 {
			e.ParentBlockHash, e.HasParent = hash(pod, from-1), true
		}
		mustApply(t, idx, s, e)
	}
	want := map[string][2]int{} // pod: blocks, GPU blocks
	var pods []string
	stream := func(name string) Stream {
		pods = append(pods, name)
		return Stream{Pod: name, Model: "llama"}
	}
	lengths := []int{0, 1, 2, 15, 16, 17, 18, 31, 32, 33, 34, 47, 49, 69, 70}
	for i, l := range lengths {
		name := fmt.Sprintf("ns/len-%d", l)
		s := stream(name)
		if l > 0 {
			store(i, s, kvevent.MediumGPU, 0, l)
		}
		want[name] = [2]int{l, l}
	}
	// A pod missing one block in the middle is credited up to it only.
	hole := stream("ns/hole")
	store(100, hole, kvevent.MediumGPU, 0, 40)
	mustApply(t, idx, hole, removed(kvevent.MediumGPU, 0, hash(100, 20)))
	want["ns/hole"] = [2]int{20, 20}
	// A pod holding the tail of its run on CPU: its GPU run ends earlier.
	tiered := stream("ns/tiered")
	store(101, tiered, kvevent.MediumGPU, 0, 30)
	store(101, tiered, kvevent.MediumCPU, 30, 52)
	want["ns/tiered"] = [2]int{52, 30}
	// A pod holding nothing of the prompt.
	want[stream("ns/none").Pod] = [2]int{0, 0}

	blocks, gpu := match(idx, "llama", "", prompt, pods...)
	for _, p := range pods {
		if got := [2]int{blocks[p], gpu[p]}; got != want[p] {
			t.Errorf("%s matched %d blocks (%d on GPU), want %d (%d)", p, got[0], got[1], want[p][0], want[p][1])
		}
	}
	// Each pod alone, so that no other candidate keeps the walk going.
	for _, p := range pods {
		blocks, gpu := match(idx, "llama", "", prompt, p)
		if got := [2]int{blocks[p], gpu[p]}; got != want[p] {
			t.Errorf("%s alone matched %d blocks (%d on GPU), want %d (%d)", p, got[0], got[1], want[p][0], want[p][1])
		}
	}
}
