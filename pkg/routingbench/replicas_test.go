package routingbench

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/pkg/routing"
)

// replicaRun runs kv-aware over w as replicas gateway replicas, sharing
// their state unless unshared.
func replicaRun(t *testing.T, w Workload, replicas int, unshared bool) *PolicyResult {
	t.Helper()
	cfg := smallFleet()
	cfg.Policies = []string{routing.KVAware}
	cfg.Replicas, cfg.Unshared = replicas, unshared
	rep, err := Run(context.Background(), cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Result(routing.KVAware)
	if r.Completed != len(w.Requests) {
		t.Fatalf("%d replicas: %d of %d requests completed", replicas, r.Completed, len(w.Requests))
	}
	return r
}

func TestReplicasSharingStateRouteAsOneGateway(t *testing.T) {
	// The fleet holds the 16 documents once (see
	// TestPrefixAwarePoliciesWinWhenEveryEngineCannotHoldEveryDocument): a
	// replica that sees only its own requests keeps sending a document to
	// the engine holding it after the others filled that engine's queue,
	// or prefills it elsewhere when another replica just did.
	w := docsWorkload(600, 16, 2048, 64, 15, 3)
	one := replicaRun(t, w, 1, false)
	shared := replicaRun(t, w, 3, false)
	unshared := replicaRun(t, w, 3, true)
	t.Logf("TTFT p90 / hit ratio: one gateway %.3f s / %.3f, three sharing %.3f s / %.3f, three not sharing %.3f s / %.3f",
		one.TTFT.P90, one.HitRatio, shared.TTFT.P90, shared.HitRatio, unshared.TTFT.P90, unshared.HitRatio)
	if shared.TTFT.P90 > 1.25*one.TTFT.P90 || shared.HitRatio < one.HitRatio-0.03 {
		t.Errorf("replicas sharing state route worse than one gateway")
	}
	if unshared.TTFT.P90 < 1.5*shared.TTFT.P90 || unshared.HitRatio >= shared.HitRatio {
		t.Errorf("replicas not sharing state route about as well as replicas sharing it: the test tells nothing")
	}
}
