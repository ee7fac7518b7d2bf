package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// InferencePoolResource is the resource of the Gateway API Inference
// Extension's InferencePools that InferencePoolSource watches.
var InferencePoolResource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// InferencePool is what kvgate reads of an InferencePool
// (inference.networking.k8s.io/v1): which pods are its members and on which
// ports they serve.
type InferencePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              InferencePoolSpec `json:"spec"`
}

// InferencePoolSpec is the part of an InferencePool's spec kvgate reads.
type InferencePoolSpec struct {
	// Selector's labels, all of them, make a pod of the pool's namespace a
	// member.
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	// TargetPorts are the ports the members serve on; each port of each
	// member is an endpoint.
	TargetPorts []struct {
		Number int32 `json:"number"`
	} `json:"targetPorts"`
}

// poolDefaults are the pod labels and annotations an InferencePool may
// carry as defaults for its pods: a pod's own value wins. The serving port
// is not among them: the pool's target ports set it.
var poolDefaults = []string{
	endpoint.ModelNameLabel, endpoint.KVEventsEnabledLabel, endpoint.LoraIDLabel, endpoint.MetricPortLabel,
	endpoint.PubPortAnnotation, endpoint.ReplayPortAnnotation, endpoint.TopicAnnotation, endpoint.DPSizeAnnotation,
	endpoint.LoraAdaptersAnnotation,
}

// InferencePoolSource discovers the pods of InferencePools: an informer on
// the pools and one on the pods of their namespace, both from client-go
// (the pools through the dynamic client, so that kvgate needs no generated
// client of the extension).
//
// A pod is a member of a pool of its namespace when it carries every label
// of the pool's selector. Each member is delivered once per target port, as
// a pod serving on that port (model.aibrix.ai/port): under the pod's own
// name for a pool with one target port, as <name>-rank-<i> for the i-th of
// several: data-parallel rank i (endpoint.DPStartRankAnnotation, added to
// the pod's own), whose KV events are taken on the pod's PUB and replay
// ports plus i as vLLM offsets the ports of its ranks, or in bind mode on
// the gateway's bound socket of rank i. The labels and
// annotations kvgate reads of a pod (model.aibrix.ai/name,
// model.aibrix.ai/kv-events-enabled, kvgate.io/...) may be set on the pool,
// as defaults for its members; a member's own value wins. A pod selected
// by several pools belongs to the first by name, and the conflict is
// logged.
//
// The pods delivered follow the pools and pods: a pod that stops matching,
// a pool deleted or whose selector or ports change, remove or replace the
// pods delivered for them.
//
// With Objectives set, the source also watches the InferenceObjectives
// (inference.networking.x-k8s.io/v1alpha2) of the namespaces it watches,
// and keeps in Objectives the priorities of those naming the pools it
// follows (see Objectives). A cluster without the InferenceObjective CRD,
// or a gateway not allowed to list InferenceObjectives, runs without them,
// logged once at start: every request then has priority 0. The source
// checks again every 30 seconds, and reads the objectives, logged once, as
// soon as they can be listed: a CRD installed or a permission granted
// later takes effect without a restart.
type InferencePoolSource struct {
	// Namespace limits the watch to one namespace; "" watches all.
	Namespace string
	// Pools names the pools followed; empty follows every pool.
	Pools []string
	// PubPort and ReplayPort are the KV event ports of rank 0 for pods that
	// declare none (KVGATE_KV_EVENTS_PUB_PORT and
	// KVGATE_KV_EVENTS_REPLAY_PORT); with several target ports, the
	// member of the i-th port is rank i and uses them plus i.
	PubPort, ReplayPort int
	// Resync is the informers' resync period; 0 disables resyncs.
	Resync time.Duration
	// Objectives, when set, receives the InferenceObjectives of the pools
	// followed.
	Objectives *Objectives
	// Logger receives the source's logs (klog's global logger when zero).
	Logger klog.Logger

	// objectiveResource replaces InferenceObjectiveResource when set.
	objectiveResource schema.GroupVersionResource
}

var _ cache.PodSource = (*InferencePoolSource)(nil)

