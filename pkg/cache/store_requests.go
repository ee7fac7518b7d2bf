package cache

import (
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/endpoint"

	"github.com/kvgate/kvgate/pkg/types"
)

// AddRequestCount starts tracking request requestID for modelName and
// returns its term, which its completion must present. Calling it again for
// a request in flight changes no count and returns the same term, except
// that once ctx has a target pod the request counts as running on that pod
// (moving it there if it was counted on another), with the pending load its
// GPU profile gives (RealtimeNormalizedPendings). So the gateway may call it
// before routing, to count the request as queueing, and again after. ctx may
// be nil.
func (s *Store) AddRequestCount(ctx *types.RoutingContext, requestID, modelName string) (traceTerm int64) {
	var r route
	if ctx != nil && ctx.HasRouted() {
		pod := ctx.TargetPod()
		if e := s.reg.entry(endpoint.KeyOf(pod)); e != nil {
			r.pod = e.state
			r.pending = s.requestLoad(ctx, e, modelName)
		} else if l := s.log.V(2); l.Enabled() {
			l.Info("Request routed to an unregistered pod; not counted on it", "requestID", requestID, "pod", klog.KObj(pod))
		}
	}
	term, isNew := s.requests.add(requestID, modelName, time.Now(), r)
	if isNew && s.tracer != nil {
		s.tracer.addRequest(modelName)
	}
	return term
}

// requestLoad is the pending load the request for model adds to the pod, 0
// when the pod's deployment has no GPU profile for the model. It runs for
// every routed request, so the common case of no profile costs no error
// value.
func (s *Store) requestLoad(ctx *types.RoutingContext, e *podEntry, model string) float64 {
	if s.profiles.size() == 0 {
		return 0
	}
	dep := e.ep.Deployment
	if dep == "" {
		return 0
	}
	profile := s.profiles.lookup(ModelGPUProfileKey(model, dep))
	if profile == nil {
		return 0
	}
	load, err := pendingLoad(profile, ctx, e.ep.Pod)
	if err != nil {
		if l := s.log.V(2); l.Enabled() {
			l.Info("No pending load for request", "requestID", ctx.RequestID, "pod", klog.KObj(e.ep.Pod), "err", err)
		}
		return 0
	}
	return load
}

// DoneRequestCount ends the tracking of a request whose token counts are
// unknown. Only the completion that presents the request's current term
// counts: a duplicate, or a late completion of an earlier request with the
// same id, is ignored. The request is known by its id and term: modelName
// is the one given to AddRequestCount and is not needed again. ctx may be
// nil.
func (s *Store) DoneRequestCount(ctx *types.RoutingContext, requestID, modelName string, traceTerm int64) {
	s.done(ctx, requestID, traceTerm)
}

// DoneRequestTrace ends the tracking of a request as DoneRequestCount does
// and records its token counts in the request trace and the model's output
// predictor.
func (s *Store) DoneRequestTrace(ctx *types.RoutingContext, requestID, modelName string, inputTokens, outputTokens, traceTerm int64) {
	model, ok := s.done(ctx, requestID, traceTerm)
	if !ok {
		return
	}
	if s.tracer != nil {
		s.tracer.addTrace(model, inputTokens, outputTokens)
	}
	if p, err := s.GetOutputPredictor(model); err == nil {
		p.AddTrace(int(inputTokens), int(outputTokens), 1)
	}
}

// done stops tracking the request and returns the model it was tracked for.
func (s *Store) done(ctx *types.RoutingContext, requestID string, term int64) (string, bool) {
	model, outcome := s.requests.done(requestID, term)
	switch outcome {
	case doneUnknown:
		s.metrics.doneIgnored.WithLabelValues("unknown").Inc()
		if l := s.log.V(4); l.Enabled() {
			l.Info("Ignoring completion of an untracked request", "requestID", requestID, "term", term)
		}
		return "", false
	case doneStaleTerm:
		s.metrics.doneIgnored.WithLabelValues("stale_term").Inc()
		if l := s.log.V(2); l.Enabled() {
			l.Info("Ignoring completion from an older term", "requestID", requestID, "term", term)
		}
		return "", false
	}
	return model, true
}

// DumpRequestTrace returns the request trace of modelName for the current
// window in the stored format, nil when request traces are off or the model
// has no requests in the window.
func (s *Store) DumpRequestTrace(modelName string) map[string]int {
	if s.tracer == nil {
		return nil
	}
	load := s.requests.model(modelName)
	return s.tracer.dump(modelName, int(load.pending), int(load.pending-load.routed))
}

// GetOutputPredictor returns the output predictor of modelName, created on
// first use, which DoneRequestTrace feeds. It fails with a
// *ModelNotFoundError when no registered pod serves the model.
func (s *Store) GetOutputPredictor(modelName string) (*SimpleOutputPredictor, error) {
	if p, ok := s.predictors.Load(modelName); ok {
		return p.(*SimpleOutputPredictor), nil
	}
	if !s.HasModel(modelName) {
		return nil, &ModelNotFoundError{Model: modelName}
	}
	p, _ := s.predictors.LoadOrStore(modelName, NewSimpleOutputPredictor(
		s.cfg.PredictorMaxInputTokens, s.cfg.PredictorMaxOutputTokens, s.cfg.PredictorWindow,
		WithColdPrediction(s.cfg.ColdPrediction)))
	return p.(*SimpleOutputPredictor), nil
}
