package cache

import (
	"context"
	"errors"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// MetricCache reads pod metrics; *Store implements it. The load providers
// read the metrics through it.
type MetricCache interface {
	GetMetricValueByPod(key endpoint.Key, metricName string) (MetricValue, error)
	GetMetricValueByPodModel(key endpoint.Key, modelName, metricName string) (MetricValue, error)
	AddSubscriber(subscriber MetricSubscriber)
}

// PodSink receives the pods a PodSource discovers. *Store implements it.
type PodSink interface {
	// AddOrUpdatePod registers pod or replaces its registered version.
	AddOrUpdatePod(pod *v1.Pod)
	// DeletePod unregisters the pod of key; unknown pods are ignored.
	DeletePod(key endpoint.Key)
	// SetPodAdapters sets the LoRA adapters a registered pod serves.
	SetPodAdapters(key endpoint.Key, adapters []string) error
}

// PodSource discovers inference pods: Kubernetes informers, a static
// endpoints file, a receiver that engines register with.
type PodSource interface {
	// Run delivers pods to sink until ctx is cancelled and returns once all
	// of its goroutines have stopped. It calls synced once, after
	// delivering the pods that existed when it started; an error returned
	// before that means the source could not start. config is the
	// Kubernetes client configuration, nil outside a cluster.
	Run(ctx context.Context, config *rest.Config, sink PodSink, synced func()) error
}

// RunPodSource runs source in a goroutine, delivering pods to sink until
// ctx ends, and returns once the source has delivered the pods that exist.
// The returned channel receives the result of the source's Run when it
// returns. RunPodSource fails, with the source stopped, when the source
// fails before syncing or ctx ends first.
func RunPodSource(ctx context.Context, source PodSource, config *rest.Config, sink PodSink) (<-chan error, error) {
	synced := make(chan struct{})
	var once sync.Once
	markSynced := func() { once.Do(func() { close(synced) }) }
	done := make(chan error, 1)
	go func() { done <- source.Run(ctx, config, sink, markSynced) }()
	select {
	case <-synced:
		return done, nil
	case err := <-done:
		select {
		case <-synced: // synced, then stopped: the pods were delivered
			done <- err
			return done, nil
		default:
		}
		if err == nil || ctx.Err() != nil {
			err = errors.New("stopped before syncing")
		}
		return nil, fmt.Errorf("pod source: %w", err)
	}
}
