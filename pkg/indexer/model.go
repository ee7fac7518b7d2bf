package indexer

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// holderReuseDelay is how long a released holder id stays unused, so that a
// match still running with the released lane in its snapshot of the pod index
// cannot credit the released lane's pod with a new lane's blocks.
const holderReuseDelay = 10 * time.Second

// modelTable is the index of one model (a context): its key table, its lanes
// and the index of its pods that matches read.
type modelTable struct {
	name string
	t    *SyncPrefixHashTable

	// mu serialises the writers of this model: event application, purges,
	// evictions. Matches and statistics never take it. Writers take it
	// with lock and release it with unlock, which runs the work queued by
	// later.
	mu sync.Mutex
	// queue holds the work later queued for the holder of mu; queueMu
	// guards it, and queued counts its entries for unlock to read without
	// taking queueMu. It holds at most one entry per stream the model ever
	// had, one for the model's drop and one narrow: narrowing is set while
	// a sweep's narrow is queued.
	queueMu   sync.Mutex
	queue     []func()
	queued    atomic.Int32
	narrowing atomic.Bool
	keys      keyTable
	// lanes is indexed by holder id; nil marks a free id.
	lanes []*lane
	free  []freeHolder
	// streams is guarded by SyncPrefixHashTable.mu.
	streams map[*stream]struct{}

	pods    atomic.Pointer[podIndex]
	lastUse atomic.Uint32
	dropped atomic.Bool
	// evictFrom is where the next eviction scan starts (a shard number).
	evictFrom int
	// mostSizes is the most block sizes the model's engines used at once,
	// logged when it grows past one.
	mostSizes int
}

type freeHolder struct {
	id       int
	released time.Time
}

// podIndex is an immutable snapshot, published on every change of lanes or
// of their block sizes, of which holder ids belong to which pod, rank,
// block size and medium in the primary group (group 0), the one matches
// read.
type podIndex struct {
	width int
	pods  map[string]*podHolders
	// sizes are the block sizes of the primary group's lanes, ascending,
	// each with the number of streams that have a lane of it; primary is
	// the size most streams have (the smaller of equals), 0 for none.
	sizes   []sizeStreams
	primary int
}

type sizeStreams struct{ blockSize, streams int }

type podHolders struct {
	state *podState
	units []unitHolders
}

// unitHolders are the holder sets, width words each, of the lanes of one
// rank and one block size, in any medium and on GPU: what a match credits
// as one run.
type unitHolders struct {
	rank, blockSize int
	any, gpu        []uint64
}

func newModelTable(t *SyncPrefixHashTable, name string) *modelTable {
	m := &modelTable{name: name, t: t, streams: make(map[*stream]struct{})}
	m.keys.init(&t.total, t.sweepRatio)
	m.pods.Store(&podIndex{width: 1})
	m.lastUse.Store(t.tick(t.now()))
	return m
}

func (m *modelTable) isDropped() bool { return m.dropped.Load() }

// lock takes the model's writer lock, waiting for the current writer.
func (m *modelTable) lock() { m.mu.Lock() }

// tryLock takes the model's writer lock if no writer holds it.
func (m *modelTable) tryLock() bool { return m.mu.TryLock() }

// unlock runs the work queued by later and releases the writer lock. Work
// queued while it releases the lock is run by whichever goroutine takes the
// lock next, itself included, before that one releases it.
func (m *modelTable) unlock() {
	for {
		if m.queued.Load() > 0 {
			for _, fn := range m.takeQueue() {
				fn()
			}
		}
		m.mu.Unlock()
		if m.queued.Load() == 0 || !m.mu.TryLock() {
			return
		}
	}
}