// Run watches the pools and their pods until ctx is cancelled, delivering
// the pods of the pools to sink, and calls synced once the pools and pods
// that existed at start have been delivered. It fails when config is nil,
// the API server does not serve InferencePools (the CRD is not installed),
// or ctx ends before the informers synced; otherwise it returns nil after
// ctx is cancelled and the informers have stopped.
func (s *InferencePoolSource) Run(ctx context.Context, config *rest.Config, sink cache.PodSink, synced func()) error {
	if config == nil {
		return errors.New("inferencepool source needs a Kubernetes client configuration")
	}
	kube, dyn, err := clients(config)
	if err != nil {
		return fmt.Errorf("inferencepool source: %w", err)
	}
	if err := serves(kube, InferencePoolResource); err != nil {
		return err
	}
	log := s.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	log = log.WithName("inferencepool")
	t := &poolTracker{src: s, sink: sink, log: log, pools: map[types.NamespacedName]*InferencePool{},
		pods: map[types.NamespacedName]*v1.Pod{}, delivered: map[types.NamespacedName]deliveredPod{}}

	podFactory := informers.NewSharedInformerFactoryWithOptions(kube, s.Resync, informers.WithNamespace(s.Namespace))
	poolFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, s.Resync, s.Namespace, nil)
	podReg, err := podFactory.Core().V1().Pods().Informer().AddEventHandler(t.podHandler())
	if err != nil {
		return fmt.Errorf("inferencepool source: %w", err)
	}
	poolReg, err := poolFactory.ForResource(InferencePoolResource).Informer().AddEventHandler(t.poolHandler())
	if err != nil {
		return fmt.Errorf("inferencepool source: %w", err)
	}
	syncs := []toolscache.InformerSynced{podReg.HasSynced, poolReg.HasSynced}
	objRes := cmp.Or(s.objectiveResource, InferenceObjectiveResource)
	// readObjectives starts the objective informer, whose sync is then
	// waited for by syncs at start; later, it syncs on its own.
	readObjectives := func() (toolscache.InformerSynced, error) {
		reg, err := poolFactory.ForResource(objRes).Informer().AddEventHandler(t.objectiveHandler())
		if err != nil {
			return nil, fmt.Errorf("inferencepool source: %w", err)
		}
		return reg.HasSynced, nil
	}
	objectivesLater := false
	if s.Objectives != nil {
		if err := listable(ctx, dyn, objRes, s.Namespace); err != nil {
			log.Info("InferenceObjectives are not read yet: every request has priority 0 until the InferenceObjective CRD "+
				"(config/inference-extension) is installed and kvgate allowed to list and watch them; checked again every "+
				recheckInterval.String(), "resource", objRes.String(), "err", err.Error())
			objectivesLater = true
		} else {
			synced, err := readObjectives()
			if err != nil {
				return err
			}
			syncs = append(syncs, synced)
		}
	}
	informerCtx, cancel := context.WithCancel(ctx)
	var later sync.WaitGroup
	defer podFactory.Shutdown()
	defer poolFactory.Shutdown()
	// The factories shut down once the objectives' recheck has stopped:
	// it may start an informer of poolFactory.
	defer later.Wait()
	defer cancel()
	podFactory.Start(informerCtx.Done())
	poolFactory.Start(informerCtx.Done())
	if !toolscache.WaitForCacheSync(informerCtx.Done(), syncs...) {
		return fmt.Errorf("inferencepool source: stopped before the informers synced: %w", context.Cause(ctx))
	}
	if objectivesLater {
		later.Go(func() {
			if !awaitListable(informerCtx, dyn, objRes, s.Namespace) {
				return
			}
			if _, err := readObjectives(); err != nil {
				log.Error(err, "InferenceObjectives cannot be read")
				return
			}
			poolFactory.Start(informerCtx.Done())
			log.Info("InferenceObjectives are now read: requests take their priorities", "resource", objRes.String())
		})
	}
	pools, pods := t.counts()
	objectives := 0
	if s.Objectives != nil {
		objectives = s.Objectives.Len()
	}
	log.Info("InferencePool informers synced", "namespace", s.Namespace, "pools", pools, "members", pods,
		"objectives", objectives)
	synced()
	<-ctx.Done()
	return nil
}

// unstructuredOf returns the object of a dynamic informer's notification,
// the last known state of a deleted one whose final state is unknown (a
// tombstone) included; false for anything else.
func unstructuredOf(obj any) (*unstructured.Unstructured, bool) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	return u, ok
}

