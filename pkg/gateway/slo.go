package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/slo"
	"github.com/kvgate/kvgate/pkg/types"
)

// The error type and codes of the requests the SLO queues refuse (429),
// and of those they drop when the gateway stops (503).
const (
	codeSLOQueueFull  = "slo_queue_full"
	codeSLOUnmeetable = "slo_unmeetable"
	codeSLONoCapacity = "slo_no_capacity"
	codeSLOExpired    = "slo_expired"
	codeSLODisplaced  = "slo_displaced"
	codeSLOSheddable  = "slo_sheddable"
	codeShuttingDown  = "gateway_shutting_down"
	// HeaderRetryAfter says, in seconds, when a request refused with 429
	// may be sent again.
	HeaderRetryAfter = "Retry-After"
)

// newSLO builds the models' objectives and their queues, and wires the
// queues to what frees capacity: first tokens and completions (the request
// ledger), scrapes (the Store's OnScrape, set before the Store is built) and
// models leaving the fleet.
func (g *Gateway) newSLO() error {
	var err error
	if g.sloMetrics, err = slo.NewMetrics(g.registry); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.objectives = slo.NewObjectives(g.cfg.SLO, g.profiles)
	sc := g.cfg.SLO
	sc.Capacity = &g.capacity
	g.queues = slo.NewRouters(slo.NewProvider(sc, g.sloMetrics), g.sloMetrics)
	trigger := func(*inflight.Handle) { g.queues.Trigger() }
	g.ledger.Observe(inflight.Observer{FirstToken: trigger, Closed: trigger})
	g.store.AddPodListener(modelDepartures{g})
	return nil
}

var _ cache.ModelsListener = modelDepartures{}

// modelDepartures drops the per-model state of the models no pod serves
// any more, whether their pods left or changed or unloaded an adapter:
// their queues (refusing what waits) and output predictors.
type modelDepartures struct{ g *Gateway }

func (modelDepartures) OnPodAdd(*v1.Pod) {}

func (m modelDepartures) OnPodUpdate(_, _ *v1.Pod) { m.OnPodDelete(nil) }

func (m modelDepartures) OnPodModelsChange(*v1.Pod) { m.OnPodDelete(nil) }

func (m modelDepartures) OnPodDelete(*v1.Pod) {
	g := m.g
	for _, model := range g.queues.Models() {
		if !g.store.HasModel(model) {
			g.queues.Forget(model)
		}
	}
	g.predictors.Prune()
}

// routeSLO routes a request that waits in its model's queue (see queued)
// through it (see queueSLO). It returns the attempt opened on the chosen
// pod, or answers the client and returns false.
func (g *Gateway) routeSLO(w http.ResponseWriter, r *http.Request, a *admitted, rc *types.RoutingContext,
	req *inflight.Request, x *exchange, c *call) (*inflight.Handle, bool) {
	h, e := g.queueSLO(r.Context(), a, rc, req, x, nil)
	switch {
	case h != nil:
		return h, true
	case e == nil:
		c.status = statusClientClosed
		return nil, false
	}
	c.failWith(w, e)
	return nil, false
}

// sloCodes are the error codes of the requests the queues refuse, by reason.
var sloCodes = map[string]string{
	slo.ReasonQueueFull: codeSLOQueueFull, slo.ReasonUnmeetable: codeSLOUnmeetable,
	slo.ReasonNoCapacity: codeSLONoCapacity, slo.ReasonExpired: codeSLOExpired,
	slo.ReasonDisplaced: codeSLODisplaced, slo.ReasonSheddable: codeSLOSheddable,
}

