// Package discovery finds the inference pods a gateway routes to and whose
// KV events it follows, and hands them to the cache Store: its sources are
// cache.PodSource implementations for cache.InitWithOptions.
//
//   - KubernetesSource watches pods through a client-go shared informer,
//     scoped by namespace and label selector. It is the mode for gateways
//     running in the cluster.
//   - InferencePoolSource watches the Gateway API Inference Extension's
//     InferencePools and delivers their member pods, one per target port,
//     with the pool's defaults. It is the mode of a gateway that is a
//     pool's endpoint picker. It may also keep the priorities of the
//     pools' InferenceObjectives in an Objectives.
//   - StaticSource reads a YAML file of endpoints and turns each into a
//     synthesized, Running and Ready pod in namespace StaticNamespace,
//     labelled and annotated as a real pod would be, so that routing,
//     metric scraping and the KV event manager treat it like any other. It
//     is the mode for running without Kubernetes (the demo, a laptop, VMs).
//     The file is watched and reloaded; an invalid version is logged and
//     the last valid one kept.
//
// How KV events reach the gateway, dialling each pod or receiving engines
// that dial a bound socket, is the KV event manager's choice (see
// manager.ManagerConfig.Bind) and works with both sources.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// KubernetesSource discovers pods with a shared informer.
type KubernetesSource struct {
	// Namespace limits the watch to one namespace; "" watches all.
	Namespace string
	// LabelSelector selects the pods watched (Kubernetes syntax); ""
	// selects every pod.
	LabelSelector string
	// Resync is the informer's resync period; 0 disables resyncs (the
	// consumers reconcile on every change and need none).
	Resync time.Duration
	// Logger receives the source's logs (klog's global logger when zero).
	Logger klog.Logger
}

var _ cache.PodSource = (*KubernetesSource)(nil)

// Run watches pods until ctx is cancelled, delivering every add, update and
// delete to sink, and calls synced once the pods that existed at start have
// been delivered. It fails when config is nil, the selector is invalid, or
// ctx ends before the informer synced; otherwise it returns nil after ctx
// is cancelled and the informer has stopped.
func (s *KubernetesSource) Run(ctx context.Context, config *rest.Config, sink cache.PodSink, synced func()) error {
	if config == nil {
		return errors.New("kubernetes pod source needs a Kubernetes client configuration")
	}
	if _, err := labels.Parse(s.LabelSelector); err != nil {
		return fmt.Errorf("kubernetes pod source: label selector %q: %w", s.LabelSelector, err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("kubernetes pod source: %w", err)
	}
	log := s.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	log = log.WithName("pod-informer")
	factory := informers.NewSharedInformerFactoryWithOptions(client, s.Resync,
		informers.WithNamespace(s.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = s.LabelSelector }))
	informer := factory.Core().V1().Pods().Informer()
	// The registration, unlike the informer, has synced only once its
	// handler was given every pod of the initial list.
	reg, err := informer.AddEventHandler(podHandler(sink, log))
	if err != nil {
		return fmt.Errorf("kubernetes pod source: %w", err)
	}
	// The informers stop when informerCtx ends, which must happen before
	// factory.Shutdown waits for them.
	informerCtx, cancel := context.WithCancel(ctx)
	defer factory.Shutdown()
	defer cancel()
	factory.Start(informerCtx.Done())
	if !toolscache.WaitForCacheSync(informerCtx.Done(), reg.HasSynced) {
		return fmt.Errorf("kubernetes pod source: stopped before the pod informer synced: %w", context.Cause(ctx))
	}
	log.Info("Pod informer synced", "namespace", s.Namespace, "selector", s.LabelSelector, "pods", len(informer.GetStore().ListKeys()))
	synced()
	<-ctx.Done()
	return nil
}

// podHandler forwards the informer's notifications to sink.
func podHandler(sink cache.PodSink, log klog.Logger) toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if pod, ok := obj.(*v1.Pod); ok {
				sink.AddOrUpdatePod(pod)
			}
		},
		UpdateFunc: func(_, obj any) {
			if pod, ok := obj.(*v1.Pod); ok {
				sink.AddOrUpdatePod(pod)
			}
		},
		DeleteFunc: func(obj any) {
			if pod, ok := deletedPod(obj, log); ok {
				sink.DeletePod(endpoint.KeyOf(pod))
			}
		},
	}
}

// deletedPod returns the pod of an informer's deletion notification, whose
// last state may be unknown (a tombstone); an object that is not a pod is
// logged and ignored.
func deletedPod(obj any, log klog.Logger) (*v1.Pod, bool) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		log.Error(nil, "Ignoring the deletion of an object that is not a pod", "type", fmt.Sprintf("%T", obj))
	}
	return pod, ok
}
