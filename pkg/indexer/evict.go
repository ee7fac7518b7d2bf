package indexer

import (
	"context"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"k8s.io/klog/v2"
)

const (
	// evictBatchDiv sets the size of an eviction batch: a model at capacity
	// frees 1/evictBatchDiv of its keys at once, so that the scan of its
	// lanes is paid once per many stores.
	evictBatchDiv = 32
	// evictSample is the number of key clocks sampled to pick the clock
	// under which a batch's victims are taken.
	evictSample = 256
)

// makeRoom evicts keys so that one more key fits both bounds; m.mu is held.
func (m *modelTable) makeRoom() {
	cfg := &m.t.cfg
	if m.keys.n >= cfg.MaxPrefixesPerContext {
		m.evictLRU(m.keys.n-cfg.MaxPrefixesPerContext+1, reasonCapacity)
		return
	}
	if m.t.total.Load() >= int64(cfg.MaxPrefixes) {
		m.t.evictForTotal(m)
	}
}

// evictLRU evicts at least need keys of the model, and up to a batch, least
// recently stored or matched first, for every holder, lane maps included,
// and returns how many it evicted; m.mu is held.
func (m *modelTable) evictLRU(need int, reason string) int {
	target := min(m.keys.n, max(need, m.keys.n/evictBatchDiv))
	if target <= 0 {
		return 0
	}
	victims := m.keys.oldest(target, &m.evictFrom)
	set := newKeySet(len(victims))
	lanes := make([]uint64, m.keys.width)
	for _, k := range victims {
		r, _ := m.keys.find(k)
		for w := range lanes {
			lanes[w] |= *r.a.word(w, r.i)
		}
		m.keys.evict(r)
		set.add(k)
	}
	removed := 0
	for id, ln := range m.lanes {
		if ln != nil && lanes[id>>6]&(1<<(id&63)) != 0 {
			removed += ln.m.removeKeys(&set)
		}
	}
	m.t.metrics.evicted(reason, removed)
	klog.V(3).InfoS("Evicted the least recently used blocks of a model from the KV-cache index",
		"model", m.name, "reason", reason, "keys", len(victims), "residencies", removed)
	return len(victims)
}

// clockQuantile estimates, from a sample, the clock at or under which about
// want keys of the table lie.
func (t *keyTable) clockQuantile(want int) uint32 {
	clocks := make([]uint32, 0, evictSample)
	for tries := 0; tries < 4*evictSample && len(clocks) < evictSample; tries++ {
		a := t.shards[rand.IntN(numShards)].arr.Load()
		i := rand.IntN(a.cap())
		if k := a.slots[i].key; k != emptyKey && k != deadKey && t.held(a, i) {
			clocks = append(clocks, a.clock(i))
		}
	}
	if len(clocks) == 0 {
		return ^uint32(0)
	}
	slices.Sort(clocks)
	return clocks[min(len(clocks)-1, len(clocks)*want/max(1, t.n))]
}

// oldest returns the want least recently stored or matched keys (fewer
// only if the table has fewer), ties broken by position. It scans the whole
// table once, keeping candidates at or under a clock limit: the limit starts
// at a quantile estimated from a sample, and whenever 4*want candidates pile
// up it drops to the clock of the 2*want-th oldest, so the candidates stay
// few whatever the sample said.
func (t *keyTable) oldest(want int, from *int) []uint64 {
	limit := t.clockQuantile(want)
	cands := make([]candidate, 0, 4*want)
	byClock := func(a, b candidate) int { return int(a.clock) - int(b.clock) }
	for pass := 0; pass < 2 && len(cands) < want; pass++ {
		if pass == 1 {
			limit, cands = ^uint32(0), cands[:0]
		}
		for s := range numShards {
			a := t.shards[(*from+s)%numShards].arr.Load()
			for i := range a.slots {
				k, c := a.slots[i].key, a.clock(i)
				if k == emptyKey || k == deadKey || c > limit || !t.held(a, i) {
					continue
				}
				cands = append(cands, candidate{k, c})
				if len(cands) == cap(cands) {
					slices.SortFunc(cands, byClock)
					cands = cands[:2*want]
					limit = cands[len(cands)-1].clock
				}
			}
		}
	}
	*from = (*from + 1) % numShards
	slices.SortFunc(cands, byClock)
	keys := make([]uint64, 0, want)
	for _, c := range cands[:min(want, len(cands))] {
		keys = append(keys, c.key)
	}
	return keys
}

