package routing

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

func TestExplainShowsEveryAlgorithmsDecisionWithoutRouting(t *testing.T) {
	pods := testPods(3)
	idx := newTestIndex(t)
	p := prompt(0, 1000)
	holds(t, idx, "p1", p[:800], kvevent.MediumGPU)
	m := uniformFleet(3).set("p0", cache.KVCacheUsagePerc, 0.1).set("p1", cache.KVCacheUsagePerc, 0.5).set("p2", cache.KVCacheUsagePerc, 0.4)
	r, reg := newTestRouter(t, m, idx)
	ctx := request("r", "", p)

	e, err := r.Explain(ctx, snaps(r, pods))
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Decisions) != len(Algorithms()) || e.DefaultAlgorithm != KVAware {
		t.Fatalf("%d decisions, default %q; want one per algorithm and kv-aware", len(e.Decisions), e.DefaultAlgorithm)
	}
	want := map[string]string{LeastKVCache: "p0", PrefixCache: "p1", KVAware: "p1"}
	for i, d := range e.Decisions {
		if d.Algorithm != Algorithms()[i] {
			t.Fatalf("decision %d is %s, want %s", i, d.Algorithm, Algorithms()[i])
		}
		if w, ok := want[d.Algorithm]; ok && d.PodKey != key(w) {
			t.Errorf("%s would choose %s, want %s", d.Algorithm, d.PodKey, w)
		}
		// Every decision carries every input.
		if c := candidate(t, &d, "p1"); c.MatchedBlocks != 50 || c.MatchedTokens != 800 || c.UncachedTokens != 200 || c.KVCacheUsage != 0.5 || c.PrefillTokensPerSecond != 10000 {
			t.Errorf("%s: p1 %+v, want its match, usage and speed", d.Algorithm, c)
		}
	}
	if ctx.HasRouted() || inFlightPrefills(t, reg) != 0 || testsupport.MetricValue(t, reg, "kvgate_routing_decisions_total", nil) != 0 {
		t.Fatal("Explain routed the request, started a prefill or counted a decision")
	}

	body, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"algorithm":"kv-aware"`, `"pod":"ns/p1"`, `"matchedGPUTokens":800`, `"matchedGPUBlocks":50`, `"predictedTTFTSeconds":`} {
		if !strings.Contains(string(body), field) {
			t.Errorf("JSON lacks %s: %s", field, body)
		}
	}

	if _, err := r.Explain(ctx, nil); !errors.Is(err, ErrNoPods) {
		t.Fatalf("Explain with no pods = %v, want ErrNoPods", err)
	}
}
