package cache

import (
	"hash/maphash"
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// podLoad counts the tracked requests in flight on one pod.
type podLoad struct {
	mu      sync.Mutex
	running int64
	pending float64
	models  map[string]int64
}

func (l *podLoad) add(model string, pending float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running++
	l.pending += pending
	if l.models == nil {
		l.models = map[string]int64{}
	}
	l.models[model]++
}

func (l *podLoad) done(model string, pending float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running--
	l.pending -= pending
	if l.running == 0 {
		l.pending = 0 // drop float rounding left by the add/subtract pairs
	}
	if l.models[model]--; l.models[model] <= 0 {
		delete(l.models, model)
	}
}

// snapshot returns the pod's running requests, its pending load and the
// running requests of model ("" for none).
func (l *podLoad) snapshot(model string) (running int64, pending float64, modelRunning int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running, l.pending, l.models[model]
}

// perModel returns a copy of the running requests per model.
func (l *podLoad) perModel() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int64, len(l.models))
	for m, n := range l.models {
		out[m] = n
	}
	return out
}

// inflight is one tracked request.
type inflight struct {
	term    int64
	model   string
	added   time.Time
	pod     *podState // nil until routed
	pending float64   // load added to pod
}

// modelLoad counts a model's tracked requests: all of them, and those routed.
type modelLoad struct {
	pending, routed int64
}

const trackerShards = 32

// requestTracker holds the requests between AddRequestCount and their
// completion, sharded by request id so that concurrent requests rarely share
// a lock.
type requestTracker struct {
	seed     maphash.Seed
	nextTerm atomic.Int64
	size     atomic.Int64
	shards   [trackerShards]trackerShard

	modelsMu sync.Mutex
	models   map[string]modelLoad
}

type trackerShard struct {
	mu sync.Mutex
	m  map[string]*inflight
}

func newRequestTracker() *requestTracker {
	t := &requestTracker{seed: maphash.MakeSeed(), models: map[string]modelLoad{}}
	for i := range t.shards {
		t.shards[i].m = map[string]*inflight{}
	}
	return t
}

func (t *requestTracker) shard(id string) *trackerShard {
	return &t.shards[maphash.String(t.seed, id)%trackerShards]
}

// route is how a request lands on a pod: the pod's state and the load the
// request adds to it.
type route struct {
	pod     *podState
	pending float64
}

// add tracks request id for model, or finds it when already tracked, and
// moves it to r.pod when r.pod is set and differs from where it is. It
// reports the request's term and whether it was new.
//
// Every change of one request's counts happens under its shard's lock, so a
// model's counters never see a request leave before it arrived, and a
// model's routed count never exceeds its pending count.
func (t *requestTracker) add(id, model string, now time.Time, r route) (term int64, isNew bool) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[id]
	if e == nil {
		e = &inflight{term: t.nextTerm.Add(1), model: model, added: now}
		s.m[id] = e
		t.size.Add(1)
		t.adjustModel(e.model, 1, 0)
		isNew = true
	}
	if r.pod != nil && r.pod != e.pod {
		if e.pod != nil {
			e.pod.load.done(e.model, e.pending)
		} else {
			t.adjustModel(e.model, 0, 1)
		}
		e.pod, e.pending = r.pod, r.pending
		e.pod.load.add(e.model, e.pending)
	}
	return e.term, isNew
}

// Outcomes of requestTracker.done.
const (
	doneOK = iota
	doneUnknown
	doneStaleTerm
)

// done stops tracking request id when term is its current term, and reports
// which model it was tracked under.
func (t *requestTracker) done(id string, term int64) (model string, outcome int) {
	s := t.shard(id)
	s.mu.Lock()
	e := s.m[id]
	defer s.mu.Unlock()
	switch {
	case e == nil:
		return "", doneUnknown
	case e.term != term:
		return "", doneStaleTerm
	}
	delete(s.m, id)
	t.release(e)
	return e.model, doneOK
}

// expire stops tracking the requests added before cutoff and returns how
// many it dropped.
func (t *requestTracker) expire(cutoff time.Time) int {
	expired := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for id, e := range s.m {
			if e.added.Before(cutoff) {
				delete(s.m, id)
				t.release(e)
				expired++
			}
		}
		s.mu.Unlock()
	}
	return expired
}

// release undoes the counts of e; the caller holds e's shard lock.
func (t *requestTracker) release(e *inflight) {
	t.size.Add(-1)
	if e.pod != nil {
		e.pod.load.done(e.model, e.pending)
	}
	t.adjustModel(e.model, -1, -boolInt(e.pod != nil))
}

func (t *requestTracker) adjustModel(model string, pending, routed int64) {
	t.modelsMu.Lock()
	defer t.modelsMu.Unlock()
	m := t.models[model]
	m.pending += pending
	m.routed += routed
	if m.pending <= 0 {
		delete(t.models, model)
		return
	}
	t.models[model] = m
}

// model returns the counts of model.
func (t *requestTracker) model(model string) modelLoad {
	t.modelsMu.Lock()
	defer t.modelsMu.Unlock()
	return t.models[model]
}

// modelsWithPending returns the counts of every model with tracked requests.
func (t *requestTracker) modelsWithPending() map[string]modelLoad {
	t.modelsMu.Lock()
	defer t.modelsMu.Unlock()
	return maps.Clone(t.models)
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
