package gateway

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/slo"
	"github.com/kvgate/kvgate/pkg/types"
)

// queued reports whether a request of kind k waits in its model's queue
// while no pod can take it: one queuesForSLO accepts, and with flow control
// (Config.FlowControl) any other completion, chat, Messages or Responses
// request; never one pinned to the engine that holds the stored response
// it needs, which no other pod can serve.
func (g *Gateway) queued(k kind, a *admitted) bool {
	return !a.pinned && (queuesForSLO(k, a.algorithm) || g.cfg.FlowControl && k.generates())
}

// admits reports whether the pod of s can take one more request under flow
// control at now: it has capacity (hasCapacity), counting as waiting in its
// engine the attempts this gateway opened on it since its latest scrape
// began that still await their first token, which that scrape could not
// see. An engine that does not export its waiting requests is not limited
// by them, nor by those attempts.
func (c SaturationConfig) admits(s *cache.PodSnapshot, now time.Time) bool {
	if !c.hasCapacity(s, now) {
		return false
	}
	m := &s.Metrics
	if m.Measured&cache.HasWaiting == 0 || s.Load == nil {
		return true
	}
	return m.Waiting+float64(s.Load.PrefillsSince(m.At)) <= float64(c.QueueDepth)
}

// anyAdmits reports whether a pod of snaps admits one more request at now
// (admits): whether the pool has capacity under flow control.
func (c SaturationConfig) anyAdmits(snaps []cache.PodSnapshot, now time.Time) bool {
	for i := range snaps {
		if c.admits(&snaps[i], now) {
			return true
		}
	}
	return false
}

// flowTry returns the Try of a request waiting in its model's queue under
// flow control: it fails with an error wrapping
// cache.ErrLoadCapacityReached while no candidate pod can take the request
// (admits), and otherwise routes it by its algorithm among all the
// candidates, as a request that does not wait is routed (open), setting *h
// to the attempt opened: the gate is the pool's, as the Gateway API
// Inference Extension's flow control hands a request it dispatches to its
// scheduler, so that kv-aware still sends a request to the pod holding its
// prefix where that pays (confined to the pods with capacity, its cache
// hits scatter). The candidates are the model's pods as listed at each
// try, so that a pod added while the request waits can take it, within the
// subset a front end allowed, if any, and not ejected unless all are.
func (g *Gateway) flowTry(ctx context.Context, a *admitted, rc *types.RoutingContext, req *inflight.Request, x *exchange,
	h **inflight.Handle) func() error {
	return func() error {
		pods, err := a.b.store.ListPodsByModel(rc.Model)
		if err != nil {
			return err
		}
		if a.subset != nil {
			pods = inSubset(pods, a.subset)
		}
		if len(pods) == 0 {
			return fmt.Errorf("no pod serving the model `%s` is ready", rc.Model)
		}
		x.snaps = a.b.store.Snapshots(pods, x.snaps[:0])
		a.pods = withoutEjected(pods, x.snaps)
		if !g.cfg.Saturation.anyAdmits(x.snaps, time.Now()) {
			return fmt.Errorf("%w: %s", cache.ErrLoadCapacityReached, g.saturatedMessage(rc.Model, len(pods)))
		}
		*h, err = g.open(ctx, a.b, rc, a.pods, x, req)
		return err
	}
}

// saturatedMessage says why the n candidate pods of model have no capacity.
func (g *Gateway) saturatedMessage(model string, n int) string {
	c := g.cfg.Saturation
	return fmt.Sprintf("the pods of the model `%s` are saturated (none of %d has at most %d requests waiting, counting "+
		"those this gateway sent it since its latest scrape, at most %v of its KV cache in use and metrics from the last %v)",
		model, n, c.QueueDepth, c.KVCacheUtilization, c.MetricsStaleness)
}

// flowError is the answer to a request that left its model's queue under
// flow control without a pod, for the reasons particular to it, nil for
// the others: a sheddable request that would have had to wait is refused
// as shed is (429 pool_saturated, counted in
// kvgate_gateway_shed_requests_total), and one that waited the longest
// allowed while the pods stayed saturated is answered 429 pool_saturated.
func (g *Gateway) flowError(a *admitted, qe *slo.Error) *Error {
	switch qe.Reason {
	case slo.ReasonSheddable:
		g.metrics.shed.WithLabelValues(a.model).Inc()
		return &Error{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: codePoolSaturated,
			Message: fmt.Sprintf("%s, and the request's objective (priority %d) is sheddable", g.saturatedMessage(a.model, len(a.pods)),
				a.priority),
			RetryAfter: qe.RetryAfter}
	case slo.ReasonExpired:
		return &Error{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: codePoolSaturated,
			Message: fmt.Sprintf("%s: the request waited %v in the model's queue, the longest allowed",
				g.saturatedMessage(a.model, len(a.pods)), qe.Waited.Round(time.Millisecond)),
			RetryAfter: qe.RetryAfter}
	}
	return nil
}
