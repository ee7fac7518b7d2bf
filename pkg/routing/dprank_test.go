package routing

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/types"
)

// TestADecisionNamesTheRankHoldingMoreOfThePrompt routes a prompt to a pod
// whose engine serves data-parallel ranks behind one port: a prefix
// algorithm names the rank that holds more of the prompt than the others,
// for the engine to run the request there; a load algorithm, or a pod
// whose ranks hold as much, or whose ranks the header cannot name, gets no
// rank.
func TestADecisionNamesTheRankHoldingMoreOfThePrompt(t *testing.T) {
	p := prompt(0, 8*testBlockSize)
	for _, tc := range []struct {
		name        string
		size, start string      // annotations, "" for none
		held        map[int]int // blocks of p by rank
		want        map[string]int
	}{
		{"rank 1 holds more", "2", "", map[int]int{0: 1, 1: 4},
			map[string]int{KVAware: 1, PrefixCache: 1, LeastRequest: -1, Random: -1}},
		{"rank 0 holds more", "2", "0", map[int]int{0: 4, 1: 1},
			map[string]int{KVAware: 0, PrefixCache: 0, LeastRequest: -1}},
		{"both ranks hold as much", "2", "", map[int]int{0: 3, 1: 3},
			map[string]int{KVAware: -1, PrefixCache: -1}},
		{"no rank holds any", "2", "", nil, map[string]int{KVAware: -1, PrefixCache: -1}},
		{"ranks from 2: the header's index is the engine's", "2", "2", map[int]int{2: 1, 3: 4},
			map[string]int{KVAware: -1}},
		{"one rank", "", "", map[int]int{0: 4}, map[string]int{KVAware: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod("dp", "10.0.0.9", 0)
			pod.Annotations = map[string]string{}
			if tc.size != "" {
				pod.Annotations[endpoint.DPSizeAnnotation] = tc.size
			}
			if tc.start != "" {
				pod.Annotations[endpoint.DPStartRankAnnotation] = tc.start
			}
			pods := []*endpoint.Endpoint{parse(pod)}
			idx := newTestIndex(t)
			for rank, n := range tc.held {
				holdsAs(t, idx, indexer.Stream{Pod: key("dp"), Rank: rank, Model: testModel}, "", p[:n*testBlockSize], kvevent.MediumGPU)
			}
			r, _ := newTestRouter(t, newFakeMetrics(), idx)
			for alg, want := range tc.want {
				if d := route(t, r, request("r-"+alg, alg, p), pods); d.DPRank != want {
					t.Errorf("%s: DPRank = %d, want %d", alg, d.DPRank, want)
				}
			}
			e, err := r.Explain(request("explain", "", p), snaps(r, pods))
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range e.Decisions {
				if want, ok := tc.want[d.Algorithm]; ok && d.DPRank != want {
					t.Errorf("Explain %s: DPRank = %d, want %d", d.Algorithm, d.DPRank, want)
				}
			}
		})
	}
}

// TestADecisionWithoutTokensNamesNoRank routes a request without token ids:
// nothing was matched, so the engine chooses the rank.
func TestADecisionWithoutTokensNamesNoRank(t *testing.T) {
	pod := testPod("dp", "10.0.0.9", 0)
	pod.Annotations = map[string]string{endpoint.DPSizeAnnotation: "2"}
	idx := newTestIndex(t)
	r, _ := newTestRouter(t, newFakeMetrics(), idx)
	rc := types.NewRoutingContext("r", testModel)
	rc.Algorithm = KVAware
	if d := route(t, r, rc, []*endpoint.Endpoint{parse(pod)}); d.DPRank != -1 {
		t.Errorf("DPRank = %d, want -1", d.DPRank)
	}
}
