package cache

import (
	"errors"
	"fmt"
	"math"

	v1 "k8s.io/api/core/v1"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/types"
)

// LoadProvider measures a pod's load in terms of one metric.
type LoadProvider interface {
	// GetUtilization returns the pod's current load.
	GetUtilization(ctx *types.RoutingContext, pod *v1.Pod) (float64, error)
	// GetConsumption returns the load the request would add to the pod.
	// ErrSLOFailureRequest means the pod cannot serve the request within
	// its SLO at all, so the request may be rejected early.
	GetConsumption(ctx *types.RoutingContext, pod *v1.Pod) (float64, error)
}

// CappedLoadProvider is a LoadProvider whose load has a known capacity.
type CappedLoadProvider interface {
	LoadProvider
	// Cap returns the load at which a pod is full.
	Cap() float64
}

// CachedLoadProvider measures load with a metric the Store keeps per pod.
// The metric decides what one request consumes:
//   - NumRequestsRunning, NumRequestsWaiting, RealtimeNumRequestsRunning:
//     one request;
//   - KVCacheUsagePerc: the share of the pod's KV-cache blocks the request's
//     prompt and predicted output fill, from CacheBlockSize and
//     CacheNumGPUBlocks.
type CachedLoadProvider struct {
	metrics    MetricCache
	metricName string
}

// NewCachedLoadProvider returns a provider reading metricName from metrics.
// It fails for a metric without a consumption model (see
// CachedLoadProvider); RealtimeNormalizedPendings is measured by
// PendingLoadProvider.
func NewCachedLoadProvider(metrics MetricCache, metricName string) (*CachedLoadProvider, error) {
	switch metricName {
	case NumRequestsRunning, NumRequestsWaiting, RealtimeNumRequestsRunning, KVCacheUsagePerc:
		return &CachedLoadProvider{metrics: metrics, metricName: metricName}, nil
	case RealtimeNormalizedPendings:
		return nil, fmt.Errorf("load of %s is measured by NewPendingLoadProvider", metricName)
	}
	return nil, fmt.Errorf("no load model for metric %q", metricName)
}

// GetUtilization returns the pod's value of the metric; it fails with a
// *MetricNotFoundError while the Store has none.
func (p *CachedLoadProvider) GetUtilization(_ *types.RoutingContext, pod *v1.Pod) (float64, error) {
	v, err := p.metrics.GetMetricValueByPod(endpoint.KeyOf(pod), p.metricName)
	if err != nil {
		return 0, err
	}
	return v.Value, nil
}

// GetConsumption returns what the request adds to the metric on pod.
func (p *CachedLoadProvider) GetConsumption(ctx *types.RoutingContext, pod *v1.Pod) (float64, error) {
	if p.metricName != KVCacheUsagePerc {
		return 1, nil
	}
	blockSize, err := p.metrics.GetMetricValueByPod(endpoint.KeyOf(pod), CacheBlockSize)
	if err != nil {
		return 0, err
	}
	blocks, err := p.metrics.GetMetricValueByPod(endpoint.KeyOf(pod), CacheNumGPUBlocks)
	if err != nil {
		return 0, err
	}
	if blockSize.Value <= 0 || blocks.Value <= 0 {
		return 0, fmt.Errorf("pod %s/%s reports %v-token blocks and %v GPU blocks", pod.Namespace, pod.Name, blockSize.Value, blocks.Value)
	}
	tokens := float64(ctx.InputTokens() + ctx.PredictedOutputTokens)
	return math.Ceil(tokens/blockSize.Value) / blocks.Value, nil
}

// PendingLoadProvider measures a pod's load as the share of its capacity
// taken by the requests in flight. By Little's law a pod serving requests of
// one shape at its profiled throughput λ (requests per second) with mean
// latency L holds λ·L requests at once, so each such request takes
// 1/(λ·L) of the pod; λ and L come from the pod's GPU profile at the
// request's (predicted output tokens, input tokens). A pod is full at 1.
type PendingLoadProvider struct {
	metrics  MetricCache
	profiles *Profiles
}

// NewPendingLoadProvider returns a provider reading the pods' pending load
// (RealtimeNormalizedPendings) from metrics and GPU profiles from profiles.
func NewPendingLoadProvider(metrics MetricCache, profiles *Profiles) *PendingLoadProvider {
	return &PendingLoadProvider{metrics: metrics, profiles: profiles}
}

// Cap returns 1: a pod's whole capacity.
func (p *PendingLoadProvider) Cap() float64 { return 1 }

// GetUtilization returns the pod's pending load: 0 for a pod with no
// request in flight, or whose MetricCache holds no value for it (fails
// with ErrMetricNotFound). It fails with a *PodNotFoundError for a pod the
// MetricCache does not hold, such as one deleted since the candidates were
// listed, as AIBrix's does: a pod that is gone is not an idle one.
func (p *PendingLoadProvider) GetUtilization(_ *types.RoutingContext, pod *v1.Pod) (float64, error) {
	v, err := p.metrics.GetMetricValueByPod(endpoint.KeyOf(pod), RealtimeNormalizedPendings)
	if errors.Is(err, ErrMetricNotFound) {
		return 0, nil
	}
	return v.Value, err
}

// GetConsumption returns 1/(λ·L) for the request on pod. It fails with an
// error wrapping ErrMissingProfile when the pod's deployment has no profile
// for ctx.Model, and with ErrSLOFailureRequest when the profiled throughput
// is zero.
func (p *PendingLoadProvider) GetConsumption(ctx *types.RoutingContext, pod *v1.Pod) (float64, error) {
	profile, err := p.profiles.GetModelProfileByPod(pod, ctx.Model)
	if err != nil {
		return 0, err
	}
	return pendingLoad(profile, ctx, pod)
}

// RequestLoad returns what GetConsumption does for the request on ep, the
// share of the pod's capacity the request takes, which the gateway records
// with the request's route (inflight.Route.PendingLoad): 0 and no error when
// the pod's deployment has no profile for rc.Model, 0 and the error when the
// profile cannot tell. It runs for every routed request, so the common case
// of no profile costs no error value.
func (p *PendingLoadProvider) RequestLoad(rc *types.RoutingContext, ep *endpoint.Endpoint) (float64, error) {
	if p.profiles.Len() == 0 || ep.Deployment == "" {
		return 0, nil
	}
	profile := p.profiles.Lookup(rc.Model, ep.Deployment)
	if profile == nil {
		return 0, nil
	}
	return pendingLoad(profile, rc, ep.Pod)
}

// pendingLoad is the share of a pod the request takes by profile.
func pendingLoad(profile *ModelGPUProfile, ctx *types.RoutingContext, pod *v1.Pod) (float64, error) {
	sig, err := profile.GetSignature(float64(ctx.PredictedOutputTokens), float64(ctx.InputTokens()))
	if err != nil {
		return 0, err
	}
	rps, err := profile.ThroughputRPS(sig...)
	if err != nil {
		return 0, err
	}
	latency, err := profile.LatencySeconds(sig...)
	if err != nil {
		return 0, err
	}
	if rps <= 0 {
		return 0, ErrSLOFailureRequest
	}
	if latency <= 0 {
		return 0, fmt.Errorf("GPU profile of pod %s/%s has latency %v at signature %v", pod.Namespace, pod.Name, latency, sig)
	}
	return 1 / (rps * latency), nil
}
