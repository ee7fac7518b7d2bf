package indexer

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// A cleared stream whose engine then stores blocks of another size (an
// engine that restarted with another --block-size while its stream went
// on) is matched at the new size only, in every medium, and chains its new
// blocks from parents of the new size alone.
func TestAClearedStreamIsMatchedAtTheBlockSizeItStoresNext(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	prompt := tokenRange(0, 128)
	cpuOld := stored(hashSeq(50, 8), nil, prompt, 16)
	cpuOld.Medium = kvevent.MediumCPU
	mustApply(t, idx, podA, stored(hashSeq(1, 8), nil, prompt, 16), cpuOld)
	mustApply(t, idx, podA, &kvevent.AllBlocksClearedEvent{})
	if bs, _ := idx.BlockSize("llama"); bs != 16 {
		t.Fatalf("BlockSize after the clear = %d, want 16 until the engine stores again", bs)
	}
	// The new engine's hashes 1 and 2 collide with the old engine's.
	mustApply(t, idx, podA, stored(hashSeq(1, 2), nil, prompt[:64], 32))
	cpuNew := stored([]uint64{3}, ptr[uint64](2), prompt[64:96], 32)
	cpuNew.Medium = kvevent.MediumCPU
	mustApply(t, idx, podA, cpuNew)
	var res MatchResult
	idx.MatchPrefix("llama", "", prompt, []string{"ns/a"}, &res)
	if p := res.Pods[0]; res.BlockSize != 32 || p.BlockSize != 32 || p.Blocks != 3 || p.GPUBlocks != 2 {
		t.Fatalf("MatchPrefix = %+v, want pod a at block size 32: 3 blocks, 2 on GPU", res)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}
