package routing

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/inflight"
)

// TestInFlightKeysAreTheSameInEveryRelease pins the keys of two prompts:
// replicas share them through Redis, so a fleet in the middle of a rollout
// runs two releases that must agree on them.
func TestInFlightKeysAreTheSameInEveryRelease(t *testing.T) {
	f := newInFlightPrefixes(DefaultMaxInFlightPrefixBlocks)
	var buf []byte
	toks := make([]uint32, 40)
	for i := range toks {
		toks[i] = uint32(i*2654435761) ^ 0x9e3779b9
	}
	for _, tc := range []struct {
		model, lora string
		tokens      []uint32
		blockSize   int
		want        []uint64
	}{
		{"meta-llama/Llama-3.1-8B", "", toks, 16, []uint64{0x69543695c3df6f2d, 0xd4efe96ebea1c7d7}},
		{"m", "sql-lora", toks[:32], 8, []uint64{0xac24178f2307494c, 0xe0074373d7526539, 0x686d8e5b86229a32, 0x7f1f55158d00a78a}},
	} {
		if got := f.keys([]uint64{7}, &buf, tc.model, tc.lora, tc.tokens, tc.blockSize); !slices.Equal(got, append([]uint64{7}, tc.want...)) {
			t.Errorf("keys of %s/%s = %#x, want 7 then %#x", tc.model, tc.lora, got, tc.want)
		}
	}
}

// TestInFlightKeysReadTokensLittleEndian checks the tokens' bytes that
// keys hash against their encoding one by one, which a machine of either
// byte order gets.
func TestInFlightKeysReadTokensLittleEndian(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for n := range 40 {
		toks := make([]uint32, n)
		for i := range toks {
			toks[i] = rng.Uint32()
		}
		prefix := []byte{9, 8, 7}
		got := appendTokens(slices.Clone(prefix), toks)
		if want := appendTokensByteByByte(slices.Clone(prefix), toks); !slices.Equal(got, want) {
			t.Fatalf("%d tokens: appendTokens = %x, want %x", n, got, want)
		}
	}
}

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

// BenchmarkInFlightKeys measures the keys of an 8,192-token prompt in
// blocks of 16, which every kv-aware decision computes.
func BenchmarkInFlightKeys(b *testing.B) {
	f := newInFlightPrefixes(DefaultMaxInFlightPrefixBlocks)
	toks := make([]uint32, 8192)
	for i := range toks {
		toks[i] = uint32(i*2654435761) ^ 0x9e3779b9
	}
	var buf []byte
	var keys []uint64
	b.ReportAllocs()
	for b.Loop() {
		keys = f.keys(keys[:0], &buf, "meta-llama/Llama-3.1-8B", "", toks, 16)
	}
}