// later runs fn under the writer lock without waiting for a writer: at once
// if no writer holds the lock, else by the writer that holds it, before it
// releases it. fn must not take SyncPrefixHashTable.mu, which the caller
// may hold.
func (m *modelTable) later(fn func()) {
	m.queueMu.Lock()
	m.queue = append(m.queue, fn)
	m.queued.Add(1)
	m.queueMu.Unlock()
	if m.mu.TryLock() {
		m.unlock()
	}
}

func (m *modelTable) takeQueue() []func() {
	m.queueMu.Lock()
	defer m.queueMu.Unlock()
	q := m.queue
	m.queue = nil
	m.queued.Store(0)
	return q
}

// use records that the model was stored into or matched at tick now.
func (m *modelTable) use(now uint32) {
	if m.lastUse.Load() < now {
		m.lastUse.Store(now)
	}
}

// maxLanesPerStream bounds the lanes of one stream. Each lane is a holder
// id of its model's key table, and every 64 ids widen every slot of the
// table by a word, for the keys of every pod. vLLM's engines use a few media
// (GPU, CPU, STORAGE, or FS and OBJ before STORAGE) and, for hybrid models, a
// handful of KV-cache groups (about eight at most): 32 lanes hold four media
// of eight groups. Past it, a stream's blocks in a further medium or group
// take one of its empty lanes, or are skipped and counted
// (skipped_blocks_total{reason="lane_limit"}).
const maxLanesPerStream = 32

// maxNamesPerBlock bounds the engine hashes by which one lane names one
// block (see laneMap). An engine that restarts unseen adds a name per
// restart, and an engine whose events leave out its hashes' inputs one per
// look-alike block, which an engine could otherwise repeat without end, each
// name taking lane memory but no key. Past it, a further name is skipped
// and counted (skipped_blocks_total{reason="name_limit"}), and the blocks
// stored after it under that name are unknown parents.
const maxNamesPerBlock = 8

// maxMediumBytes bounds the medium name a lane keeps (see normMedium).
const maxMediumBytes = 64

// mediumSeed seeds the hash that tells long medium names apart.
var mediumSeed = maphash.MakeSeed()

// normMedium names the medium of an event: events without one describe the
// GPU cache, and a name longer than maxMediumBytes is cut and followed by a
// hash of the whole, so that a lane keeps at most maxMediumBytes of whatever
// name an engine sends and two long names still name two lanes (unless
// their 64-bit hashes collide, which merges the engine's own lanes).
func normMedium(medium string) string {
	switch {
	case medium == "":
		return kvevent.MediumGPU
	case len(medium) <= maxMediumBytes:
		return medium
	}
	cut := maxMediumBytes - 17
	for cut > 0 && !utf8.RuneStart(medium[cut]) {
		cut--
	}
	return fmt.Sprintf("%s~%016x", medium[:cut], maphash.String(mediumSeed, medium))
}

// normGroup names the group of an event; an event without one belongs to
// the engine's only group, 0.
func normGroup(group int) int {
	if group == kvevent.NoGroup {
		return 0
	}
	return group
}

// laneOf returns st's lane for a medium and group, or nil; m.mu is held.
func (m *modelTable) laneOf(st *stream, medium string, group int) *lane {
	for _, ln := range st.lanes {
		if ln.medium == medium && ln.group == group {
			return ln
		}
	}
	return nil
}

// spareLane is where addLane puts st's next lane: len(st.lanes) while st has
// fewer than maxLanesPerStream, else the index of a lane that holds no
// block, or -1 when every lane holds blocks; m.mu is held.
func (st *stream) spareLane() int {
	if len(st.lanes) < maxLanesPerStream {
		return len(st.lanes)
	}
	return slices.IndexFunc(st.lanes, func(ln *lane) bool { return ln.m.n == 0 })
}