// clients returns the typed and the dynamic clients of config.
func clients(config *rest.Config) (kubernetes.Interface, dynamic.Interface, error) {
	kube, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(config)
	if err != nil {
		return nil, nil, err
	}
	return kube, dyn, nil
}

// recheckInterval is how often a source checks again whether a resource it
// could not list at start (its CRD not installed, or kvgate not allowed)
// can now be listed.
var recheckInterval = 30 * time.Second

// listable fails when the first object of r in namespace ns ("" for all)
// cannot be listed.
func listable(ctx context.Context, dyn dynamic.Interface, r schema.GroupVersionResource, ns string) error {
	_, err := dyn.Resource(r).Namespace(ns).List(ctx, metav1.ListOptions{Limit: 1})
	return err
}

// awaitListable checks every recheckInterval whether r can be listed in ns,
// and reports true once it can, false when ctx ends first.
func awaitListable(ctx context.Context, dyn dynamic.Interface, r schema.GroupVersionResource, ns string) bool {
	err := wait.PollUntilContextCancel(ctx, recheckInterval, false, func(ctx context.Context) (bool, error) {
		return listable(ctx, dyn, r, ns) == nil, nil
	})
	return err == nil
}

// serves fails, saying what to install, when the API server does not serve
// the InferencePool resource r.
func serves(kube kubernetes.Interface, r schema.GroupVersionResource) error {
	gv := r.GroupVersion().String()
	list, err := kube.Discovery().ServerResourcesForGroupVersion(gv)
	if err == nil {
		for _, res := range list.APIResources {
			if res.Name == r.Resource {
				return nil
			}
		}
	}
	msg := fmt.Sprintf("inferencepool source: the API server does not serve %s %s: install the InferencePool CRD "+
		"(config/inference-extension, or the Gateway API Inference Extension's)", gv, r.Resource)
	if err != nil {
		return fmt.Errorf("%s: %w", msg, err)
	}
	return errors.New(msg)
}

// deliveredPod is what the tracker delivered for one pod: the keys of the
// pods it delivered, and the versions of the pod and the pool they came
// from.
type deliveredPod struct {
	keys                []endpoint.Key
	podVersion, poolKey string
	poolVersion         string
}

// poolTracker keeps the pools and pods the informers report, and delivers
// to the sink the pods of the pools. Its handlers are called by both
// informers' goroutines; mu serializes them, and the deliveries with them.
type poolTracker struct {
	src  *InferencePoolSource
	sink cache.PodSink
	log  klog.Logger

	mu        sync.Mutex
	pools     map[types.NamespacedName]*InferencePool
	pods      map[types.NamespacedName]*v1.Pod
	delivered map[types.NamespacedName]deliveredPod
	// conflicts remembers the pods logged as selected by several pools,
	// with the pools, so that a conflict is logged once.
	conflicts map[types.NamespacedName]string
	// droppedLogged is set once a dropped InferenceObjective was logged.
	droppedLogged atomic.Bool
}

// setServed tells the source's Objectives, if any, whether it follows the
// pool of key.
func (t *poolTracker) setServed(key types.NamespacedName, served bool) {
	if o := t.src.Objectives; o != nil {
		o.setServed(key, served)
	}
}

// objectiveHandler keeps the objective informer's objects in the source's
// Objectives.
func (t *poolTracker) objectiveHandler() toolscache.ResourceEventHandlerFuncs {
	o := t.src.Objectives
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.setObjective(obj) },
		UpdateFunc: func(_, obj any) { t.setObjective(obj) },
		DeleteFunc: func(obj any) {
			if u, ok := unstructuredOf(obj); ok {
				o.remove(u.GetNamespace(), u.GetName())
			}
		},
	}
}

func (t *poolTracker) setObjective(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	if !t.src.Objectives.set(u) && t.droppedLogged.CompareAndSwap(false, true) {
		t.log.Error(nil, "Ignoring InferenceObjectives beyond the most kept: requests naming them have priority 0",
			"max", MaxInferenceObjectives, "objective", u.GetNamespace()+"/"+u.GetName())
	}
}

func (t *poolTracker) counts() (pools, members int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pools), len(t.delivered)
}