// queueSLO routes a request through its model's queue: one that names an
// SLO-aware algorithm at once when a pod is predicted to meet its
// objective, else, with a pulling algorithm, once one is; one of another
// algorithm, under flow control (see queued), at once when a pod has
// capacity, else once one has (see flowTry, flowError); either for as long
// as ctx lasts.
// It returns the attempt opened on the chosen pod, or the error to answer
// the client with: 429 with a RetryAfter when the queue refused the request,
// it could no longer meet its objective or a request of a higher priority
// took its place, 503 when its model left the
// fleet, no pod is ready or the gateway stops. It returns neither when ctx
// ended first: the client went away. waiting, when set, is told when the
// request starts waiting (see slo.Entry.Waiting).
func (g *Gateway) queueSLO(ctx context.Context, a *admitted, rc *types.RoutingContext, req *inflight.Request,
	x *exchange, waiting func(time.Time)) (*inflight.Handle, *Error) {
	rc.SLO, _ = g.objectives.For(rc.Model, deployments(a.pods))
	q, err := g.queues.GetRouter(rc)
	if err != nil {
		return nil, &Error{Status: http.StatusServiceUnavailable, Type: typeServiceUnavailable, Code: codeShuttingDown, Message: err.Error()}
	}
	var h *inflight.Handle
	e := &slo.Entry{Request: rc, Deadline: slo.DeadlineOf(rc, g.cfg.SLO.MaxWait), Waiting: waiting}
	flow, hold := !routing.IsSLOAware(a.algorithm), routing.HoldsRequests(a.algorithm)
	if flow {
		e.Try, hold = g.flowTry(ctx, a, rc, req, x, &h), true
	} else {
		e.Try = g.sloTry(ctx, a, rc, req, x, &h)
	}
	err = q.Route(ctx, e, hold)
	switch {
	case err == nil && ctx.Err() != nil:
		h.Close(inflight.Cancelled, "client went away")
		return nil, nil
	case err == nil:
		return h, nil
	case ctx.Err() != nil:
		return nil, nil
	}
	var qe *slo.Error
	if !errors.As(err, &qe) {
		return nil, &Error{Status: http.StatusServiceUnavailable, Type: typeServiceUnavailable, Code: codeNoReadyPod, Message: err.Error()}
	}
	switch qe.Reason {
	case slo.ReasonModelGone:
		return nil, &Error{Status: http.StatusServiceUnavailable, Type: typeServiceUnavailable, Code: codeNoReadyPod, Param: "model",
			Message: qe.Error()}
	case slo.ReasonStopped:
		return nil, &Error{Status: http.StatusServiceUnavailable, Type: typeServiceUnavailable, Code: codeShuttingDown, Message: qe.Error()}
	}
	msg := qe.Error() + " (objective " + rc.SLO.String() + ")"
	if flow {
		if fe := g.flowError(a, qe); fe != nil {
			return nil, fe
		}
		msg = qe.Error()
	}
	return nil, &Error{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: sloCodes[qe.Reason], Message: msg,
		RetryAfter: qe.RetryAfter}
}

// sloTry returns the Try of a request naming an SLO-aware algorithm: it
// routes the request among its model's pods, not ejected unless all are,
// by its algorithm, which fails while no pod is predicted to meet its
// objective, setting *h to the attempt opened.
func (g *Gateway) sloTry(ctx context.Context, a *admitted, rc *types.RoutingContext, req *inflight.Request, x *exchange,
	h **inflight.Handle) func() error {
	return func() error {
		pods, err := a.b.store.ListPodsByModel(rc.Model)
		if err != nil {
			return err
		}
		x.snaps = a.b.store.Snapshots(pods, x.snaps[:0])
		if a.pods = withoutEjected(pods, x.snaps); len(a.pods) < len(pods) {
			x.snaps = a.b.store.Snapshots(a.pods, x.snaps[:0])
		}
		if err := a.b.router.Route(ctx, rc, x.snaps, &x.d); err != nil {
			return err
		}
		route := x.d.Route()
		route.PendingLoad = g.requestLoad(rc, x.d.Endpoint)
		*h = g.openAttempt(x, req, route)
		return nil
	}
}

// deployments returns the deployments of pods, each once.
func deployments(pods []*endpoint.Endpoint) []string {
	var out []string
	for _, p := range pods {
		if p.Deployment != "" && !slices.Contains(out, p.Deployment) {
			out = append(out, p.Deployment)
		}
	}
	return out
}

// sloView is the answer of GET /debug/slo: each model's objective, where
// it comes from, and its queue.
type sloView struct {
	Models []sloModelView `json:"models"`
}

type sloModelView struct {
	Model  string      `json:"model"`
	SLO    string      `json:"slo"`
	Source slo.Source  `json:"source"`
	Queue  *slo.Status `json:"queue,omitempty"`
}

// serveSLO answers GET /debug/slo.
func (g *Gateway) serveSLO(w http.ResponseWriter, r *http.Request) {
	if !allowMethod(w, r, http.MethodGet) {
		return
	}
	b := g.readyOr503(w)
	if b == nil {
		return
	}
	queues := map[string]slo.Status{}
	for _, s := range g.queues.Statuses() {
		queues[s.Model] = s
	}
	models := b.store.ListModels()
	for m := range queues {
		if !slices.Contains(models, m) {
			models = append(models, m)
		}
	}
	slices.Sort(models)
	view := sloView{Models: []sloModelView{}}
	for _, m := range models {
		pods, _ := b.store.ListPodsByModel(m)
		objective, src := g.objectives.For(m, deployments(pods))
		mv := sloModelView{Model: m, SLO: objective.String(), Source: src}
		if s, ok := queues[m]; ok {
			mv.Queue = &s
		}
		view.Models = append(view.Models, mv)
	}
	writeJSON(w, view)
}
