package indexer

import (
	"math/bits"
	"sync/atomic"
)

// The key table of a model maps each indexed key to the set of holders (lanes)
// that hold its block, and to the coarse time it was last stored or matched.
//
// It is split into shards by the top bits of the key. Each shard is an
// open-addressing table with linear probing, laid out so that a lookup
// touches one cache line (see keySlots).
//
// One writer at a time (the model's mutex) mutates a shard; readers take no
// lock and never wait. Every slot word is read and written with sync/atomic,
// and a slot's life within one set of arrays is monotonic: empty, then one
// key, then a tombstone. Entries never move and a slot never holds a second
// key, so a reader that finds its key reads that key's holder set (or the
// zero set of a key being deleted), and a reader never misses a key that was
// present for its whole lookup. Tombstones are never reused; they are
// dropped, and the table grows or shrinks, by building new arrays aside and
// publishing them with one atomic pointer store. A reader still on the old
// arrays sees the table as it was just before.

const (
	shardBits = 5
	numShards = 1 << shardBits
	// minSlots is the capacity of an empty shard or lane.
	minSlots = 8
)

// Keys 0 and 1 mark empty slots and tombstones; keyer.block and keyer.root
// never return them.
const (
	emptyKey = 0
	deadKey  = 1
)

// A table is rebuilt when an insert would take its used slots (keys and
// tombstones) past 4/5 of its capacity, or removals leave it under 1/5 full.
// A rebuild sizes it 64% full of keys, so that growing proceeds by a quarter
// and the table stays between 64% and 80% used.
func overFull(n, capacity int) bool  { return n*5 > capacity*4 }
func underFull(n, capacity int) bool { return capacity > minSlots && n*5 < capacity }
func capFor(n int) int               { return max(minSlots, n*25/16) }

// home is the first slot probed for a well-mixed hash h in a table of
// capacity slots.
func home(h uint64, capacity int) int {
	hi, _ := bits.Mul64(h, uint64(capacity))
	return int(hi)
}

type keyTable struct {
	shards [numShards]keyShard
	// width is the number of holder-bitset words per slot. Writer only.
	width int
	// n is the number of keys. Writer only; readers use count.
	n     int
	count atomic.Int64
	// total counts the keys of every table of the index.
	total *atomic.Int64
	// sweepRatio chooses how release and dropHolder find a lane's keys:
	// by looking each up, or by sweeping the slots (see release).
	sweepRatio int
	// buckets is dropHolder's scratch, kept between purges.
	buckets []int32
	// live has the bits of the holder ids of existing lanes. A released
	// lane's bits may stay in slots (see release): they mean nothing, and
	// stale maps such an id to the shards that may still have them, which a
	// rebuild cleans. Writer only.
	live  []uint64
	stale map[int]uint32
}

type keyShard struct {
	arr atomic.Pointer[keySlots]
	// n counts the shard's keys; dead counts its slots that are used but
	// hold no key: tombstones, and keys whose every holder was released.
	// Writer only.
	n, dead int
	_       [40]byte // keep shards on separate cache lines
}

// keySlots are the arrays of one shard. A slot keeps its key, the first
// word of its holder set (holders 0 to 63) and its clock together, so that a
// lookup touches one cache line; more[w-1][i] is word w of slot i's holder
// set when the table has more than 64 holders. Only the writer stores keys
// and holders; readers also store clocks, so every clock access is atomic.
type keySlots struct {
	slots []keySlot
	more  [][]uint64
}

type keySlot struct {
	key     uint64
	holders uint64
	clock   uint32
	_       uint32
}

func newKeySlots(capacity, width int) *keySlots {
	a := &keySlots{slots: make([]keySlot, capacity), more: make([][]uint64, width-1)}
	for w := range a.more {
		a.more[w] = make([]uint64, capacity)
	}
	return a
}

func (a *keySlots) cap() int   { return len(a.slots) }
func (a *keySlots) width() int { return 1 + len(a.more) }

// word is word w of slot i's holder set.
func (a *keySlots) word(w, i int) *uint64 {
	if w == 0 {
		return &a.slots[i].holders
	}
	return &a.more[w-1][i]
}

func (a *keySlots) clock(i int) uint32 { return atomic.LoadUint32(&a.slots[i].clock) }