// addLane gives st a lane for a medium and group, of blocks of blockSize
// tokens, at st.spareLane(), which must not be -1. An empty lane it replaces
// leaves its holder id to the new one at once: the id has no bit in any
// slot, and a match still reading the pod index of the old lane may at most
// count the new lane's blocks as the same stream's in the old lane's medium,
// group and block size, as after a resize. m.mu is held.
func (m *modelTable) addLane(st *stream, medium string, group int, blockSize int) *lane {
	at := st.spareLane()
	var id int
	if at < len(st.lanes) {
		id = st.lanes[at].id
	} else {
		id = m.allocHolder()
		st.lanes = append(st.lanes, nil)
	}
	ln := &lane{id: id, stream: st, medium: strings.Clone(medium), group: group, m: laneMap{salt: m.t.keyer.lane}}
	ln.blockSize.Store(int64(blockSize))
	m.lanes[id] = ln
	st.lanes[at] = ln
	st.publishLanes()
	m.publishPods()
	return ln
}

// allocHolder returns a holder id for a new lane: the lowest released id
// whose grace period is over and whose bits no slot still has, else a new
// id, unless that would widen the key table while a released id could be
// scrubbed instead.
func (m *modelTable) allocHolder() int {
	now := m.t.now()
	m.trimHolders(now)
	best, at := -1, -1
	for i, f := range m.free {
		if now.Sub(f.released) < holderReuseDelay {
			continue
		}
		if better := best < 0 || (m.keys.clean(f.id) && !m.keys.clean(best)) ||
			(m.keys.clean(f.id) == m.keys.clean(best) && f.id < best); better {
			best, at = f.id, i
		}
	}
	id := len(m.lanes)
	if at >= 0 && (m.keys.clean(best) || id >= 64*m.keys.width) {
		m.keys.scrub(best)
		id = best
		m.free = append(m.free[:at], m.free[at+1:]...)
	} else {
		// A trimmed id may still have bits in some shards.
		m.keys.scrub(id)
		m.lanes = append(m.lanes, nil)
	}
	m.keys.widen(id>>6 + 1)
	m.keys.setLive(id)
	return id
}

// trimHolders forgets the released holder ids past the model's last lane
// whose grace period is over, so that the next new id follows the lanes;
// m.mu is held. A trimmed id's bits may stay in slots, stale, until the
// shards are rebuilt or the id is taken again.
func (m *modelTable) trimHolders(now time.Time) {
	for n := len(m.lanes); n > 0 && m.lanes[n-1] == nil; n-- {
		i := slices.IndexFunc(m.free, func(f freeHolder) bool { return f.id == n-1 })
		if i < 0 || now.Sub(m.free[i].released) < holderReuseDelay {
			return
		}
		m.free = slices.Delete(m.free, i, i+1)
		m.lanes = m.lanes[:n-1]
	}
}

// narrow trims the released holder ids (see trimHolders) and, when the key
// table is then wider than the remaining ids need, rebuilds it narrower, so
// that the lanes of purged pods stop widening every slot and every match;
// m.mu is held.
func (m *modelTable) narrow(now time.Time) {
	m.trimHolders(now)
	if width := max(1, (len(m.lanes)+63)>>6); width < m.keys.width {
		m.keys.narrow(width)
		m.publishPods()
	}
}

// publishPods rebuilds the pod index from the lanes of the primary group
// (group 0), the one matches read, and logs when the model's engines use
// more block sizes at once than they ever did, past one.
func (m *modelTable) publishPods() {
	idx := &podIndex{width: m.keys.width, pods: make(map[string]*podHolders)}
	type streamSize struct {
		st *stream
		bs int
	}
	seen := make(map[streamSize]bool)
	for _, ln := range m.lanes {
		if ln == nil || ln.group != 0 {
			continue
		}
		st, bs := ln.stream, int(ln.blockSize.Load())
		ph := idx.pods[st.id.pod]
		if ph == nil {
			ph = &podHolders{state: st.pod}
			idx.pods[st.id.pod] = ph
		}
		u := ph.unit(st.id.rank, bs, idx.width)
		w, bit := ln.id>>6, uint64(1)<<(ln.id&63)
		u.any[w] |= bit
		if ln.medium == kvevent.MediumGPU {
			u.gpu[w] |= bit
		}
		if !seen[streamSize{st, bs}] {
			seen[streamSize{st, bs}] = true
			idx.count(bs)
		}
	}
	m.pods.Store(idx)
	if len(idx.sizes) > max(1, m.mostSizes) {
		m.mostSizes = len(idx.sizes)
		sizes := make([]int, len(idx.sizes))
		for i, s := range idx.sizes {
			sizes[i] = s.blockSize
		}
		m.t.cfg.Logger.Info("The engines of a model use several block sizes: each pod is matched at its own",
			"model", m.name, "blockSizes", sizes)
	}
}

