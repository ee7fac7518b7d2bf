package routing

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// countingSource counts the values drawn from a random source.
type countingSource struct {
	src   rand.Source
	draws atomic.Int64
}

func (c *countingSource) Uint64() uint64 {
	c.draws.Add(1)
	return c.src.Uint64()
}

// TestTiesAreBrokenUniformlyWithOneDrawPerDecision routes among idle pods,
// which every algorithm but random ties, and requires each pod to be
// chosen about as often as the others, whatever its place in the list, and
// each decision to take at most one value from the shared random source, so
// that concurrent decisions hold its lock once each, however many pods tie.
func TestTiesAreBrokenUniformlyWithOneDrawPerDecision(t *testing.T) {
	const pods, decisions = 24, 4800
	for _, alg := range []string{LeastRequest, LeastKVCache, LeastLatency, PrefixCache, KVAware, SLOLeastLoad} {
		t.Run(alg, func(t *testing.T) {
			src := &countingSource{src: rand.NewPCG(3, 4)}
			r, _ := newTestRouter(t, newFakeMetrics(), newTestIndex(t), func(c *Config) { c.Rand = src })
			eps := testPods(pods)
			seen := map[string]int{}
			for i := range decisions {
				before := src.draws.Load()
				d := route(t, r, request(fmt.Sprint(i), alg, prompt(i*1000, 64)), eps)
				if n := src.draws.Load() - before; n > 1 {
					t.Fatalf("decision %d drew %d values from the random source among %d tied pods, want at most 1", i, n, pods)
				}
				seen[d.PodKey]++
			}
			want := decisions / pods
			for _, p := range eps {
				if n := seen[key(p.Key.Name)]; n < want*3/4 || n > want*5/4 {
					t.Errorf("%s chosen %d times in %d decisions, want about %d: %v", p.Key.Name, n, decisions, want, seen)
				}
			}
		})
	}
}
