package cache

import (
	"slices"
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// PodListener is told about every change of the Store's pod registry.
//
// Calls are made one at a time, in the order the changes happened, from the
// goroutine that made the change. A listener must return quickly (queue the
// work, as an informer handler does) and must not call the Store's
// registry-changing methods (AddOrUpdatePod, DeletePod, SetPodAdapters,
// AddPodListener); it may read the Store. Pods passed in are shared:
// treat them as read-only.
type PodListener interface {
	// OnPodAdd reports a pod that joined the registry.
	OnPodAdd(pod *v1.Pod)
	// OnPodUpdate reports a new version of a registered pod (same
	// namespace, name and UID).
	OnPodUpdate(oldPod, newPod *v1.Pod)
	// OnPodDelete reports a pod that left the registry. A pod replaced by
	// one of the same name but another UID is reported as a delete followed
	// by an add.
	OnPodDelete(pod *v1.Pod)
}

// ModelsListener is a PodListener that is also told when the models a
// registered pod serves change while the pod itself does not: its LoRA
// adapters, set with Store.SetPodAdapters or listed by its /v1/models,
// which PodListener's methods do not report. Calls follow PodListener's
// rules.
type ModelsListener interface {
	PodListener
	// OnPodModelsChange reports that pod serves other models than before
	// (see Store.ListModelsByPod).
	OnPodModelsChange(pod *v1.Pod)
}

// podEntry is one version of a registered pod. Entries are immutable: a
// change replaces the entry, carrying state over while the pod keeps its UID.
type podEntry struct {
	ep *endpoint.Endpoint
	// adapters were set with SetPodAdapters, discovered were listed by the
	// pod's /v1/models; both last while the pod keeps its UID.
	adapters   []string
	discovered []string
	// models is the base model (when the pod names one), then the adapters
	// the pod declares (endpoint.Adapters), set and discovered, without
	// duplicates.
	models []string
	state  *podState
}

// modelEntry indexes the pods serving one model.
type modelEntry struct {
	pods map[endpoint.Key]*podEntry
	// routable is rebuilt on every change of the model's pods and never
	// modified after, so readers may keep it.
	routable []*endpoint.Endpoint
}

// registry holds the pods known to the Store and the models they serve.
type registry struct {
	// notifyMu serializes changes and their delivery to listeners, so that
	// listeners see changes in order without holding mu, and may read.
	notifyMu  sync.Mutex
	listeners []PodListener

	mu         sync.RWMutex
	parse      endpoint.Options
	pods       map[endpoint.Key]*podEntry
	models     map[string]*modelEntry
	modelNames []string // sorted, rebuilt when the model set changes
}

func newRegistry(parse endpoint.Options) *registry {
	return &registry{parse: parse, pods: map[endpoint.Key]*podEntry{}, models: map[string]*modelEntry{}}
}

func newPodEntry(ep *endpoint.Endpoint, adapters, discovered []string, state *podState) *podEntry {
	e := &podEntry{ep: ep, adapters: adapters, discovered: discovered, state: state}
	if ep.Model != "" {
		e.models = append(e.models, ep.Model)
	}
	for _, list := range [][]string{ep.Adapters, adapters, discovered} {
		for _, a := range list {
			if a != "" && !slices.Contains(e.models, a) {
				e.models = append(e.models, a)
			}
		}
	}
	return e
}

// upsert parses and registers pod and returns the entry it replaced (nil
// when new) and the new entry. A pod of another UID than the registered one
// starts with fresh state and no adapters but those it declares.
func (r *registry) upsert(pod *v1.Pod) (old, cur *podEntry) {
	ep := endpoint.Parse(pod, r.parse)
	r.mu.Lock()
	defer r.mu.Unlock()
	old = r.pods[ep.Key]
	if old != nil && old.ep.UID == ep.UID {
		cur = newPodEntry(ep, old.adapters, old.discovered, old.state)
	} else {
		cur = newPodEntry(ep, nil, nil, newPodState(ep.ID))
	}
	r.replaceLocked(old, cur)
	return old, cur
}

// remove unregisters the pod and returns its entry, nil when unknown.
func (r *registry) remove(key endpoint.Key) *podEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.pods[key]
	if old != nil {
		r.replaceLocked(old, nil)
	}
	return old
}

