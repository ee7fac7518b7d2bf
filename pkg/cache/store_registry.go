package cache

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// AddOrUpdatePod parses pod (endpoint.Parse, with the Store's default port
// and deployment label) and registers it, or replaces the registered pod of
// the same namespace and name, and tells the listeners. A pod with another
// UID than the registered one replaces it as a new pod: listeners see a
// delete and an add, and its metrics, load and adapters start afresh. The
// Store keeps pod: do not modify it afterwards.
func (s *Store) AddOrUpdatePod(pod *v1.Pod) {
	s.reg.notifyMu.Lock()
	defer s.reg.notifyMu.Unlock()
	old, cur := s.reg.upsert(pod)
	switch {
	case old == nil:
		s.eachListener(func(l PodListener) { l.OnPodAdd(cur.ep.Pod) })
	case old.state == cur.state:
		s.eachListener(func(l PodListener) { l.OnPodUpdate(old.ep.Pod, cur.ep.Pod) })
	default:
		s.eachListener(func(l PodListener) { l.OnPodDelete(old.ep.Pod) })
		s.eachListener(func(l PodListener) { l.OnPodAdd(cur.ep.Pod) })
	}
	s.podsChanged()
}

// DeletePod unregisters the pod of key and tells the listeners; an unknown
// pod is ignored.
func (s *Store) DeletePod(key endpoint.Key) {
	s.reg.notifyMu.Lock()
	defer s.reg.notifyMu.Unlock()
	if old := s.reg.remove(key); old != nil {
		s.eachListener(func(l PodListener) { l.OnPodDelete(old.ep.Pod) })
		s.podsChanged()
		s.metrics.podEjections.DeletePartialMatch(prometheus.Labels{"pod": old.ep.ID})
	}
}

// SetPodAdapters sets LoRA adapters the registered pod of key serves
// besides its base model, replacing the set given by the previous call.
// The pod serves these adapters in addition to those it declares
// (endpoint.LoraAdaptersAnnotation) and those its /v1/models lists. They
// last until changed or until the pod is replaced by one with another UID.
// When the models the pod serves change, the listeners that are
// ModelsListeners are told; the others are not. It fails with a
// *PodNotFoundError for an unknown pod.
func (s *Store) SetPodAdapters(key endpoint.Key, adapters []string) error {
	s.reg.notifyMu.Lock()
	defer s.reg.notifyMu.Unlock()
	old, cur := s.reg.setAdapters(key, adapters)
	if old == nil {
		return &PodNotFoundError{Key: key}
	}
	s.modelsChanged(old, cur)
	return nil
}

// setDiscoveredAdapters records the adapters listed by the /v1/models of the
// pod of key whose state is state, and returns the previous ones and whether
// they changed; a pod replaced or deleted meanwhile is left alone. When the
// models the pod serves change, the ModelsListeners are told.
func (s *Store) setDiscoveredAdapters(key endpoint.Key, state *podState, adapters []string) ([]string, bool) {
	s.reg.notifyMu.Lock()
	defer s.reg.notifyMu.Unlock()
	old, cur := s.reg.setDiscovered(key, state, adapters)
	if old == nil {
		return nil, false
	}
	s.modelsChanged(old, cur)
	return old.discovered, true
}

// modelsChanged tells the ModelsListeners about the pod of cur, which
// replaced old, when it serves other models; the caller holds notifyMu.
func (s *Store) modelsChanged(old, cur *podEntry) {
	if slices.Equal(old.models, cur.models) {
		return
	}
	s.eachListener(func(l PodListener) {
		if ml, ok := l.(ModelsListener); ok {
			ml.OnPodModelsChange(cur.ep.Pod)
		}
	})
}

// AddPodListener subscribes l to pod changes (see PodListener). l is first
// told about every registered pod with OnPodAdd, so that it misses none.
func (s *Store) AddPodListener(l PodListener) {
	s.reg.notifyMu.Lock()
	defer s.reg.notifyMu.Unlock()
	for _, e := range s.reg.entries() {
		l.OnPodAdd(e.ep.Pod)
	}
	s.reg.listeners = append(s.reg.listeners, l)
}

// eachListener calls f for every listener; the caller holds notifyMu.
func (s *Store) eachListener(f func(PodListener)) {
	for _, l := range s.reg.listeners {
		f(l)
	}
}

// podsChanged lets the scrape pool catch up with the registry.
func (s *Store) podsChanged() {
	if s.scraper != nil {
		s.scraper.notify()
	}
}

// GetPod returns the registered pod of key, ready or not, or a
// *PodNotFoundError.
func (s *Store) GetPod(key endpoint.Key) (*endpoint.Endpoint, error) {
	e := s.reg.entry(key)
	if e == nil {
		return nil, &PodNotFoundError{Key: key}
	}
	return e.ep, nil
}

// ListPods returns every registered pod, routable or not, ordered by
// namespace and name. It is meant for debugging: routing should use
// ListPodsByModel.
func (s *Store) ListPods() []*endpoint.Endpoint {
	entries := s.reg.entries()
	eps := make([]*endpoint.Endpoint, len(entries))
	for i, e := range entries {
		eps[i] = e.ep
	}
	return eps
}

// ListPodsByModel returns the ready pods (endpoint.Readiness) serving
// modelName as base model or adapter, ordered by namespace and name; the
// list is empty when all of them are unready. It fails with a
// *ModelNotFoundError when no registered pod serves the model. The slice is
// shared and never modified by the Store: treat it as read-only.
func (s *Store) ListPodsByModel(modelName string) ([]*endpoint.Endpoint, error) {
	eps, ok := s.reg.model(modelName)
	if !ok {
		return nil, &ModelNotFoundError{Model: modelName}
	}
	return eps, nil
}

// ListModels returns the models served by registered pods, sorted.
func (s *Store) ListModels() []string {
	return slices.Clone(s.reg.modelList())
}

// ListModelsByPod returns the models the pod of key serves: its base model
// first, then its adapters. It fails with a *PodNotFoundError for an
// unknown pod.
func (s *Store) ListModelsByPod(key endpoint.Key) ([]string, error) {
	e := s.reg.entry(key)
	if e == nil {
		return nil, &PodNotFoundError{Key: key}
	}
	return slices.Clone(e.models), nil
}

// HasModel reports whether a registered pod, ready or not, serves modelName.
func (s *Store) HasModel(modelName string) bool {
	_, ok := s.reg.model(modelName)
	return ok
}
