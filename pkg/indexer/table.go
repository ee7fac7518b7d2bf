package indexer

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stream names one engine publisher: a pod's engine for one data-parallel
// rank, serving one base model. Its identity is (Pod, Rank).
type Stream struct {
	// Pod is the pod key, "namespace/name".
	Pod string
	// Rank is the data-parallel rank of the engine, 0 when the pod does not
	// run data parallelism.
	Rank int
	// Model is the base model the engine serves, as the router names it.
	Model string
}

type streamID struct {
	pod  string
	rank int
}

// SyncPrefixHashTable is the index of which pods hold the KV cache of which
// prompt prefixes, fed by engine KV events and queried by routers. All its
// methods are safe for concurrent use; see the package documentation for the
// semantics, bounds and concurrency model.
type SyncPrefixHashTable struct {
	cfg     Config
	keyer   keyer
	epoch   time.Time
	now     func() time.Time
	metrics *metrics

	// mu guards the registry: the models map's writers, pods and the streams
	// of each model. It is held briefly, and before a model's mutex when
	// both are needed, never after.
	mu     sync.Mutex
	models atomic.Pointer[map[string]*modelTable]
	pods   map[string]*podState
	// total counts the keys of all models.
	total atomic.Int64
	// sweepRatio is the key tables' choice between two ways of finding a
	// lane's keys when it goes (see keyTable.release); tests force either.
	sweepRatio int
}

// podState is what the index knows of a pod across models and ranks.
type podState struct {
	name    string
	streams map[int]*stream // by rank; guarded by SyncPrefixHashTable.mu
	// created and lastMatch are unix nanoseconds: when the pod was first
	// seen, and when a match last credited it with a block.
	created   int64
	lastMatch atomic.Int64
}

// matched records that a match credited the pod at nowNanos. The stored time
// moves at most once a second, so that hot matches do not keep writing it.
func (ps *podState) matched(nowNanos int64) {
	if nowNanos-ps.lastMatch.Load() >= int64(time.Second) {
		ps.lastMatch.Store(nowNanos)
	}
}

// stream is the state of one publisher.
type stream struct {
	id    streamID
	pod   *podState
	model *modelTable
	// lanes and gone are guarded by model.mu. gone is set when the stream
	// is reset or purged: a batch that looked the stream up before then
	// looks it up again. view is a copy of lanes for readers that take no
	// lock, replaced whenever lanes changes.
	lanes []*lane
	gone  bool
	view  atomic.Pointer[[]*lane]
	// lastEvent is the unix nanoseconds of the last applied batch.
	lastEvent atomic.Int64
}

// NewSyncPrefixHashTable returns an empty index sized by cfg, with its
// metrics registered on reg (nil registers nothing). It fails when cfg has a
// negative field or the metrics cannot be registered. Run performs the
// background sweep.
func NewSyncPrefixHashTable(cfg Config, reg prometheus.Registerer) (*SyncPrefixHashTable, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &SyncPrefixHashTable{
		cfg:        cfg,
		keyer:      newKeyer(rand.Uint64()),
		sweepRatio: defaultSweepRatio,
		now:        time.Now,
		pods:       make(map[string]*podState),
		epoch:      time.Now(),
	}
	t.models.Store(&map[string]*modelTable{})
	t.metrics = newMetrics(t)
	if reg != nil {
		if err := t.metrics.register(reg); err != nil {
			return nil, fmt.Errorf("register indexer metrics: %w", err)
		}
	}
	return t, nil
}

// tick is the coarse clock of keys and models: whole seconds since the table
// was created, starting at 1.
func (t *SyncPrefixHashTable) tick(now time.Time) uint32 {
	return uint32(now.Sub(t.epoch)/time.Second) + 1
}

// model returns the table of a model, or nil. It takes no lock.
func (t *SyncPrefixHashTable) model(name string) *modelTable {
	return (*t.models.Load())[name]
}

// streamFor returns the live state of s, creating it, its pod and its model
// table as needed. A stream that now serves another model, or whose model
// was dropped, is replaced; the replaced state is returned as stale, for
// the caller to release once it no longer holds t.mu.
func (t *SyncPrefixHashTable) streamFor(s Stream) (st, stale *stream) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := t.pods[s.Pod]
	if ps == nil {
		ps = &podState{name: s.Pod, streams: make(map[int]*stream), created: t.now().UnixNano()}
		t.pods[s.Pod] = ps
	}
	if old := ps.streams[s.Rank]; old != nil {
		if old.model.name == s.Model && !old.model.isDropped() {
			return old, nil
		}
		t.detachLocked(old)
		stale = old
	}
	m := t.modelForLocked(s.Model)
	st = &stream{id: streamID{s.Pod, s.Rank}, pod: ps, model: m}
	st.lastEvent.Store(t.now().UnixNano())
	ps.streams[s.Rank] = st
	t.pods[s.Pod] = ps
	m.streams[st] = struct{}{}
	return st, stale
}