// podHandler forwards the pod informer's notifications.
func (t *poolTracker) podHandler() toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.setPod(obj) },
		UpdateFunc: func(_, obj any) { t.setPod(obj) },
		DeleteFunc: func(obj any) {
			pod, ok := deletedPod(obj, t.log)
			if !ok {
				return
			}
			t.mu.Lock()
			defer t.mu.Unlock()
			key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
			delete(t.pods, key)
			t.reconcileLocked(key)
		},
	}
}

func (t *poolTracker) setPod(obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	t.pods[key] = pod
	t.reconcileLocked(key)
}

// poolHandler forwards the pool informer's notifications.
func (t *poolTracker) poolHandler() toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.setPool(obj) },
		UpdateFunc: func(_, obj any) { t.setPool(obj) },
		DeleteFunc: func(obj any) {
			u, ok := unstructuredOf(obj)
			if !ok {
				t.log.Error(nil, "Ignoring the deletion of an object that is not an InferencePool", "type", fmt.Sprintf("%T", obj))
				return
			}
			t.mu.Lock()
			defer t.mu.Unlock()
			key := types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}
			delete(t.pools, key)
			t.setServed(key, false)
			t.reconcileNamespaceLocked(u.GetNamespace())
		},
	}
}

func (t *poolTracker) setPool(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	if len(t.src.Pools) > 0 && !slices.Contains(t.src.Pools, u.GetName()) {
		return
	}
	pool := &InferencePool{}
	key := types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, pool); err != nil {
		// The CRD's schema makes this unlikely; a pool that cannot be read
		// selects no pod until it can.
		t.log.Error(err, "Ignoring an InferencePool that cannot be read", "pool", key.String())
		delete(t.pools, key)
		t.setServed(key, false)
	} else {
		t.pools[key] = pool
		t.setServed(key, true)
	}
	t.reconcileNamespaceLocked(key.Namespace)
}

