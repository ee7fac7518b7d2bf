package indexer

import (
	"cmp"
	"math/bits"
	"runtime"
	"slices"
	"sync/atomic"
)

// evictBatchDiv sets the size of an eviction round: a model at capacity
// removes 1/evictBatchDiv of its residencies at once, so that the scans of
// its key table and of the evicted streams' lanes are paid once per many
// stores.
const evictBatchDiv = 32

// makeRoom evicts keys so that one more key fits both bounds, and reports
// whether it evicted any (from any model); m.mu is held.
func (m *modelTable) makeRoom() bool {
	cfg := &m.t.cfg
	if m.keys.n >= cfg.MaxPrefixesPerContext {
		m.evict(m.keys.n-cfg.MaxPrefixesPerContext+1, reasonCapacity)
		return true
	}
	if m.t.total.Load() >= int64(cfg.MaxPrefixes) {
		m.t.evictForTotal(m)
		return true
	}
	return false
}

// evict removes residencies of the model in rounds, by the policy of the
// package documentation, until at least need keys have lost their last
// holder (fewer only if the model has fewer keys), and returns how many
// did; m.mu is held. An evicted residency leaves its key's holder set and
// its lane's map in the same step.
func (m *modelTable) evict(need int, reason string) int {
	freed, removed := 0, 0
	for freed < need {
		f, r := m.evictRound(need - freed)
		if r == 0 {
			break
		}
		freed, removed = freed+f, removed+r
	}
	if removed > 0 {
		m.t.metrics.evicted(reason, removed)
		if l := m.t.cfg.Logger.V(3); l.Enabled() {
			l.Info("Evicted blocks of a model from the KV-cache index",
				"model", m.name, "reason", reason, "keys", freed, "residencies", removed)
		}
	}
	return freed
}

// payer is a stream that gives up residencies in an eviction round.
type payer struct {
	lanes []*lane
	// mask has the holder bits of the stream's lanes, one word per word of
	// the key table's holder sets.
	mask []uint64
	// charge is the stream's residencies, quota how many of them go.
	charge, quota int
	pick          picker
}

// evictRound removes about 1/evictBatchDiv of the model's residencies, and
// at least need: from the streams that hold the most, the least recently
// used of each, down to a common level. It returns how many keys lost their
// last holder and how many residencies went.
func (m *modelTable) evictRound(need int) (freed, removed int) {
	payers, owner := m.payers(need)
	if len(payers) == 0 {
		return 0, 0
	}
	m.keys.offerOldest(payers, owner, m.evictFrom)
	m.evictFrom = (m.evictFrom + 1) % numShards
	for _, p := range payers {
		victims := p.pick.take(p.quota)
		set := newKeySet(len(victims))
		for _, v := range victims {
			r := slotRef{&m.keys.shards[v.shard], m.keys.shards[v.shard].arr.Load(), int(v.slot)}
			for w, lanes := range p.mask {
				if lanes != 0 && w < r.a.width() {
					atomic.AndUint64(r.a.word(w, r.i), ^lanes)
				}
			}
			if !m.keys.held(r.a, r.i) {
				m.keys.bury(r)
				freed++
			}
			set.add(v.key)
		}
		for _, ln := range p.lanes {
			removed += ln.m.removeKeys(&set)
			ln.publish()
		}
	}
	return freed, removed
}

// payers returns the streams that pay for an eviction round, with their
// quotas, and the index of the payer that owns each holder id (-1 for
// none). Every residency costs its stream one unit of charge, and the round
// takes max(need, 1/evictBatchDiv of all charges) units from the streams
// with the highest charges, down to the level where they all end (see
// waterLevel).
func (m *modelTable) payers(need int) ([]*payer, []int32) {
	byStream := make(map[*stream]*payer)
	var all []*payer
	total := 0
	for _, ln := range m.lanes {
		if ln == nil || ln.m.n == 0 {
			continue
		}
		p := byStream[ln.stream]
		if p == nil {
			p = &payer{mask: make([]uint64, m.keys.width)}
			byStream[ln.stream] = p
			all = append(all, p)
		}
		p.lanes = append(p.lanes, ln)
		p.mask[ln.id>>6] |= 1 << (ln.id & 63)
		p.charge += ln.m.blocks()
		total += ln.m.blocks()
	}
	slices.SortFunc(all, func(a, b *payer) int { return cmp.Compare(b.charge, a.charge) })
	charges := make([]int, len(all))
	for i, p := range all {
		charges[i] = p.charge
	}
	level := waterLevel(charges, max(need, total/evictBatchDiv))
	owner := make([]int32, len(m.lanes))
	for i := range owner {
		owner[i] = -1
	}
	payers := all[:0]
	for _, p := range all {
		if p.charge <= level {
			break
		}
		p.quota = p.charge - level
		p.pick.want = p.quota
		for _, ln := range p.lanes {
			owner[ln.id] = int32(len(payers))
		}
		payers = append(payers, p)
	}
	return payers, owner
}

// waterLevel returns the highest level such that the charges above it,
// sorted from the highest, add up to at least batch: the level the highest
// charges end at when batch units are taken from them, each down to the
// same level, none below it. It is 0 when batch is all there is.
func waterLevel(charges []int, batch int) int {
	sum := 0
	for k := 1; k <= len(charges); k++ {
		sum += charges[k-1]
		next := 0
		if k < len(charges) {
			next = charges[k]
		}
		if sum-k*next >= batch {
			return (sum - batch) / k
		}
	}
	return 0
}

