package routing

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/types"
)

// Explanation shows how each algorithm would route one request, from one
// snapshot of the pods' inputs. Its JSON form is the answer of the gateway's
// POST /debug/match.
type Explanation struct {
	Model            string `json:"model"`
	LoraAdapter      string `json:"lora,omitempty"`
	DefaultAlgorithm string `json:"defaultAlgorithm"`
	// Decisions holds one decision per algorithm, in Algorithms() order.
	// Every decision's candidates carry every input (matched and uncached
	// tokens, load, queue, speed, latencies), so any one of them is the
	// per-pod match table.
	Decisions []Decision `json:"decisions"`
}

// Explain reports the decision every algorithm would take for the request
// among pods, as Route would take it but without routing: it sets no target
// pod, counts no metric, starts no prefill and draws random choices from a
// source of its own. Matching the prompt does refresh the index's record of
// the matched blocks and pods as recently used. It fails with an error
// wrapping ErrNoPods when pods is empty.
func (r *Router) Explain(rc *types.RoutingContext, pods []cache.PodSnapshot) (*Explanation, error) {
	if len(pods) == 0 {
		return nil, fmt.Errorf("explain request %s for model %q: %w", rc.RequestID, rc.Model, ErrNoPods)
	}
	s := new(scratch)
	var snapshot Decision
	base := r.gather(rc, pods, needAll, &snapshot, s)
	base.rng = newLockedRand(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	e := &Explanation{
		Model:            rc.Model,
		LoraAdapter:      rc.LoraAdapter,
		DefaultAlgorithm: r.cfg.DefaultAlgorithm,
		Decisions:        make([]Decision, 0, len(algorithmNames)),
	}
	for _, name := range algorithmNames {
		d := snapshot
		d.Algorithm = name
		d.Candidates = slices.Clone(snapshot.Candidates)
		in := base
		in.d = &d
		r.algs[name].pick(in)
		if d.chosen >= 0 {
			r.settle(rc, &in, s)
		}
		e.Decisions = append(e.Decisions, d)
	}
	return e, nil
}