// detachLocked removes st from the registry; t.mu is held.
func (t *SyncPrefixHashTable) detachLocked(st *stream) {
	if ps := st.pod; ps.streams[st.id.rank] == st {
		delete(ps.streams, st.id.rank)
		if len(ps.streams) == 0 && t.pods[ps.name] == ps {
			delete(t.pods, ps.name)
		}
	}
	delete(st.model.streams, st)
}

// modelForLocked returns the table of a model, creating it and dropping the
// least recently used model when MaxContexts would be exceeded; t.mu is held.
func (t *SyncPrefixHashTable) modelForLocked(name string) *modelTable {
	old := *t.models.Load()
	if m := old[name]; m != nil {
		return m
	}
	models := make(map[string]*modelTable, len(old)+1)
	var lru *modelTable
	for k, m := range old {
		models[k] = m
		if lru == nil || m.lastUse.Load() < lru.lastUse.Load() {
			lru = m
		}
	}
	if lru != nil && len(old) >= t.cfg.MaxContexts {
		delete(models, lru.name)
		t.dropModelLocked(lru)
	}
	m := newModelTable(t, name)
	models[name] = m
	t.models.Store(&models)
	return m
}

// dropModelLocked evicts a whole model: its streams are detached at once and
// its table is discarded under its writer lock, without waiting for the
// writer that may hold it (see modelTable.later). t.mu is held; the caller
// removes the model from the models map.
func (t *SyncPrefixHashTable) dropModelLocked(m *modelTable) {
	m.dropped.Store(true)
	var streams []*stream
	for st := range m.streams {
		streams = append(streams, st)
		t.detachLocked(st)
	}
	m.later(func() {
		blocks := m.discard(streams)
		t.metrics.evicted(reasonContext, blocks)
		t.cfg.Logger.Info("Dropped the least recently used model from the KV-cache index",
			"model", m.name, "blocks", blocks, "maxContexts", t.cfg.MaxContexts)
	})
}

// ResetStream forgets everything the index holds for one publisher: call it
// when the publisher restarted or its stream has a gap that replay could not
// fill. The next batch for the stream starts from an empty state.
func (t *SyncPrefixHashTable) ResetStream(s Stream) {
	t.mu.Lock()
	ps := t.pods[s.Pod]
	var st *stream
	if ps != nil {
		st = ps.streams[s.Rank]
	}
	if st != nil {
		t.detachLocked(st)
	}
	t.mu.Unlock()
	if st != nil {
		n := st.model.releaseStream(st)
		t.cfg.Logger.V(2).Info("Reset a stream in the KV-cache index", "pod", s.Pod, "rank", s.Rank,
			"model", st.model.name, "blocks", n)
	}
}

// PurgePod forgets everything the index holds for a pod, all ranks and
// models: call it when the pod is deleted or its address changed, after its
// clients have stopped. It takes time proportional to the pod's blocks,
// waits for the writers of the pod's models, and never blocks matches.
func (t *SyncPrefixHashTable) PurgePod(pod string) {
	streams := t.detachPod(pod, nil)
	if len(streams) == 0 {
		return
	}
	n := 0
	for _, st := range streams {
		n += st.model.releaseStream(st)
	}
	t.cfg.Logger.V(2).Info("Purged a pod from the KV-cache index", "pod", pod, "streams", len(streams),
		"blocks", n, "reason", "requested")
}

// detachPod removes a pod's streams from the registry, if approve is nil or
// approves the pod under the registry lock, and returns them.
func (t *SyncPrefixHashTable) detachPod(pod string, approve func(*podState) bool) []*stream {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := t.pods[pod]
	if ps == nil || (approve != nil && !approve(ps)) {
		return nil
	}
	streams := make([]*stream, 0, len(ps.streams))
	for _, st := range ps.streams {
		streams = append(streams, st)
	}
	for _, st := range streams {
		t.detachLocked(st)
	}
	return streams
}
