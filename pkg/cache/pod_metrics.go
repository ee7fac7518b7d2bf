package cache

import (
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
)

// podMetrics is what one scrape of a pod produced. It is immutable once
// published; a failed scrape publishes a copy marked stale, or, before any
// scrape succeeded, an empty one marked stale.
type podMetrics struct {
	pod    map[string]MetricValue
	models map[string]map[string]MetricValue // by model_name label, of the models the pod serves
	// builtin holds the values of pod that routing reads, and when the
	// scrape began (builtin.At).
	builtin PodMetrics
	stale   bool
	// split is set when the page broke series down by more than one
	// model_name: the pod's values then do not stand for each model.
	split bool
}

// markStale republishes the pod's latest metrics marked stale.
func (st *podState) markStale() {
	for {
		cur := st.metrics.Load()
		if cur != nil && cur.stale {
			return
		}
		stale := &podMetrics{stale: true}
		if cur != nil {
			*stale = *cur
			stale.stale = true
		}
		if st.metrics.CompareAndSwap(cur, stale) {
			return
		}
	}
}

// ScrapeState says how current a pod's scraped metrics are.
type ScrapeState string

// States of a pod's scraped metrics.
const (
	// ScrapeFresh: the pod's latest scrape succeeded.
	ScrapeFresh ScrapeState = "fresh"
	// ScrapeStale: the pod's latest scrape failed, or the pod is no longer
	// scraped (not routable); its metrics, if any were ever measured, are
	// the last values measured.
	ScrapeStale ScrapeState = "stale"
	// ScrapeNone: no scrape of the pod has ended yet, or scraping is off.
	ScrapeNone ScrapeState = "none"
)

// PodScrapeState returns how current the scraped metrics of the pod of key
// are; ScrapeNone for a pod that is not registered.
func (s *Store) PodScrapeState(key endpoint.Key) ScrapeState {
	e := s.reg.entry(key)
	if e == nil {
		return ScrapeNone
	}
	switch m := e.state.metrics.Load(); {
	case m == nil:
		return ScrapeNone
	case m.stale:
		return ScrapeStale
	}
	return ScrapeFresh
}

// PodLastScraped returns when the latest successful scrape of the pod of
// key began: it stays put while scrapes fail. It is the zero time before
// the pod's first successful scrape, when scraping is off, and for a pod
// that is not registered. A pod replaced by one of another UID starts
// afresh.
func (s *Store) PodLastScraped(key endpoint.Key) time.Time {
	e := s.reg.entry(key)
	if e == nil {
		return time.Time{}
	}
	if m := e.state.metrics.Load(); m != nil {
		return m.builtin.At
	}
	return time.Time{}
}

// GetMetricValueByPod returns metricName (one of the names of this package,
// or a subscribed family) for the pod of key. It fails with a
// *PodNotFoundError for an unknown pod and a *MetricNotFoundError when no
// value has been measured. Realtime metrics exist for every registered pod.
func (s *Store) GetMetricValueByPod(key endpoint.Key, metricName string) (MetricValue, error) {
	e := s.reg.entry(key)
	if e == nil {
		return MetricValue{}, &PodNotFoundError{Key: key}
	}
	switch metricName {
	case RealtimeNumRequestsRunning:
		return s.realtime(float64(e.state.load.Running())), nil
	case RealtimeNormalizedPendings:
		return s.realtime(e.state.load.PendingLoad()), nil
	}
	if m := e.state.metrics.Load(); m != nil {
		if v, ok := m.pod[metricName]; ok {
			v.Stale = m.stale
			return v, nil
		}
	}
	return MetricValue{}, &MetricNotFoundError{Pod: e.ep.ID, Metric: metricName}
}

// GetMetricValueByPodModel returns metricName for modelName on the pod of
// key:
// scraped metrics from the series whose model_name label is modelName, and
// the realtime request count of the requests for modelName. When the pod's
// /metrics does not break metrics down by several models (one engine
// serving a base model and its adapters), the pod's values stand for every
// model it serves. It fails with a *PodNotFoundError for an unknown pod and a
// *MetricNotFoundError when the pod does not serve the model or no value has
// been measured.
func (s *Store) GetMetricValueByPodModel(key endpoint.Key, modelName, metricName string) (MetricValue, error) {
	e := s.reg.entry(key)
	if e == nil {
		return MetricValue{}, &PodNotFoundError{Key: key}
	}
	notFound := &MetricNotFoundError{Pod: e.ep.ID, Model: modelName, Metric: metricName}
	if !slices.Contains(e.models, modelName) {
		return MetricValue{}, notFound
	}
	switch metricName {
	case RealtimeNumRequestsRunning:
		return s.realtime(float64(e.state.load.RunningModel(modelName))), nil
	case RealtimeNormalizedPendings:
		return MetricValue{}, notFound
	}
	m := e.state.metrics.Load()
	if m == nil {
		return MetricValue{}, notFound
	}
	v, ok := m.models[modelName][metricName]
	if !ok && !m.split {
		v, ok = m.pod[metricName]
	}
	if !ok {
		return MetricValue{}, notFound
	}
	v.Stale = m.stale
	return v, nil
}

func (s *Store) realtime(v float64) MetricValue {
	return MetricValue{Value: v, UpdatedAt: time.Now()}
}

// PodLoad returns the load record of the registered pod of key (see
// inflight.PodLoad), nil for a pod that is not registered. A pod replaced
// by one of another UID has a record of its own.
func (s *Store) PodLoad(key endpoint.Key) *inflight.PodLoad {
	if e := s.reg.entry(key); e != nil {
		return e.state.load
	}
	return nil
}

// PodLoads returns the load records of every registered pod, ordered by
// namespace and name.
func (s *Store) PodLoads() []*inflight.PodLoad {
	entries := s.reg.entries()
	out := make([]*inflight.PodLoad, len(entries))
	for i, e := range entries {
		out[i] = e.state.load
	}
	return out
}

// PodModels returns the models the registered pod named id serves (its
// "namespace/name", the ID of its load record), as ListModelsByPod does;
// nil when no pod of that name is registered. The slice is shared: treat
// it as read-only.
func (s *Store) PodModels(id string) []string {
	ns, name, ok := strings.Cut(id, "/")
	if !ok {
		return nil
	}
	if e := s.reg.entry(endpoint.Key{Namespace: ns, Name: name}); e != nil {
		return e.models
	}
	return nil
}

// AddSubscriber makes the Store keep the metrics subscriber names from the
// next scrape of each pod on (see MetricSubscriber).
func (s *Store) AddSubscriber(subscriber MetricSubscriber) {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	cur := s.selection.Load().subscribed
	next := make(map[string]struct{}, len(cur))
	for name := range cur {
		next[name] = struct{}{}
	}
	for _, name := range subscriber.SubscribedMetrics() {
		if !isBuiltinMetric(name) {
			next[name] = struct{}{}
		}
	}
	s.selection.Store(newMetricSelection(next))
}