type candidate struct {
	key   uint64
	clock uint32
}

// evictForTotal evicts a batch of keys from the least recently used model
// that can be locked without waiting (self's mutex is already held), so that
// MaxPrefixes holds.
func (t *SyncPrefixHashTable) evictForTotal(self *modelTable) {
	for t.total.Load() >= int64(t.cfg.MaxPrefixes) {
		var models []*modelTable
		for _, m := range *t.models.Load() {
			models = append(models, m)
		}
		slices.SortFunc(models, func(a, b *modelTable) int { return int(a.lastUse.Load()) - int(b.lastUse.Load()) })
		evicted, busy := t.evictOldest(self, models)
		switch {
		case evicted:
		case busy:
			runtime.Gosched()
		default:
			// No model has a key to evict: the other writers freed them.
			return
		}
	}
}

// evictOldest evicts a batch from the first model of models, oldest first,
// that has keys and can be locked without waiting. busy reports that a model
// with keys was locked by another writer.
func (t *SyncPrefixHashTable) evictOldest(self *modelTable, models []*modelTable) (evicted, busy bool) {
	for _, m := range models {
		if m == self {
			if m.evictLRU(1, reasonTotal) > 0 {
				return true, false
			}
			continue
		}
		if m.keys.count.Load() == 0 {
			continue
		}
		if !m.mu.TryLock() {
			busy = true
			continue
		}
		evicted = !m.isDropped() && m.evictLRU(1, reasonTotal) > 0
		m.mu.Unlock()
		if evicted {
			return true, false
		}
	}
	return false, busy
}

// keySet is a set of nonzero keys, sized once.
type keySet struct{ slots []uint64 }

func newKeySet(n int) keySet { return keySet{make([]uint64, 2*n+1)} }

// home places a key by all its bits. Its top bits would not do: the keys of
// one eviction batch come from a scan of the key table, whose shards and
// slots are chosen by those bits, so a batch shares them.
func (s *keySet) home(k uint64) int { return home(k*mixA, len(s.slots)) }

func (s *keySet) add(k uint64) {
	c := len(s.slots)
	for i := s.home(k); ; {
		if s.slots[i] == 0 || s.slots[i] == k {
			s.slots[i] = k
			return
		}
		if i++; i == c {
			i = 0
		}
	}
}

func (s *keySet) has(k uint64) bool {
	c := len(s.slots)
	for i := s.home(k); ; {
		switch s.slots[i] {
		case k:
			return true
		case 0:
			return false
		}
		if i++; i == c {
			i = 0
		}
	}
}

// Run sweeps the index every EvictionInterval until ctx is done, then
// returns nil. A sweep purges the pods that sent no event and were credited
// by no match for EvictionDuration, and forgets models left without pods and
// blocks.
func (t *SyncPrefixHashTable) Run(ctx context.Context) error {
	tk := time.NewTicker(t.cfg.EvictionInterval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C:
			t.sweep(t.now())
		}
	}
}

// sweep performs one sweep at time now.
func (t *SyncPrefixHashTable) sweep(now time.Time) {
	cutoff := now.Add(-t.cfg.EvictionDuration).UnixNano()
	t.mu.Lock()
	var idle []string
	for name, ps := range t.pods {
		if ps.lastActive() < cutoff {
			idle = append(idle, name)
		}
	}
	t.mu.Unlock()
	for _, pod := range idle {
		t.purgePodIf(pod, reasonIdle, func(ps *podState) bool { return ps.lastActive() < cutoff })
	}
	t.forgetEmptyModels()
}

// lastActive is the unix nanoseconds of the pod's last event or credited
// match, or of its creation; SyncPrefixHashTable.mu is held.
func (ps *podState) lastActive() int64 {
	last := max(ps.created, ps.lastMatch.Load())
	for _, st := range ps.streams {
		last = max(last, st.lastEvent.Load())
	}
	return last
}

// forgetEmptyModels drops the models that have neither streams nor keys.
func (t *SyncPrefixHashTable) forgetEmptyModels() {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.models.Load()
	models := make(map[string]*modelTable, len(old))
	for name, m := range old {
		if len(m.streams) > 0 || m.keys.count.Load() > 0 {
			models[name] = m
			continue
		}
		m.mu.Lock()
		m.dropped.Store(true)
		m.mu.Unlock()
	}
	if len(models) != len(old) {
		t.models.Store(&models)
	}
}
