package routingbench

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/inflight"
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
	// ended reports that request i ended, with the usage the engine
	// reported (none when it refused the request): it finished, or the engine
	// refused it.
	ended(i int, usage inflight.Usage)
}

// newPolicy returns the named policy over f, configured by cfg.
func newPolicy(name string, f *fleet, cfg Config) (policy, error) {
	if name == TTFTOracle {
		return newOracle(f, cfg.Seed), nil
	}
	return newRouterPolicy(name, f, cfg)
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
// engines, each request recorded in a request ledger on the virtual clock.
type routerPolicy struct {
	alg      string
	f        *fleet
	router   *routing.Router
	ledger   *inflight.Ledger
	decision routing.Decision
	snaps    []cache.PodSnapshot
	attempts map[int]*inflight.Handle
}

func newRouterPolicy(alg string, f *fleet, cfg Config) (*routerPolicy, error) {
	r, err := routing.New(routing.Config{
		Index:                         f.index,
		DefaultAlgorithm:              alg,
		DefaultPrefillTokensPerSecond: cfg.RouterPrefillTokensPerSecond,
		Rand:                          policySeed(cfg.Seed, alg),
		Now:                           f.clock,
	})
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", alg, err)
	}
	l, err := inflight.New(inflight.Config{Now: f.clock})
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", alg, err)
	}
	l.Observe(r.Observer())
	return &routerPolicy{alg: alg, f: f, router: r, ledger: l, attempts: make(map[int]*inflight.Handle)}, nil
}

func (p *routerPolicy) route(i int, r *Request) (int, error) {
	ctx := types.NewRoutingContext(r.ID, benchModel)
	ctx.Algorithm = p.alg
	ctx.PromptTokenIDs = r.routeTokens()
	p.snaps = storeView{p.f}.snapshots(p.snaps[:0])
	if err := p.router.Route(context.Background(), ctx, p.snaps, &p.decision); err != nil {
		return 0, fmt.Errorf("route %s: %w", r.ID, err)
	}
	p.attempts[i] = p.ledger.Admit(r.ID, benchModel).Route(p.decision.Route())
	return p.f.byName[p.decision.Endpoint.Key.Name].index, nil
}

func (p *routerPolicy) firstToken(i int) { p.attempts[i].FirstToken() }

func (p *routerPolicy) ended(i int, usage inflight.Usage) {
	h := p.attempts[i]
	if usage.CompletionTokens > 0 {
		h.ReportUsage(usage)
	}
	h.Close(inflight.Done, "")
	h.Request().End()
	delete(p.attempts, i)
}
