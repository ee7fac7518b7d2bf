package routingbench

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/pkg/routing"
)

// TestKVAwareMeetsItsTargetsOnTheSyntheticMooncakeTrace replays the
// Mooncake-format trace of the testdata on the default fleet (8 engines
// whose caches cannot hold the trace) and holds kv-aware to its targets:
// a token hit ratio at least 95% of the oracle's and twice least-request's,
// and a p90 time to first token at most half least-request's.
//
// The simulation runs each policy on one goroutine, where the race
// detector finds nothing and only multiplies the minute of CPU the test
// takes; TestRunIsDeterministicWhateverItsParallelism runs policies
// concurrently under it.
func TestKVAwareMeetsItsTargetsOnTheSyntheticMooncakeTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 4,000 requests under three policies")
	}
	if raceEnabled {
		t.Skip("single-goroutine simulation: the race detector only slows it down")
	}
	cfg := Config{Policies: []string{routing.LeastRequest, routing.KVAware, TTFTOracle}, Seed: 1, Parallel: 3}
	rep, err := Run(context.Background(), cfg, loadSyntheticTrace(t))
	if err != nil {
		t.Fatal(err)
	}
	logTable(t, rep)
	for _, target := range rep.Targets() {
		if !target.Met {
			t.Errorf("missed %s: %.3f against a bound of %.3f", target.Name, target.Value, target.Bound)
		}
	}
	if n := len(rep.Targets()); n != 3 {
		t.Errorf("%d targets checked, want 3", n)
	}
}
