package routingbench

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/slo"
	"github.com/kvgate/kvgate/pkg/types"
)

// policy chooses an engine for each request and hears what becomes of the
// requests it routed.
type policy interface {
	// route chooses the engine request i (r) is sent to now; -1 when the
	// policy holds the request, to send it later (simulation.send), or
	// refused it (simulation.refuse).
	route(i int, r *Request) (engine int, err error)
	// firstToken reports that request i's first token came back.
	firstToken(i int) error
	// ended reports that request i ended, with the usage the engine
	// reported (none when it refused the request): it finished, or the
	// engine refused it.
	ended(i int, usage inflight.Usage) error
	// changed reports that what the gateway knows of the engines may have
	// changed (a scrape), or that a look the policy asked for is due
	// (simulation.wakeAt): a policy holding requests tries them.
	changed() error
	// holding reports that the policy holds requests.
	holding() bool
}

// newPolicy returns the named policy over s's fleet, run as
// Config.Replicas gateway replicas.
func newPolicy(name string, s *simulation) (policy, error) {
	if name == TTFTOracle {
		return newOracle(s.fleet, s.cfg.Seed), nil
	}
	if s.cfg.Replicas > 1 {
		return newReplicated(name, s)
	}
	p, _, err := newGatewayPolicy(name, s, "", nil)
	return p, err
}

// newGatewayPolicy returns the named policy of one gateway over s's fleet,
// and the router policy it routes with. The gateway's random stream is the
// policy's, distinguished by replica, and loads are its load records of
// the engines (nil: the engines' own).
func newGatewayPolicy(name string, s *simulation, replica string, loads []*inflight.PodLoad) (policy, *routerPolicy, error) {
	// The SLO-aware policies draw from kv-aware's random stream: where
	// every pod meets the SLO they decide exactly as kv-aware does.
	stream := name
	if routing.IsSLOAware(name) {
		stream = routing.KVAware
	}
	rp, err := newRouterPolicy(name, stream+replica, s.fleet, s.cfg)
	if err != nil {
		return nil, nil, err
	}
	rp.loads = loads
	if !routing.IsSLOAware(name) {
		return rp, rp, nil
	}
	return newQueuedPolicy(rp, s), rp, nil
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
	// loads are the gateway's load records of the engines, in order; nil
	// for the engines' own.
	loads []*inflight.PodLoad
}