// offerOldest scans the table once, shard by shard from shard from, and
// offers each key that a payer's lanes hold to that payer's picker, with
// the number of the payer's lanes holding it. owner maps holder ids to
// payers.
func (t *keyTable) offerOldest(payers []*payer, owner []int32, from int) {
	anyMask := make([]uint64, t.width)
	for _, p := range payers {
		for w, lanes := range p.mask {
			anyMask[w] |= lanes
		}
	}
	held := make([]uint64, t.width)
	pos := uint32(0)
	for s := range numShards {
		si := (from + s) % numShards
		a := t.shards[si].arr.Load()
		base := pos
		pos += uint32(a.cap())
		if t.width == 1 && len(payers) == 1 {
			// The common case, a flood from one stream, without the
			// bookkeeping of several payers and holder words.
			offerOne(a, anyMask[0], &payers[0].pick, si, base)
			continue
		}
		for i := range a.slots {
			hit := a.slots[i].holders&anyMask[0] != 0
			for w := 1; w < len(held) && !hit; w++ {
				hit = w < a.width() && a.more[w-1][i]&anyMask[w] != 0
			}
			if !hit || a.slots[i].key <= deadKey {
				continue
			}
			for w := range held {
				held[w] = 0
				if w < a.width() {
					held[w] = *a.word(w, i) & anyMask[w]
				}
			}
			c := evictCand{key: a.slots[i].key, clock: a.clock(i), pos: base + uint32(i), slot: int32(i), shard: uint8(si)}
			for w := 0; w < len(held); {
				if held[w] == 0 {
					w++
					continue
				}
				p := payers[owner[w<<6|bits.TrailingZeros64(held[w])]]
				c.weight = 0
				for v, lanes := range p.mask {
					c.weight += uint16(bits.OnesCount64(held[v] & lanes))
					held[v] &^= lanes
				}
				p.pick.offer(c)
			}
		}
	}
}

// offerOne offers to p the keys of shard arrays a that the lanes of mask
// hold, in a table of one holder word; base is the scan position of the
// shard's first slot.
func offerOne(a *keySlots, mask uint64, p *picker, shard int, base uint32) {
	for i := range a.slots {
		sl := &a.slots[i]
		h := sl.holders & mask
		if h == 0 || sl.key <= deadKey {
			continue
		}
		clock := a.clock(i)
		if p.full && clock >= p.limit {
			continue
		}
		p.offer(evictCand{key: sl.key, clock: clock, pos: base + uint32(i), slot: int32(i), shard: uint8(shard),
			weight: uint16(bits.OnesCount64(h))})
	}
}

// evictCand is a key a payer may give up: where it is, how recently it was
// used, the scan position that breaks ties between equal clocks, and how
// many of the payer's lanes hold it.
type evictCand struct {
	key    uint64
	clock  uint32
	pos    uint32
	slot   int32
	shard  uint8
	weight uint16
}

func byAge(a, b evictCand) int {
	return cmp.Or(cmp.Compare(a.clock, b.clock), cmp.Compare(a.pos, b.pos))
}

// picker keeps the want oldest of the candidates offered to it, ties going
// to the earlier offered. It buffers up to twice want (at least
// minPickBuffer) and then keeps the want oldest, after which it takes only
// candidates strictly older than the youngest kept: the candidates it
// holds stay few whatever the clocks, equal ones included.
type picker struct {
	want  int
	limit uint32
	full  bool
	cands []evictCand
}

const minPickBuffer = 64

func (p *picker) offer(c evictCand) {
	if p.full && c.clock >= p.limit {
		return
	}
	if p.cands == nil {
		p.cands = make([]evictCand, 0, max(2*p.want, minPickBuffer))
	}
	p.cands = append(p.cands, c)
	if len(p.cands) == cap(p.cands) {
		p.trim()
	}
}

// trim keeps the want oldest candidates.
func (p *picker) trim() {
	slices.SortFunc(p.cands, byAge)
	if len(p.cands) > p.want {
		p.cands = p.cands[:p.want]
		p.limit, p.full = p.cands[p.want-1].clock, true
	}
}

// take returns the oldest candidates whose lanes add up to quota
// residencies, or all of them.
func (p *picker) take(quota int) []evictCand {
	p.trim()
	for i, c := range p.cands {
		if quota -= int(c.weight); quota <= 0 {
			return p.cands[:i+1]
		}
	}
	return p.cands
}

// evictForTotal evicts a round from the least recently used model that can
// be locked without waiting (self's mutex is already held), so that
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

// evictOldest evicts a round from the first model of models, oldest first,
// that has keys and can be locked without waiting. busy reports that a model
// with keys was locked by another writer.
func (t *SyncPrefixHashTable) evictOldest(self *modelTable, models []*modelTable) (evicted, busy bool) {
	for _, m := range models {
		if m == self {
			if m.evict(1, reasonTotal) > 0 {
				return true, false
			}
			continue
		}
		if m.keys.count.Load() == 0 {
			continue
		}
		if !m.tryLock() {
			busy = true
			continue
		}
		evicted = !m.isDropped() && m.evict(1, reasonTotal) > 0
		m.unlock()
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
