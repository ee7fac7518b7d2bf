package indexer

import (
	"context"
	"time"
)

// Run sweeps the index every EvictionInterval until ctx is done, then
// returns nil. A sweep purges the pods that sent no event and were credited
// by no match for EvictionDuration, forgets models left without pods and
// blocks, and narrows the key tables that released holder ids left wider
// than their lanes need.
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

// sweep performs one sweep at time now. It never waits for a model's
// writer: an idle pod leaves the registry at once, and its streams are
// released under their models' writer locks as soon as those are free
// (see modelTable.later).
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
		for _, st := range t.detachPod(pod, func(ps *podState) bool { return ps.lastActive() < cutoff }) {
			m := st.model
			m.later(func() {
				n := m.releaseStreamLocked(st)
				t.metrics.evicted(reasonIdle, n)
				t.cfg.Logger.V(2).Info("Purged an idle pod's stream from the KV-cache index", "pod", pod,
					"rank", st.id.rank, "model", m.name, "blocks", n, "reason", reasonIdle)
			})
		}
	}
	t.forgetEmptyModels()
	for _, m := range *t.models.Load() {
		if m.narrowing.CompareAndSwap(false, true) {
			m.later(func() {
				m.narrowing.Store(false)
				if !m.isDropped() {
					m.narrow(now)
				}
			})
		}
	}
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
		m.dropped.Store(true)
		m.later(func() { m.discard(nil) })
	}
	if len(models) != len(old) {
		t.models.Store(&models)
	}
}
