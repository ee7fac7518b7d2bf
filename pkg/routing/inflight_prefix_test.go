package routing

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/pkg/inflight"
)

// TestInFlightMatchCountsTheLeadingBlocksEachPodHolds checks match against
// its definition, a scan of the prompt's keys for each pod, on random
// fleets: attempts in flight on several pods hold prefixes of a few chains
// of blocks, this gateway's and other replicas'.
func TestInFlightMatchCountsTheLeadingBlocksEachPodHolds(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	var buf []byte
	for round := range 500 {
		f := newInFlightPrefixes(DefaultMaxInFlightPrefixBlocks)
		chains := make([][]uint64, 1+rng.IntN(3))
		for c := range chains {
			toks := make([]uint32, 16*(1+rng.IntN(40)))
			for i := range toks {
				// Chains share their first blocks now and then.
				toks[i] = uint32(i)
				if i >= 16*rng.IntN(4) {
					toks[i] += uint32(1000 * (c + 1))
				}
			}
			chains[c] = f.keys(nil, &buf, "m", "", toks, 16)
		}
		cs := make([]Candidate, 1+rng.IntN(6))
		held := make([]map[uint64]bool, len(cs))
		for j := range cs {
			cs[j].load = inflight.NewPodLoad(fmt.Sprintf("p%d", j))
			held[j] = map[uint64]bool{}
			var remote []uint64
			for range rng.IntN(4) {
				chain := chains[rng.IntN(len(chains))]
				prefix := chain[:rng.IntN(len(chain)+1)]
				for _, k := range prefix {
					held[j][k] = true
				}
				if rng.IntN(3) == 0 {
					remote = append(remote, prefix...)
					continue
				}
				if len(prefix) > 0 {
					f.pods[cs[j].load] = append(f.pods[cs[j].load], attempt{new(inflight.Handle), prefix})
				}
			}
			cs[j].load.SetRemoteBlocks(remote)
		}
		prompt := chains[rng.IntN(len(chains))]
		prompt = prompt[:rng.IntN(len(prompt)+1)]
		f.match(cs, prompt)
		for j, c := range cs {
			want := 0
			for want < len(prompt) && held[j][prompt[want]] {
				want++
			}
			if c.InFlightMatchedBlocks != want {
				t.Fatalf("round %d, pod %d: %d leading blocks in flight, want %d", round, j, c.InFlightMatchedBlocks, want)
			}
		}
	}
}