// held reports whether slot i of a has a live holder; writer only.
func (t *keyTable) held(a *keySlots, i int) bool {
	for w := range min(a.width(), len(t.live)) {
		if *a.word(w, i)&t.live[w] != 0 {
			return true
		}
	}
	return false
}

func (t *keyTable) init(total *atomic.Int64, sweepRatio int) {
	t.width, t.total, t.sweepRatio = 1, total, sweepRatio
	t.stale = make(map[int]uint32)
	for i := range t.shards {
		t.shards[i].arr.Store(newKeySlots(minSlots, 1))
	}
}

func shardOf(key uint64) int { return int(key >> (64 - shardBits)) }

// slotHome is where key's probe sequence starts; the shard bits are shifted
// out so that every shard spreads its keys over all its slots.
func slotHome(key uint64, capacity int) int { return home(key<<shardBits, capacity) }

// find returns the slot of key, or the empty slot that ends its probe
// sequence, reading keys atomically. The table always keeps a fifth of its
// slots empty; the probe count bound only keeps a broken count from turning
// into an endless loop.
func (a *keySlots) find(key uint64) (int, bool) {
	c := a.cap()
	i := slotHome(key, c)
	for range c {
		k := atomic.LoadUint64(&a.slots[i].key)
		if k == key {
			return i, true
		}
		if k == emptyKey {
			return i, false
		}
		if i++; i == c {
			i = 0
		}
	}
	return i, false
}

// lookup copies the holder set of key into dst (len(dst) words; words the
// table does not have read as 0) and reports whether key is present. It
// refreshes the key's clock to now when it is older.
func (t *keyTable) lookup(key uint64, now uint32, dst []uint64) bool {
	a := t.shards[shardOf(key)].arr.Load()
	i, ok := a.find(key)
	if !ok {
		return false
	}
	for w := range dst {
		if w < a.width() {
			dst[w] = atomic.LoadUint64(a.word(w, i))
		} else {
			dst[w] = 0
		}
	}
	if a.clock(i) < now {
		atomic.StoreUint32(&a.slots[i].clock, now)
	}
	return true
}

// homeSlot is the first slot a lookup of key reads.
func (t *keyTable) homeSlot(key uint64) *keySlot {
	a := t.shards[shardOf(key)].arr.Load()
	return &a.slots[slotHome(key, a.cap())]
}

// slotRef names one slot of a shard for the writer.
type slotRef struct {
	sh *keyShard
	a  *keySlots
	i  int
}

// find returns the slot of key for the writer.
func (t *keyTable) find(key uint64) (slotRef, bool) {
	sh := &t.shards[shardOf(key)]
	a := sh.arr.Load()
	i, ok := a.find(key)
	return slotRef{sh, a, i}, ok
}

// revive makes a key whose holders were all released, found at r, a key of
// the table again; its holder set has no live holder.
func (t *keyTable) revive(r slotRef, now uint32) {
	r.sh.n++
	r.sh.dead--
	t.counted(1)
	atomic.StoreUint32(&r.a.slots[r.i].clock, now)
}

// insert adds key, which must be absent, with an empty holder set. at is
// where find said the key's probe sequence ends; it is used when the shard
// still has those arrays and room.
func (t *keyTable) insert(key uint64, now uint32, at slotRef) slotRef {
	sh := &t.shards[shardOf(key)]
	a, i := sh.arr.Load(), at.i
	if overFull(sh.n+sh.dead+1, a.cap()) {
		a = t.rebuild(shardOf(key), capFor(sh.n+1))
	}
	if a != at.a {
		i, _ = a.find(key)
	}
	atomic.StoreUint32(&a.slots[i].clock, now)
	atomic.StoreUint64(&a.slots[i].key, key)
	sh.n++
	t.counted(1)
	return slotRef{sh, a, i}
}

// has reports whether holder id is in the slot's holder set.
func (r slotRef) has(id int) bool {
	w, bit := id>>6, uint64(1)<<(id&63)
	return w < r.a.width() && atomic.LoadUint64(r.a.word(w, r.i))&bit != 0
}

// add puts holder id into the slot's holder set; the table must be wide
// enough for id.
func (r slotRef) add(id int) {
	atomic.OrUint64(r.a.word(id>>6, r.i), 1<<(id&63))
}

// touch sets the slot's clock to now.
func (r slotRef) touch(now uint32) {
	if r.a.clock(r.i) < now {
		atomic.StoreUint32(&r.a.slots[r.i].clock, now)
	}
}

