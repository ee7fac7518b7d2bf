package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"

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

// modelDepartures drops the per-model state of the models no pod serves
// any more: their queues (refusing what waits) and output predictors.
type modelDepartures struct{ g *Gateway }

func (modelDepartures) OnPodAdd(*v1.Pod) {}

func (m modelDepartures) OnPodUpdate(_, _ *v1.Pod) { m.OnPodDelete(nil) }

func (m modelDepartures) OnPodDelete(*v1.Pod) {
	g := m.g
	for _, model := range g.queues.Models() {
		if !g.store.HasModel(model) {
			g.queues.Forget(model)
		}
	}
	g.predictors.Prune()
}

// routeSLO routes a request that names an SLO-aware algorithm through its
// model's queue: at once when a pod is predicted to meet its objective,
// else, with a pulling algorithm, once one is, for as long as the client
// waits. It returns the attempt opened on the chosen pod, or answers the
// client and returns false: 429 with Retry-After when the queue refused the
// request or it could no longer meet its objective, 503 when its model
// left the fleet or no pod is ready.
func (g *Gateway) routeSLO(w http.ResponseWriter, r *http.Request, a *admitted, rc *types.RoutingContext,
	req *inflight.Request, x *exchange, c *call) (*inflight.Handle, bool) {
	rc.SLO, _ = g.objectives.For(rc.Model, deployments(a.pods))
	q, err := g.queues.GetRouter(rc)
	if err != nil {
		c.fail(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeShuttingDown, "", err.Error())
		return nil, false
	}
	var h *inflight.Handle
	e := &slo.Entry{Request: rc, Deadline: slo.DeadlineOf(rc, g.cfg.SLO.MaxWait)}
	e.Try = func() error {
		pods, err := a.b.store.ListPodsByModel(rc.Model)
		if err != nil {
			return err
		}
		x.snaps = a.b.store.Snapshots(pods, x.snaps[:0])
		if a.pods = withoutEjected(pods, x.snaps); len(a.pods) < len(pods) {
			x.snaps = a.b.store.Snapshots(a.pods, x.snaps[:0])
		}
		if err := a.b.router.Route(r.Context(), rc, x.snaps, &x.d); err != nil {
			return err
		}
		route := x.d.Route()
		route.PendingLoad = g.requestLoad(rc, x.d.Endpoint)
		h = req.Route(route)
		return nil
	}
	err = q.Route(r.Context(), e, routing.HoldsRequests(c.algorithm))
	switch {
	case err == nil && r.Context().Err() != nil:
		h.Close(inflight.Cancelled, "client went away")
		c.status = statusClientClosed
		return nil, false
	case err == nil:
		return h, true
	case r.Context().Err() != nil:
		c.status = statusClientClosed
		return nil, false
	}
	var qe *slo.Error
	if !errors.As(err, &qe) {
		c.fail(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeNoReadyPod, "", err.Error())
		return nil, false
	}
	code := map[string]string{
		slo.ReasonQueueFull: codeSLOQueueFull, slo.ReasonUnmeetable: codeSLOUnmeetable,
		slo.ReasonNoCapacity: codeSLONoCapacity, slo.ReasonExpired: codeSLOExpired,
	}[qe.Reason]
	switch qe.Reason {
	case slo.ReasonModelGone:
		c.fail(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeNoReadyPod, "model", qe.Error())
	case slo.ReasonStopped:
		c.fail(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeShuttingDown, "", qe.Error())
	default:
		w.Header().Set(HeaderRetryAfter, strconv.Itoa(int(qe.RetryAfter.Seconds())))
		c.fail(w, http.StatusTooManyRequests, typeRateLimit, code, "", qe.Error()+" (objective "+rc.SLO.String()+")")
	}
	return nil, false
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
