package routingbench

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"

	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/types"
)

// policy chooses an engine for each request and hears what becomes of the
// requests it routed.
type policy interface {
	// route chooses the engine request i (r) is sent to, now.
	route(i int, r *Request) (engine int, err error)
	// firstToken reports that request i's first token came back.
	firstToken(i int)
	// ended reports that request i ended: it finished, or the engine
	// refused it.
	ended(i int)
}

// newPolicy returns the named policy over f.
func newPolicy(name string, f *fleet, seed uint64) (policy, error) {
	if name == Oracle {
		return newOracle(f, seed), nil
	}
	return newRouterPolicy(name, f, seed)
}

// policySeed derives the random stream of one policy from the benchmark's
// seed.
func policySeed(seed uint64, name string) *rand.PCG {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.NewPCG(seed, h.Sum64())
}

// routerPolicy routes as the gateway does: the routing package's Router
// running one algorithm over the index and the Store's view of the
// engines, with the gateway's in-flight prefill accounting.
type routerPolicy struct {
	alg      string
	f        *fleet
	router   *routing.Router
	decision routing.Decision
	prefills map[int]*routing.Prefill
}

func newRouterPolicy(alg string, f *fleet, seed uint64) (*routerPolicy, error) {
	r, err := routing.New(routing.Config{
		Metrics:          storeView{f},
		Index:            f.index,
		DefaultAlgorithm: alg,
		Rand:             policySeed(seed, alg),
		Now:              f.clock,
	})
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", alg, err)
	}
	return &routerPolicy{alg: alg, f: f, router: r, prefills: make(map[int]*routing.Prefill)}, nil
}

func (p *routerPolicy) route(i int, r *Request) (int, error) {
	ctx := types.NewRoutingContext(r.ID, benchModel)
	ctx.Algorithm = p.alg
	ctx.PromptTokenIDs = r.Prompt
	if err := p.router.Route(context.Background(), ctx, p.f.pods, &p.decision); err != nil {
		return 0, fmt.Errorf("route %s: %w", r.ID, err)
	}
	p.prefills[i] = p.router.StartPrefill(&p.decision)
	return p.f.byName[p.decision.Endpoint.Key.Name].index, nil
}

func (p *routerPolicy) firstToken(i int) { p.prefills[i].FirstToken() }

func (p *routerPolicy) ended(i int) {
	p.prefills[i].Done()
	delete(p.prefills, i)
}