// setAdapters replaces the pod's adapters and returns the entry it
// replaced and the new one; both are nil when the pod is unknown.
func (r *registry) setAdapters(key endpoint.Key, adapters []string) (old, cur *podEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old = r.pods[key]
	if old == nil {
		return nil, nil
	}
	cur = newPodEntry(old.ep, slices.Clone(adapters), old.discovered, old.state)
	r.replaceLocked(old, cur)
	return old, cur
}

// setDiscovered replaces the adapters discovered on the pod of key, when it
// is still the pod whose state is state and they changed, and returns the
// entry it replaced and the new one; both are nil when nothing changed.
func (r *registry) setDiscovered(key endpoint.Key, state *podState, adapters []string) (old, cur *podEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old = r.pods[key]
	if old == nil || old.state != state || slices.Equal(old.discovered, adapters) {
		return nil, nil
	}
	cur = newPodEntry(old.ep, old.adapters, adapters, old.state)
	r.replaceLocked(old, cur)
	return old, cur
}

// replaceLocked swaps old for cur (either may be nil) in the pod map and in
// the index of every model either serves.
func (r *registry) replaceLocked(old, cur *podEntry) {
	var affected []string
	if old != nil {
		delete(r.pods, old.ep.Key)
		affected = append(affected, old.models...)
	}
	if cur != nil {
		r.pods[cur.ep.Key] = cur
		affected = append(affected, cur.models...)
	}
	slices.Sort(affected)
	affected = slices.Compact(affected)
	modelSetChanged := false
	for _, name := range affected {
		m := r.models[name]
		if m == nil {
			m = &modelEntry{pods: map[endpoint.Key]*podEntry{}}
			r.models[name] = m
			modelSetChanged = true
		}
		if old != nil {
			delete(m.pods, old.ep.Key)
		}
		if cur != nil && slices.Contains(cur.models, name) {
			m.pods[cur.ep.Key] = cur
		}
		if len(m.pods) == 0 {
			delete(r.models, name)
			modelSetChanged = true
			continue
		}
		m.routable = routablePods(m.pods)
	}
	if modelSetChanged {
		r.modelNames = make([]string, 0, len(r.models))
		for name := range r.models {
			r.modelNames = append(r.modelNames, name)
		}
		sort.Strings(r.modelNames)
	}
}

// routablePods returns the ready endpoints of entries ordered by ID.
func routablePods(entries map[endpoint.Key]*podEntry) []*endpoint.Endpoint {
	var eps []*endpoint.Endpoint
	for _, e := range entries {
		if e.ep.Ready() {
			eps = append(eps, e.ep)
		}
	}
	sortEndpoints(eps)
	return eps
}

func sortEndpoints(eps []*endpoint.Endpoint) {
	sort.Slice(eps, func(i, j int) bool { return eps[i].ID < eps[j].ID })
}

func (r *registry) entry(key endpoint.Key) *podEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.pods[key]
}

func (r *registry) entries() []*podEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*podEntry, 0, len(r.pods))
	for _, e := range r.pods {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ep.ID < out[j].ep.ID })
	return out
}

// model returns the model's routable pods and whether any pod serves it.
func (r *registry) model(name string) ([]*endpoint.Endpoint, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	m := r.models[name]
	if m == nil {
		return nil, false
	}
	return m.routable, true
}

// routableStates returns the model's ready pods ordered by ID, and the
// state of each.
func (r *registry) routableStates(name string) ([]*podState, []*endpoint.Endpoint) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	m := r.models[name]
	if m == nil {
		return nil, nil
	}
	states := make([]*podState, len(m.routable))
	for i, ep := range m.routable {
		states[i] = m.pods[ep.Key].state
	}
	return states, m.routable
}

func (r *registry) modelList() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.modelNames
}
