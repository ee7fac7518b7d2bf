package indexer

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// TestAMatchNamesTheRankHoldingTheLongestRun matches a prompt against a pod
// of two data-parallel ranks, each holding its own run of the prompt's
// prefix: the pod is credited with the longer run, the rank holding it, and
// the other rank's run beside it.
func TestAMatchNamesTheRankHoldingTheLongestRun(t *testing.T) {
	prompt := tokenRange(0, 256)
	// run stores the first n blocks of size bs of the prompt on a rank.
	type run struct {
		rank, n, bs int
		cpu         bool
	}
	for _, tc := range []struct {
		name string
		runs []run
		want PodMatch
	}{
		{"rank 1 holds more", []run{{0, 2, 16, false}, {1, 6, 16, false}},
			PodMatch{BlockSize: 16, Blocks: 6, Tokens: 96, GPUBlocks: 6, GPUTokens: 96, Rank: 1, OtherRankBlocks: 2}},
		{"rank 0 holds more", []run{{0, 6, 16, false}, {1, 4, 16, false}},
			PodMatch{BlockSize: 16, Blocks: 6, Tokens: 96, GPUBlocks: 6, GPUTokens: 96, Rank: 0, OtherRankBlocks: 4}},
		{"only rank 1 holds any", []run{{1, 3, 16, false}},
			PodMatch{BlockSize: 16, Blocks: 3, Tokens: 48, GPUBlocks: 3, GPUTokens: 48, Rank: 1, OtherRankBlocks: 0}},
		{"equal runs: the lower rank", []run{{1, 4, 16, false}, {0, 4, 16, false}},
			PodMatch{BlockSize: 16, Blocks: 4, Tokens: 64, GPUBlocks: 4, GPUTokens: 64, Rank: 0, OtherRankBlocks: 4}},
		{"equal runs: the longer GPU run", []run{{0, 4, 16, true}, {1, 4, 16, false}},
			PodMatch{BlockSize: 16, Blocks: 4, Tokens: 64, GPUBlocks: 4, GPUTokens: 64, Rank: 1, OtherRankBlocks: 4}},
		{"ranks 2 and 3 of a later start rank", []run{{2, 1, 16, false}, {3, 5, 16, false}},
			PodMatch{BlockSize: 16, Blocks: 5, Tokens: 80, GPUBlocks: 5, GPUTokens: 80, Rank: 3, OtherRankBlocks: 1}},
		{"mixed sizes: rank 1's larger blocks hold more tokens", []run{{0, 5, 16, false}, {1, 4, 32, false}},
			PodMatch{BlockSize: 32, Blocks: 4, Tokens: 128, GPUBlocks: 4, GPUTokens: 128, Rank: 1, OtherRankBlocks: 2}},
		{"mixed sizes: rank 0's larger blocks hold more tokens", []run{{1, 5, 16, false}, {0, 4, 32, false}},
			PodMatch{BlockSize: 32, Blocks: 4, Tokens: 128, GPUBlocks: 4, GPUTokens: 128, Rank: 0, OtherRankBlocks: 2}},
		{"mixed sizes: one rank's two tiers are not another rank", []run{{0, 5, 16, false}, {0, 3, 64, true}, {1, 2, 16, false}},
			PodMatch{BlockSize: 64, Blocks: 3, Tokens: 192, GPUBlocks: 1, GPUTokens: 80, Rank: 0, OtherRankBlocks: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx, _ := newTestTable(t, Config{})
			for i, r := range tc.runs {
				e := stored(hashSeq(uint64(1000*(i+1)), r.n), nil, prompt[:r.n*r.bs], r.bs)
				if r.cpu {
					e.Medium = kvevent.MediumCPU
				}
				mustApply(t, idx, Stream{Pod: "ns/dp", Rank: r.rank, Model: "llama"}, e)
			}
			var res MatchResult
			idx.MatchPrefix("llama", "", prompt, []string{"ns/other", "ns/dp"}, &res)
			tc.want.Pod = "ns/dp"
			if res.Pods[1] != tc.want {
				t.Errorf("match = %+v, want %+v", res.Pods[1], tc.want)
			}
			if res.Pods[0] != (PodMatch{Pod: "ns/other"}) {
				t.Errorf("a pod the index does not know matched %+v", res.Pods[0])
			}
		})
	}
}