// count adds a stream with a lane of block size bs to idx's sizes.
func (idx *podIndex) count(bs int) {
	i, found := slices.BinarySearchFunc(idx.sizes, bs, func(s sizeStreams, bs int) int { return cmp.Compare(s.blockSize, bs) })
	if !found {
		idx.sizes = slices.Insert(idx.sizes, i, sizeStreams{blockSize: bs})
	}
	idx.sizes[i].streams++
	idx.primary = 0
	best := 0
	for _, s := range idx.sizes {
		if s.streams > best {
			idx.primary, best = s.blockSize, s.streams
		}
	}
}

func (ph *podHolders) unit(rank, blockSize, width int) *unitHolders {
	for i := range ph.units {
		if u := &ph.units[i]; u.rank == rank && u.blockSize == blockSize {
			return u
		}
	}
	ph.units = append(ph.units, unitHolders{rank: rank, blockSize: blockSize, any: make([]uint64, width), gpu: make([]uint64, width)})
	return &ph.units[len(ph.units)-1]
}

// discard marks a dropped model's streams gone and takes its keys out of
// the index's total, under m.mu; it returns the residencies the model held.
// Writers that take m.mu after the model was dropped write nothing, so the
// counts stay as discard leaves them.
func (m *modelTable) discard(streams []*stream) int {
	for _, st := range streams {
		st.gone = true
	}
	blocks := 0
	for _, ln := range m.lanes {
		if ln != nil {
			blocks += ln.m.blocks()
		}
	}
	m.t.total.Add(-int64(m.keys.n))
	return blocks
}

// clearLane removes every residency of ln and returns how many there were;
// m.mu is held.
func (m *modelTable) clearLane(ln *lane) int {
	n := ln.m.blocks()
	m.keys.dropHolder(&ln.m, ln.id)
	ln.publish()
	m.keys.shrink()
	return n
}

// releaseStream forgets every lane of st and marks it gone; it returns the
// number of residencies removed. It reads each of the lanes' keys once and
// writes none of them (see keyTable.release).
func (m *modelTable) releaseStream(st *stream) int {
	m.lock()
	defer m.unlock()
	return m.releaseStreamLocked(st)
}

// releaseStreamLocked is releaseStream with m.mu held.
func (m *modelTable) releaseStreamLocked(st *stream) int {
	st.gone = true
	if len(st.lanes) == 0 || m.isDropped() {
		// A dropped model's table is discarded whole, its counts with it.
		return 0
	}
	// Unpublish first, so that matches stop crediting the lanes at once.
	for _, ln := range st.lanes {
		m.lanes[ln.id] = nil
	}
	m.publishPods()
	n := 0
	now := m.t.now()
	for _, ln := range st.lanes {
		n += ln.m.blocks()
		m.keys.release(&ln.m, ln.id)
		m.free = append(m.free, freeHolder{ln.id, now})
	}
	m.keys.shrink()
	st.lanes = nil
	st.publishLanes()
	return n
}

// publishLanes makes the stream's lanes visible to readers that take no
// lock; the model's mutex is held.
func (st *stream) publishLanes() {
	lanes := slices.Clone(st.lanes)
	st.view.Store(&lanes)
}