// drop takes holder id out of the slot's holder set and deletes the key when
// no holder is left; it reports whether the key was deleted.
func (t *keyTable) drop(r slotRef, id int) bool {
	atomic.AndUint64(r.a.word(id>>6, r.i), ^uint64(1<<(id&63)))
	if t.held(r.a, r.i) {
		return false
	}
	t.bury(r)
	return true
}

// bury turns the slot of a key without holders into a tombstone.
func (t *keyTable) bury(r slotRef) {
	atomic.StoreUint64(&r.a.slots[r.i].key, deadKey)
	r.sh.n--
	r.sh.dead++
	t.counted(-1)
}

// dropHolder takes holder id, which stays live, out of the holder sets of
// the keys of lane map lm, deleting the keys left without holders, and
// empties lm. Like release, it looks the keys up in slot order (see
// slotOrder) or, when they are a large part of the table, sweeps the slots
// for the id's bit.
func (t *keyTable) dropHolder(lm *laneMap, id int) {
	if t.slots() <= t.sweepRatio*lm.n {
		lm.reset()
		t.sweep(id, true)
		return
	}
	for _, k := range t.slotOrder(lm.takeKeys()) {
		if r, ok := t.find(k); ok {
			t.drop(r, id)
		}
	}
}

// sweep visits, shard by shard, every slot of a key whose holder set has
// id's bit. With drop, it takes the id out of the holder set (see drop);
// without, the id was just released, and it counts the keys that have no
// live holder left, as dead, returning their number. Writer only.
func (t *keyTable) sweep(id int, drop bool) (orphaned int) {
	w, bit := id>>6, uint64(1)<<(id&63)
	for s := range t.shards {
		sh := &t.shards[s]
		a := sh.arr.Load()
		visit := func(i int) {
			if drop {
				t.drop(slotRef{sh, a, i}, id)
			} else if !t.held(a, i) {
				sh.orphan()
				orphaned++
			}
		}
		switch {
		case w >= a.width():
		case w == 0:
			// The first word of a holder set is in its slot: this loop,
			// which most sweeps run, reads one word a slot and calls
			// nothing for the slots without id's bit.
			slots := a.slots
			for i := range slots {
				if slots[i].holders&bit == 0 || slots[i].key <= deadKey {
					continue
				}
				if drop {
					visit(i)
				} else if !t.held(a, i) {
					sh.orphan()
					orphaned++
				}
			}
		default:
			for i, word := range a.more[w-1] {
				if word&bit != 0 && a.slots[i].key > deadKey {
					visit(i)
				}
			}
		}
	}
	return orphaned
}

// orphan counts a key of the shard that lost its last live holder as dead.
func (sh *keyShard) orphan() {
	sh.n--
	sh.dead++
}

// slotOrder copies the nonzero keys into scratch in the order of their slots
// (a key's shard and home slot both grow with its value), with a counting
// sort on their top bits, and returns them: visiting keys in that order keeps
// the accesses to each shard's arrays nearly sequential for the hardware
// prefetcher. scratch must have room for the nonzero keys and not overlap
// them.
func (t *keyTable) slotOrder(keys, scratch []uint64) []uint64 {
	shift := 64 - min(16, max(shardBits, bits.Len(uint(len(scratch)))))
	if n := 1<<(64-shift) + 1; cap(t.buckets) < n {
		t.buckets = make([]int32, n)
	}
	start := t.buckets[:1<<(64-shift)+1]
	clear(start)
	for _, k := range keys {
		if k != emptyKey {
			start[k>>shift+1]++
		}
	}
	for b := 1; b < len(start); b++ {
		start[b] += start[b-1]
	}
	n := int(start[len(start)-1])
	for _, k := range keys {
		if k != emptyKey {
			b := k >> shift
			scratch[start[b]] = k
			start[b]++
		}
	}
	return scratch[:n]
}

