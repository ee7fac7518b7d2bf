package indexer

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// ApplyBatch applies the events of one batch of stream s, in order, holding
// the model's writer lock once for the whole batch. Concurrent matches see
// the blocks of an event appear in chain order, so they never credit a block
// without the ones before it. Batches of one stream must be applied in
// sequence order by one goroutine; different streams may be applied
// concurrently. The stream's Rank, not the batch's DataParallelRank, names
// the publisher.
//
// Malformed events (tokens that do not align to blocks, a per-block list of
// extra keys of the wrong length, an unknown event type) and stored blocks
// in a medium or KV-cache group past the stream's lane limit are skipped and
// counted, every other event is applied, and the returned error describes
// the skipped ones; it is for logging, the stream needs no recovery. Blocks
// whose parent the index never saw are skipped and counted without an error
// (see the package documentation).
func (t *SyncPrefixHashTable) ApplyBatch(s Stream, batch *kvevent.EventBatch) error {
	if batch == nil {
		return fmt.Errorf("apply batch from %s rank %d: nil batch", s.Pod, s.Rank)
	}
	st, m := t.lockStream(s)
	defer m.unlock()
	now := t.now()
	tick := t.tick(now)
	var errs []error
	for i, ev := range batch.Events {
		if err := m.apply(st, ev, tick); err != nil {
			errs = append(errs, fmt.Errorf("event %d: %w", i, err))
		}
	}
	t.applied(st, m, now)
	if len(errs) > 0 {
		return fmt.Errorf("apply batch from %s rank %d: %w", s.Pod, s.Rank, errors.Join(errs...))
	}
	return nil
}

// ProcessBlockStored applies one BlockStored event of stream s, as ApplyBatch
// would.
func (t *SyncPrefixHashTable) ProcessBlockStored(s Stream, e *kvevent.BlockStoredEvent) error {
	return t.applyOne(s, e)
}

// ProcessBlockRemoved applies one BlockRemoved event of stream s, as
// ApplyBatch would.
func (t *SyncPrefixHashTable) ProcessBlockRemoved(s Stream, e *kvevent.BlockRemovedEvent) error {
	return t.applyOne(s, e)
}

// ProcessAllBlocksCleared applies one AllBlocksCleared event of stream s, as
// ApplyBatch would.
func (t *SyncPrefixHashTable) ProcessAllBlocksCleared(s Stream, e *kvevent.AllBlocksClearedEvent) error {
	return t.applyOne(s, e)
}

func (t *SyncPrefixHashTable) applyOne(s Stream, ev kvevent.KVEvent) error {
	st, m := t.lockStream(s)
	defer m.unlock()
	now := t.now()
	err := m.apply(st, ev, t.tick(now))
	t.applied(st, m, now)
	if err != nil {
		return fmt.Errorf("apply event from %s rank %d: %w", s.Pod, s.Rank, err)
	}
	return nil
}

// lockStream returns the live state of s with its model's writer lock
// held; the caller releases it with unlock.
func (t *SyncPrefixHashTable) lockStream(s Stream) (*stream, *modelTable) {
	for {
		st, stale := t.streamFor(s)
		if stale != nil {
			stale.model.releaseStream(stale)
		}
		m := st.model
		m.lock()
		if !st.gone && !m.isDropped() {
			return st, m
		}
		m.unlock()
	}
}

// applied records the activity of a stream.
func (t *SyncPrefixHashTable) applied(st *stream, m *modelTable, now time.Time) {
	m.use(t.tick(now))
	st.lastEvent.Store(now.UnixNano())
}

// apply applies one event and publishes the sizes of st's lanes; m.mu is
// held.
func (m *modelTable) apply(st *stream, ev kvevent.KVEvent, now uint32) error {
	defer func() {
		for _, ln := range st.lanes {
			ln.publish()
		}
	}()
	switch e := ev.(type) {
	case *kvevent.BlockStoredEvent:
		if e != nil {
			return m.store(st, e, now)
		}
	case *kvevent.BlockRemovedEvent:
		if e != nil {
			m.remove(st, e)
			return nil
		}
	case *kvevent.AllBlocksClearedEvent:
		if e != nil {
			for _, ln := range st.lanes {
				m.clearLane(ln)
			}
			return nil
		}
	}
	return fmt.Errorf("unsupported event %T", ev)
}