// reconcileNamespaceLocked reconciles every pod of namespace ns, and every
// pod delivered there.
func (t *poolTracker) reconcileNamespaceLocked(ns string) {
	keys := map[types.NamespacedName]bool{}
	for k := range t.pods {
		if k.Namespace == ns {
			keys[k] = true
		}
	}
	for k := range t.delivered {
		if k.Namespace == ns {
			keys[k] = true
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(keys), func(a, b types.NamespacedName) int {
		return cmpNames(a, b)
	}) {
		t.reconcileLocked(k)
	}
}

func cmpNames(a, b types.NamespacedName) int {
	if a.Namespace != b.Namespace {
		if a.Namespace < b.Namespace {
			return -1
		}
		return 1
	}
	switch {
	case a.Name < b.Name:
		return -1
	case a.Name > b.Name:
		return 1
	}
	return 0
}

// reconcileLocked delivers what the pod of key should be now: a pod per
// target port of the pool it belongs to, or nothing; pods delivered before
// and no longer wanted are deleted.
func (t *poolTracker) reconcileLocked(key types.NamespacedName) {
	prev, had := t.delivered[key]
	pod := t.pods[key]
	var pool *InferencePool
	if pod != nil {
		pool = t.poolOfLocked(pod)
	}
	if pool == nil {
		t.forgetLocked(key, prev.keys)
		return
	}
	poolKey := pool.Namespace + "/" + pool.Name
	if had && prev.podVersion == pod.ResourceVersion && prev.poolKey == poolKey && prev.poolVersion == pool.ResourceVersion {
		return // nothing changed
	}
	members := pool.Members(pod, t.src.PubPort, t.src.ReplayPort)
	cur := deliveredPod{podVersion: pod.ResourceVersion, poolKey: poolKey, poolVersion: pool.ResourceVersion}
	for _, m := range members {
		cur.keys = append(cur.keys, endpoint.KeyOf(m))
	}
	for _, k := range prev.keys {
		if !slices.Contains(cur.keys, k) {
			t.sink.DeletePod(k)
		}
	}
	for _, m := range members {
		t.sink.AddOrUpdatePod(m)
	}
	t.delivered[key] = cur
}

// forgetLocked deletes the pods delivered for the pod of key.
func (t *poolTracker) forgetLocked(key types.NamespacedName, keys []endpoint.Key) {
	for _, k := range keys {
		t.sink.DeletePod(k)
	}
	delete(t.delivered, key)
	delete(t.conflicts, key)
}

// poolOfLocked returns the pool pod belongs to, nil for none: the first by
// name of the pools of its namespace whose selector it matches.
func (t *poolTracker) poolOfLocked(pod *v1.Pod) *InferencePool {
	var matched []*InferencePool
	for _, p := range t.pools {
		if p.Selects(pod) {
			matched = append(matched, p)
		}
	}
	if len(matched) == 0 {
		return nil
	}
	slices.SortFunc(matched, func(a, b *InferencePool) int { return cmpNames(poolName(a), poolName(b)) })
	if len(matched) > 1 {
		key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
		names := ""
		for _, p := range matched {
			names += p.Name + " "
		}
		if t.conflicts == nil {
			t.conflicts = map[types.NamespacedName]string{}
		}
		if t.conflicts[key] != names {
			t.conflicts[key] = names
			t.log.Info("A pod is selected by several InferencePools: it belongs to the first", "pod", key.String(),
				"pools", names, "pool", matched[0].Name)
		}
	}
	return matched[0]
}

func poolName(p *InferencePool) types.NamespacedName {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
}

// Selects reports whether pod is a member of the pool: in its namespace,
// carrying every label of its selector; a pool without a target port has no
// members.
func (pool *InferencePool) Selects(pod *v1.Pod) bool {
	return pod.Namespace == pool.Namespace && len(pool.Spec.TargetPorts) > 0 &&
		labels.SelectorFromSet(pool.Spec.Selector.MatchLabels).Matches(labels.Set(pod.Labels))
}

// Members returns the pods InferencePoolSource delivers for pod, a member
// of the pool: one per target port, with the pool's defaults (see
// InferencePoolSource). pubPort and replayPort are rank 0's KV event ports
// when neither the pod nor the pool names them. The pods share pod's spec
// and status, which they do not modify.
func (pool *InferencePool) Members(pod *v1.Pod, pubPort, replayPort int) []*v1.Pod {
	ports := pool.Spec.TargetPorts
	out := make([]*v1.Pod, 0, len(ports))
	for i, tp := range ports {
		m := *pod
		m.Labels = maps.Clone(pod.Labels)
		if m.Labels == nil {
			m.Labels = map[string]string{}
		}
		m.Annotations = maps.Clone(pod.Annotations)
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		for _, key := range poolDefaults {
			if _, own := endpoint.Value(pod, key); own {
				continue
			}
			if v, ok := pool.Labels[key]; ok {
				m.Annotations[key] = v
			} else if v, ok := pool.Annotations[key]; ok {
				m.Annotations[key] = v
			}
		}
		m.Labels[endpoint.ModelPortLabel] = strconv.Itoa(int(tp.Number))
		delete(m.Annotations, endpoint.ModelPortLabel)
		if len(ports) > 1 {
			m.Name = pod.Name + "-rank-" + strconv.Itoa(i)
			setValue(&m, endpoint.DPStartRankAnnotation, strconv.Itoa(offsetValue(&m, endpoint.DPStartRankAnnotation, 0, i)))
			setValue(&m, endpoint.PubPortAnnotation, strconv.Itoa(offsetValue(&m, endpoint.PubPortAnnotation, pubPort, 0)))
			if base := offsetValue(&m, endpoint.ReplayPortAnnotation, replayPort, 0); base != 0 {
				setValue(&m, endpoint.ReplayPortAnnotation, strconv.Itoa(base))
			}
			// Each port is an engine of its own: its own /metrics.
			delete(m.Labels, endpoint.MetricPortLabel)
			delete(m.Annotations, endpoint.MetricPortLabel)
		}
		out = append(out, &m)
	}
	return out
}

// setValue sets key as an annotation of pod, removing a label of the same
// key, which would be read first (see endpoint.Value).
func setValue(pod *v1.Pod, key, value string) {
	delete(pod.Labels, key)
	pod.Annotations[key] = value
}

// offsetValue returns the integer the pod's key holds (def when it holds
// none) plus i.
func offsetValue(pod *v1.Pod, key string, def, i int) int {
	if v, ok := endpoint.Value(pod, key); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n + i
		}
	}
	return def + i
}