// release forgets holder id, whose lane map is lm, without writing to the
// slots, and empties lm: the id's bits stay in the slots, meaningless,
// until each shard is rebuilt, and the keys left with no live holder stay
// in their slots, counted as dead, unfound by readers' holder masks and
// revived if stored again. A released id is reused only once every shard
// has been rebuilt (see clean).
//
// It finds the keys left without a live holder one of two ways, whichever
// reads less: by looking up each of the lane's keys in slot order, or, when
// the lane holds a large part of the table, by sweeping every slot for the
// id's bit, which streams through memory without hashing or probing.
func (t *keyTable) release(lm *laneMap, id int) {
	t.live[id>>6] &^= 1 << (id & 63)
	t.stale[id] = 1<<numShards - 1
	orphaned := 0
	if t.slots() <= t.sweepRatio*lm.n {
		lm.reset()
		orphaned = t.sweep(id, false)
	} else {
		for _, k := range t.slotOrder(lm.takeKeys()) {
			if r, ok := t.find(k); ok && !t.held(r.a, r.i) {
				r.sh.orphan()
				orphaned++
			}
		}
	}
	t.counted(-orphaned)
}

// defaultSweepRatio is how many slots of the table release and dropHolder
// sweep at most per key of the lane, rather than looking up the lane's keys:
// a sweep streams through the slots at about a nanosecond each, while a
// lookup of a key among many that the lane does not hold misses the cache,
// some twenty times as long.
const defaultSweepRatio = 16

// slots is the number of slots of the table's shards.
func (t *keyTable) slots() int {
	n := 0
	for i := range t.shards {
		n += t.shards[i].arr.Load().cap()
	}
	return n
}

// setLive marks a holder id as belonging to a lane; the id must be clean.
func (t *keyTable) setLive(id int) {
	for len(t.live) <= id>>6 {
		t.live = append(t.live, 0)
	}
	t.live[id>>6] |= 1 << (id & 63)
}

// clean reports whether no slot has a bit of a released holder id.
func (t *keyTable) clean(id int) bool {
	_, stale := t.stale[id]
	return !stale
}

// scrub rebuilds the shards that may still have bits of a released id.
func (t *keyTable) scrub(id int) {
	for s := range numShards {
		if t.stale[id]&(1<<s) != 0 {
			t.rebuild(s, t.shards[s].arr.Load().cap())
		}
	}
}

// counted adds d to the key counts.
func (t *keyTable) counted(d int) {
	t.n += d
	t.count.Store(int64(t.n))
	t.total.Add(int64(d))
}

// rebuild moves shard s's keys that have a live holder, with only their
// live holders, into new arrays of the given capacity and the table's width,
// publishes them, and notes that the shard has no released holder's bits.
func (t *keyTable) rebuild(s, capacity int) *keySlots {
	sh := &t.shards[s]
	old := sh.arr.Load()
	a := newKeySlots(capacity, t.width)
	for j := range old.slots {
		k := old.slots[j].key
		if k == emptyKey || k == deadKey || !t.held(old, j) {
			continue
		}
		i := slotHome(k, capacity)
		for a.slots[i].key != emptyKey {
			if i++; i == capacity {
				i = 0
			}
		}
		a.slots[i] = keySlot{key: k, holders: old.slots[j].holders & t.live[0], clock: old.clock(j)}
		for w := range min(len(old.more), len(a.more)) {
			if w+1 < len(t.live) {
				a.more[w][i] = old.more[w][j] & t.live[w+1]
			}
		}
	}
	sh.arr.Store(a)
	sh.dead = 0
	for id, shards := range t.stale {
		if shards &^= 1 << s; shards == 0 {
			delete(t.stale, id)
		} else {
			t.stale[id] = shards
		}
	}
	return a
}

// shrink rebuilds shards that removals left mostly empty.
func (t *keyTable) shrink() {
	for i := range t.shards {
		sh := &t.shards[i]
		if underFull(sh.n, sh.arr.Load().cap()) {
			t.rebuild(i, capFor(sh.n))
		}
	}
}

// widen makes room for holder ids below 64*width.
func (t *keyTable) widen(width int) {
	if width <= t.width {
		return
	}
	t.width = width
	for i := range t.shards {
		t.rebuild(i, t.shards[i].arr.Load().cap())
	}
}

// narrow drops the holder-set words from word width on, which no live
// holder id reaches, rebuilding every shard; the rebuilds also clean every
// released id's bits.
func (t *keyTable) narrow(width int) {
	if width >= t.width {
		return
	}
	t.width = width
	t.live = t.live[:min(len(t.live), width)]
	for i := range t.shards {
		t.rebuild(i, t.shards[i].arr.Load().cap())
	}
}