// store indexes the blocks of a BlockStored event for st.
func (m *modelTable) store(st *stream, e *kvevent.BlockStoredEvent, now uint32) error {
	n, bs := len(e.BlockHashes), e.BlockSize
	if n == 0 {
		return nil
	}
	if bs <= 0 || len(e.TokenIDs)%bs != 0 || len(e.TokenIDs)/bs != n {
		m.t.metrics.skipped(reasonTokens, n)
		return fmt.Errorf("BlockStored has %d block hashes, block size %d and %d tokens, which do not align: %d blocks skipped",
			n, bs, len(e.TokenIDs), n)
	}
	if e.ExtraKeys != nil && len(e.ExtraKeys) != n {
		m.t.metrics.skipped(reasonExtraKeys, n)
		return fmt.Errorf("BlockStored has %d block hashes and %d extra-key lists: %d blocks skipped",
			n, len(e.ExtraKeys), n)
	}
	if e.LoraID > 0 && e.LoraName == "" {
		// No request can name the adapter these blocks were computed
		// with (see the package documentation).
		m.t.metrics.skipped(reasonLoraID, n)
		return nil
	}
	medium, group := normMedium(e.Medium), normGroup(e.GroupIdx)
	ln := m.laneOf(st, medium, group)
	if ln == nil && st.spareLane() < 0 {
		m.t.metrics.skipped(reasonLaneLimit, n)
		return fmt.Errorf("BlockStored in medium %q group %d would take a lane past the stream's %d, which all hold blocks: %d blocks skipped",
			medium, group, maxLanesPerStream, n)
	}
	if ln != nil && int(ln.blockSize.Load()) != bs {
		m.resize(ln, bs)
	}
	parent := m.t.keyer.root(m.name, e.LoraName)
	if e.HasParent {
		k, ok := translate(st, ln, bs, e.ParentBlockHash)
		switch {
		case ok:
			parent = k
		case e.ParentBlockHash == 0:
			// Engines that always send a parent send 0 for the first
			// block of a prompt.
		default:
			m.t.metrics.parentMissed(n)
			if l := m.t.cfg.Logger.V(4); l.Enabled() {
				l.Info("Skipped stored blocks whose parent the KV-cache index never saw",
					"pod", st.id.pod, "rank", st.id.rank, "model", m.name, "blocks", n)
			}
			return nil
		}
	}
	if ln == nil {
		ln = m.addLane(st, medium, group, bs)
	}
	for i, h := range e.BlockHashes {
		var extra uint64
		if e.ExtraKeys != nil {
			extra = extraDigest(e.ExtraKeys[i], e.LoraName)
		}
		key := m.t.keyer.block(parent, e.TokenIDs[i*bs:(i+1)*bs], extra)
		m.addResidency(ln, h, key, now)
		parent = key
	}
	return nil
}

// resize makes ln a lane of blocks of bs tokens. An engine's block size is
// fixed for its life, so blocks of another size in the same lane come from
// an engine that restarted unseen: the lane's earlier blocks are dropped.
func (m *modelTable) resize(ln *lane, bs int) {
	old := ln.blockSize.Load()
	n := m.clearLane(ln)
	m.t.metrics.evicted(reasonBlockSize, n)
	ln.blockSize.Store(int64(bs))
	m.publishPods()
	st := ln.stream
	m.t.cfg.Logger.V(2).Info("An engine changed its block size: dropped its blocks of the old size from the KV-cache index",
		"pod", st.id.pod, "rank", st.id.rank, "model", m.name, "medium", ln.medium, "group", ln.group,
		"blockSize", bs, "previous", old, "blocks", n)
}

// translate finds the key of an engine hash of st: in lane ln first, then in
// st's other lanes of blocks of bs tokens (an engine names a block by the
// same hash in every medium and group that holds it; a key chained from a
// block of another size would name no prompt's prefix).
func translate(st *stream, ln *lane, bs int, hash uint64) (uint64, bool) {
	if ln != nil {
		if k, ok := ln.m.get(hash); ok {
			return k, true
		}
	}
	for _, o := range st.lanes {
		if o != ln && int(o.blockSize.Load()) == bs {
			if k, ok := o.m.get(hash); ok {
				return k, true
			}
		}
	}
	return 0, false
}

// addResidency records that ln holds the block named hash by its engine and
// key by the index. Storing a block again refreshes it; storing one that ln
// holds under another engine hash adds hash as a further name of it (see
// laneMap).
func (m *modelTable) addResidency(ln *lane, hash, key uint64, now uint32) {
	// at is where the lane's probe sequence for hash ends, for the insert
	// below, unless the lane changes in between.
	at, held := ln.m.slot(hash)
	if held {
		if ln.m.key(at) == key {
			if r, ok := m.keys.find(key); ok {
				r.touch(now)
			}
			return
		}
		// The engine names other content by this hash now.
		m.dropResidency(ln, hash)
		at = -1
	}
	r, ok := m.keys.find(key)
	switch {
	case !ok:
		if m.makeRoom() {
			at = -1
		}
		r = m.keys.insert(key, now, r)
	case !m.keys.held(r.a, r.i):
		// Every holder of the key was released: it is stored anew.
		if m.makeRoom() {
			at = -1
		}
		m.keys.revive(r, now)
	case r.has(ln.id):
		// Content the lane holds under another engine hash: the engine
		// restarted with another hash seed, or its events leave out inputs
		// its hashes include. The lane keeps one residency of the key,
		// named by both.
		r.touch(now)
		if ln.m.aliases[key] >= maxNamesPerBlock-1 {
			m.t.metrics.skipped(reasonNameLimit, 1)
			return
		}
		ln.m.alias(at, hash, key)
		return
	default:
		r.touch(now)
	}
	r.add(ln.id)
	ln.m.add(at, hash, key)
}

// dropResidency removes the name hash of a block of ln, and ln's residency
// of the block when that was its last name.
func (m *modelTable) dropResidency(ln *lane, hash uint64) {
	key, last, ok := ln.m.del(hash)
	if !ok || !last {
		return
	}
	if r, ok := m.keys.find(key); ok {
		m.keys.drop(r, ln.id)
	}
}

// remove applies a BlockRemoved event: only st's residencies in the event's
// medium and group go.
func (m *modelTable) remove(st *stream, e *kvevent.BlockRemovedEvent) {
	ln := m.laneOf(st, normMedium(e.Medium), normGroup(e.GroupIdx))
	if ln == nil {
		return
	}
	for _, h := range e.BlockHashes {
		m.dropResidency(ln, h)
	}
}
