package slo

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/kvgate/kvgate/pkg/types"
)

// ModelRouterProvider returns the QueueRouter of a model, as AIBrix's
// cache asks its ModelRouterProviderFunc for one; Routers calls it once per
// model, the first time GetRouter asks for the model.
type ModelRouterProvider func(model string) (*QueueRouter, error)

// ErrStopped reports a Routers asked for a queue after it stopped.
var ErrStopped = errors.New("SLO queues stopped")

// Routers holds the QueueRouter of each model that has had a request with
// an SLO-aware algorithm, and runs their loops. A model's queue is created
// on first use (GetRouter) and dropped, its waiting requests refused and
// its metrics deleted, when the model leaves the fleet (Forget). Its
// methods are safe for concurrent use.
type Routers struct {
	provider ModelRouterProvider
	metrics  *Metrics

	mu      sync.Mutex
	routers map[string]*runningRouter
	ctx     context.Context // set by Run; nil before and after
	stopped bool
	wg      sync.WaitGroup
}

type runningRouter struct {
	*QueueRouter
	cancel context.CancelFunc
}

// NewRouters returns the queues provider creates. metrics, which may be
// nil, is the one their queues were given: Forget deletes a model's series
// there.
func NewRouters(provider ModelRouterProvider, metrics *Metrics) *Routers {
	return &Routers{provider: provider, metrics: metrics, routers: map[string]*runningRouter{}}
}

// NewProvider returns the ModelRouterProvider that builds a queue per model
// bounded by cfg, counted on metrics (nil for none).
func NewProvider(cfg Config, metrics *Metrics) ModelRouterProvider {
	cfg = cfg.withDefaults()
	return func(model string) (*QueueRouter, error) {
		return NewQueueRouter(model, QueueConfig{MaxLength: cfg.MaxQueueLength, MaxWait: cfg.MaxWait, Capacity: cfg.Capacity,
			Fairness: cfg.Fairness}, metrics), nil
	}
}

// GetRouter returns the queue of the request's model (rc.Model), created
// on first use, as AIBrix's Store.GetRouter does; while Run runs, its loop
// runs too. It fails with ErrStopped once Run has returned or Close was
// called, and with the provider's error.
func (r *Routers) GetRouter(rc *types.RoutingContext) (*QueueRouter, error) {
	model := rc.Model
	r.mu.Lock()
	defer r.mu.Unlock()
	if rr, ok := r.routers[model]; ok {
		return rr.QueueRouter, nil
	}
	if r.stopped {
		return nil, ErrStopped
	}
	q, err := r.provider(model)
	if err != nil {
		return nil, err
	}
	rr := &runningRouter{QueueRouter: q}
	r.routers[model] = rr
	if r.ctx != nil {
		r.startLocked(rr)
	}
	return q, nil
}

// startLocked runs rr's loop until Run's context ends or its model is
// forgotten; r.mu is held.
func (r *Routers) startLocked(rr *runningRouter) {
	ctx, cancel := context.WithCancel(r.ctx)
	rr.cancel = cancel
	r.wg.Go(func() { _ = rr.Run(ctx) })
}

// Run runs the loop of every queue, those created later included, until
// ctx ends; it then refuses the requests still waiting (ReasonStopped),
// waits for the loops to return and returns nil.
func (r *Routers) Run(ctx context.Context) error {
	r.mu.Lock()
	r.ctx = ctx
	for _, rr := range r.routers {
		r.startLocked(rr)
	}
	r.mu.Unlock()
	<-ctx.Done()
	r.mu.Lock()
	r.ctx, r.stopped = nil, true
	r.mu.Unlock()
	r.wg.Wait()
	return nil
}

// Close refuses the requests waiting in every queue and those submitted
// from then on (ReasonStopped), for a gateway that shuts down; GetRouter
// fails with ErrStopped afterwards.
func (r *Routers) Close() {
	r.mu.Lock()
	r.stopped = true
	qs := make([]*QueueRouter, 0, len(r.routers))
	for _, rr := range r.routers {
		qs = append(qs, rr.QueueRouter)
	}
	r.mu.Unlock()
	for _, q := range qs {
		q.Close(ReasonStopped)
	}
}

// Forget drops model's queue, refusing its waiting requests
// (ReasonModelGone) and deleting its metrics: the model left the fleet.
// A request for the model later gets a new queue.
func (r *Routers) Forget(model string) {
	r.mu.Lock()
	rr, ok := r.routers[model]
	if ok {
		// Under r.mu, so that a queue GetRouter creates for the model
		// from now on keeps its series; what the old queue still counts
		// (Close refusing what waits) is no longer exported.
		delete(r.routers, model)
		r.metrics.forget(model)
	}
	r.mu.Unlock()
	if !ok {
		return
	}
	rr.Close(ReasonModelGone)
	if rr.cancel != nil {
		rr.cancel()
	}
}

// Trigger wakes the loop of every queue with requests waiting, for a pass:
// a pod may have capacity now (a first token, a completion, a scrape).
func (r *Routers) Trigger() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rr := range r.routers {
		if rr.Len() > 0 {
			rr.Trigger()
		}
	}
}

// Models returns the models that have a queue, sorted.
func (r *Routers) Models() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	models := make([]string, 0, len(r.routers))
	for m := range r.routers {
		models = append(models, m)
	}
	slices.Sort(models)
	return models
}

// Statuses returns the state of every queue, by model.
func (r *Routers) Statuses() []Status {
	r.mu.Lock()
	qs := make([]*QueueRouter, 0, len(r.routers))
	for _, rr := range r.routers {
		qs = append(qs, rr.QueueRouter)
	}
	r.mu.Unlock()
	out := make([]Status, 0, len(qs))
	for _, q := range qs {
		out = append(out, q.Status())
	}
	slices.SortFunc(out, func(a, b Status) int { return cmp.Compare(a.Model, b.Model) })
	return out
}