func newRouterPolicy(alg, stream string, f *fleet, cfg Config) (*routerPolicy, error) {
	r, err := routing.New(routing.Config{
		Index:                         f.index,
		DefaultAlgorithm:              alg,
		DefaultPrefillTokensPerSecond: cfg.RouterPrefillTokensPerSecond,
		MinFleetQueue:                 cfg.RouterMinFleetQueue,
		Rand:                          policySeed(cfg.Seed, stream),
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

// context returns the routing context of request r.
func (p *routerPolicy) context(r *Request) *types.RoutingContext {
	ctx := types.NewRoutingContext(r.ID, benchModel)
	ctx.Algorithm = p.alg
	ctx.PromptTokenIDs = r.routeTokens()
	ctx.ReceivedAt = simEpoch.Add(r.Arrival)
	return ctx
}

func (p *routerPolicy) route(i int, r *Request) (int, error) {
	idx, err := p.routeContext(i, p.context(r))
	if err != nil {
		return 0, fmt.Errorf("route %s: %w", r.ID, err)
	}
	return idx, nil
}

// routeContext routes request i, whose routing context is ctx, and opens
// its attempt on the chosen engine.
func (p *routerPolicy) routeContext(i int, ctx *types.RoutingContext) (int, error) {
	p.snaps = storeView{p.f, p.loads}.snapshots(p.snaps[:0])
	if err := p.router.Route(context.Background(), ctx, p.snaps, &p.decision); err != nil {
		return 0, err
	}
	p.attempts[i] = p.ledger.Admit(ctx.RequestID, benchModel).Route(p.decision.Route())
	return p.f.byName[p.decision.Endpoint.Key.Name].index, nil
}

func (p *routerPolicy) firstToken(i int) error {
	p.attempts[i].FirstToken()
	return nil
}

func (p *routerPolicy) ended(i int, usage inflight.Usage) error {
	h := p.attempts[i]
	if usage.CompletionTokens > 0 {
		h.ReportUsage(usage)
	}
	if predicted, found, ok := routing.CachedComparison(h.Route(), usage); ok {
		p.f.cachedPredicted += predicted
		p.f.cachedFound += found
	}
	h.Close(inflight.Done, "")
	h.Request().End()
	delete(p.attempts, i)
	return nil
}

func (*routerPolicy) changed() error { return nil }

func (*routerPolicy) holding() bool { return false }

// queuedPolicy routes with an SLO-aware algorithm through the gateway's
// per-model queue (slo.QueueRouter) on the virtual clock: a request no
// engine is predicted to serve within Config.SLO waits, and every first
// token, completion and scrape makes a pass over the waiting requests, as
// in the gateway.
type queuedPolicy struct {
	*routerPolicy
	s    *simulation
	q    *slo.QueueRouter
	hold bool
	// err is the first error a request's routing met inside a pass.
	err error
	// busy is set while the queue decides, which a request refused by its
	// engine at once must not re-enter.
	busy bool
}

func newQueuedPolicy(rp *routerPolicy, s *simulation) *queuedPolicy {
	q := slo.NewQueueRouter(benchModel, slo.QueueConfig{MaxLength: s.cfg.QueueMaxLength, MaxWait: s.cfg.QueueMaxWait,
		Now: s.fleet.clock}, nil)
	return &queuedPolicy{routerPolicy: rp, s: s, q: q, hold: routing.HoldsRequests(rp.alg)}
}

func (p *queuedPolicy) route(i int, r *Request) (int, error) {
	ctx := p.context(r)
	ctx.SLO = p.s.cfg.SLO
	e := &slo.Entry{Request: ctx, Deadline: slo.DeadlineOf(ctx, p.s.cfg.QueueMaxWait)}
	e.Try = func() error { return p.try(i, ctx) }
	e.Done = func(err error) { p.left(i, err) }
	p.busy = true
	queued, err := p.q.Submit(e, p.hold)
	p.busy = false
	switch {
	case queued:
		p.s.reqs[i].queued = true
		p.changed() // the gateway's loop passes at once
		p.wake()
	case err != nil:
		p.left(i, err)
	}
	return -1, p.takeErr()
}

// try routes request i now, sending it to the chosen engine.
func (p *queuedPolicy) try(i int, ctx *types.RoutingContext) error {
	idx, err := p.routeContext(i, ctx)
	if err != nil {
		return err
	}
	if err := p.s.send(i, idx); err != nil && p.err == nil {
		p.err = err
	}
	return nil
}

// left records request i leaving the queue: sent (nil) or refused.
func (p *queuedPolicy) left(i int, err error) {
	var qe *slo.Error
	switch {
	case err == nil:
	case errors.As(err, &qe):
		p.s.refuse(i, qe.Reason)
	case p.err == nil:
		p.err = fmt.Errorf("route %s: %w", p.s.w.Requests[i].ID, err)
	}
}

// takeErr returns and clears the error met inside a pass.
func (p *queuedPolicy) takeErr() error {
	err := p.err
	p.err = nil
	return err
}

// wake asks for a look at the queue when its first request must leave.
func (p *queuedPolicy) wake() {
	if at, ok := p.q.NextExpiry(); ok {
		p.s.wakeAt(max(at.Sub(simEpoch), p.s.now))
	}
}

func (p *queuedPolicy) firstToken(i int) error {
	if err := p.routerPolicy.firstToken(i); err != nil {
		return err
	}
	return p.changed()
}

func (p *queuedPolicy) ended(i int, usage inflight.Usage) error {
	if err := p.routerPolicy.ended(i, usage); err != nil {
		return err
	}
	return p.changed()
}

func (p *queuedPolicy) changed() error {
	if p.q.Len() > 0 && !p.busy {
		p.busy = true
		p.q.Dispatch()
		p.busy = false
		p.wake()
	}
	if p.busy {
		return nil
	}
	return p.takeErr()
}

func (p *queuedPolicy) holding() bool { return p.q.Len() > 0 }
