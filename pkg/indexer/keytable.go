package indexer

import (
	"math/bits"
	"runtime"
	"sync/atomic"
)

// The key table of a model maps each indexed key to the set of holders (lanes)
// that hold its block, and to the coarse time it was last stored or matched.
//
// It is split into shards by the top bits of the key. Each shard is an
// open-addressing table with linear probing and backward-shift deletion, laid
// out so that a lookup touches one cache line (see keySlots).
//
// One writer at a time (the model's mutex) mutates a shard; readers never
// lock. Every slot word is read and written with sync/atomic, and each shard
// has a sequence counter that the writer makes odd while it changes slots and
// even again after: a reader that sees the same even value before and after a
// lookup read a consistent slot. Growing builds new arrays aside and
// publishes them with one atomic pointer store, so readers are never blocked
// by a resize.

const (
	shardBits = 5
	numShards = 1 << shardBits
	// minSlots is the capacity of an empty shard or lane.
	minSlots = 8
)

// A table grows by a quarter when an insert would take it past 4/5 full, so
// that it stays between 64% and 80% full as it grows, and is
// rebuilt at half full when removals take it under 1/5.
func overFull(n, capacity int) bool  { return n*5 > capacity*4 }
func underFull(n, capacity int) bool { return capacity > minSlots && n*5 < capacity }
func grownCap(capacity int) int      { return capacity + capacity/4 }
func rebuiltCap(n int) int           { return max(minSlots, 2*n) }

// home is the first slot probed for a well-mixed hash h in a table of
// capacity slots.
func home(h uint64, capacity int) int {
	hi, _ := bits.Mul64(h, uint64(capacity))
	return int(hi)
}

// between reports whether h lies cyclically in (i, j].
func between(i, h, j int) bool {
	if i <= j {
		return i < h && h <= j
	}
	return i < h || h <= j
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
}

type keyShard struct {
	seq atomic.Uint64
	arr atomic.Pointer[keySlots]
	n   int
	_   [40]byte // keep shards on separate cache lines
}

// keySlots are the arrays of one shard. A slot keeps its key, the first
// word of its holder set (holders 0 to 63) and its clock together, so that a
// lookup touches one cache line; more[w-1][i] is word w of slot i's holder
// set when the table has more than 64 holders. A key of 0 marks an empty
// slot. Only the writer stores keys and holders; readers also store clocks,
// so every clock access is atomic.
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

func (t *keyTable) init(total *atomic.Int64) {
	t.width, t.total = 1, total
	for i := range t.shards {
		t.shards[i].arr.Store(newKeySlots(minSlots, 1))
	}
}

func shardOf(key uint64) int { return int(key >> (64 - shardBits)) }

// slotHome is where key's probe sequence starts; the shard bits are shifted
// out so that every shard spreads its keys over all its slots.
func slotHome(key uint64, capacity int) int { return home(key<<shardBits, capacity) }

// lookup copies the holder set of key into dst (len(dst) words; words the
// table does not have read as 0) and reports whether key is present. It
// refreshes the key's clock to now when it is older. It never blocks on a
// writer beyond the few stores of one slot update.
func (t *keyTable) lookup(key uint64, now uint32, dst []uint64) bool {
	sh := &t.shards[shardOf(key)]
	for spins := 0; ; spins++ {
		s1 := sh.seq.Load()
		if s1&1 != 0 {
			if spins&63 == 63 {
				runtime.Gosched()
			}
			continue
		}
		a := sh.arr.Load()
		i, ok := a.find(key)
		var c uint32
		if ok {
			for w := range dst {
				if w < a.width() {
					dst[w] = atomic.LoadUint64(a.word(w, i))
				} else {
					dst[w] = 0
				}
			}
			c = a.clock(i)
		}
		if sh.seq.Load() != s1 {
			continue
		}
		if ok && c < now {
			atomic.StoreUint32(&a.slots[i].clock, now)
		}
		return ok
	}
}

// prefetch loads the first slot of each key's probe sequence, so that the
// cache misses of a run of lookups overlap instead of following each other.
// The returned value is meaningless.
func (t *keyTable) prefetch(keys []uint64) uint64 {
	var sum uint64
	for _, k := range keys {
		a := t.shards[shardOf(k)].arr.Load()
		sum += atomic.LoadUint64(&a.slots[slotHome(k, a.cap())].key)
	}
	return sum
}

// find returns the slot of key, reading keys atomically.
func (a *keySlots) find(key uint64) (int, bool) {
	c := a.cap()
	for i := slotHome(key, c); ; {
		k := atomic.LoadUint64(&a.slots[i].key)
		if k == key {
			return i, true
		}
		if k == 0 {
			return i, false
		}
		if i++; i == c {
			i = 0
		}
	}
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

// insert adds key, which must be absent, with an empty holder set.
func (t *keyTable) insert(key uint64, now uint32) slotRef {
	sh := &t.shards[shardOf(key)]
	a := sh.arr.Load()
	if overFull(sh.n+1, a.cap()) {
		a = sh.rebuild(grownCap(a.cap()), t.width)
	}
	i, _ := a.find(key)
	sh.seq.Add(1)
	atomic.StoreUint32(&a.slots[i].clock, now)
	atomic.StoreUint64(&a.slots[i].key, key)
	sh.seq.Add(1)
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
	r.sh.seq.Add(1)
	atomic.OrUint64(r.a.word(id>>6, r.i), 1<<(id&63))
	r.sh.seq.Add(1)
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
	r.sh.seq.Add(1)
	defer r.sh.seq.Add(1)
	atomic.AndUint64(r.a.word(id>>6, r.i), ^uint64(1<<(id&63)))
	if !r.a.unheld(r.i) {
		return false
	}
	r.a.remove(r.i)
	r.sh.n--
	t.counted(-1)
	return true
}

// dropChunk bounds the updates a writer makes under one odd sequence value,
// and so how long a reader of the shard may wait.
const dropChunk = 64

// dropHolder takes holder id out of the holder sets of keys, deleting the
// keys left without holders. It works shard by shard, so that each shard's
// arrays stay in cache, and changes a shard's sequence once per chunk of
// updates instead of once per key. scratch, as long as keys, is overwritten.
func (t *keyTable) dropHolder(keys []uint64, id int, scratch []uint64) {
	var start [numShards + 1]int
	for _, k := range keys {
		start[shardOf(k)+1]++
	}
	for s := 1; s <= numShards; s++ {
		start[s] += start[s-1]
	}
	byShard := scratch
	next := start
	for _, k := range keys {
		s := shardOf(k)
		byShard[next[s]] = k
		next[s]++
	}
	w, bit := id>>6, uint64(1)<<(id&63)
	deleted := 0
	for s := range numShards {
		sh := &t.shards[s]
		a := sh.arr.Load()
		for batch := byShard[start[s]:start[s+1]]; len(batch) > 0; {
			chunk := batch[:min(len(batch), dropChunk)]
			batch = batch[len(chunk):]
			sh.seq.Add(1)
			for _, k := range chunk {
				i, ok := a.find(k)
				if !ok {
					continue
				}
				p := a.word(w, i)
				h := *p &^ bit
				atomic.StoreUint64(p, h)
				if h == 0 && a.unheld(i) {
					a.remove(i)
					sh.n--
					deleted++
				}
			}
			sh.seq.Add(1)
		}
	}
	t.counted(-deleted)
}

// unheld reports whether slot i has no holder; writer only.
func (a *keySlots) unheld(i int) bool {
	for w := range a.width() {
		if *a.word(w, i) != 0 {
			return false
		}
	}
	return true
}

// evict deletes the key in slot r whatever its holders.
func (t *keyTable) evict(r slotRef) {
	r.sh.seq.Add(1)
	r.a.remove(r.i)
	r.sh.seq.Add(1)
	r.sh.n--
	t.counted(-1)
}

// counted adds d to the key counts.
func (t *keyTable) counted(d int) {
	t.n += d
	t.count.Store(int64(t.n))
	t.total.Add(int64(d))
}

// remove empties slot i by backward-shift deletion. The caller holds the
// shard's sequence odd.
func (a *keySlots) remove(i int) {
	c := a.cap()
	for j := i; ; {
		if j++; j == c {
			j = 0
		}
		k := a.slots[j].key
		if k == 0 {
			break
		}
		if between(i, slotHome(k, c), j) {
			continue
		}
		a.store(i, k, a.clock(j), j)
		i = j
	}
	a.store(i, 0, 0, -1)
}

// store writes key and clock into slot i with the holder set of slot from,
// or an empty one when from is -1.
func (a *keySlots) store(i int, key uint64, clock uint32, from int) {
	atomic.StoreUint64(&a.slots[i].key, key)
	atomic.StoreUint32(&a.slots[i].clock, clock)
	for w := range a.width() {
		var h uint64
		if from >= 0 {
			h = *a.word(w, from)
		}
		atomic.StoreUint64(a.word(w, i), h)
	}
}

// rebuild moves the shard into new arrays of the given capacity and width
// and publishes them.
func (sh *keyShard) rebuild(capacity, width int) *keySlots {
	old := sh.arr.Load()
	a := newKeySlots(capacity, width)
	for j := range old.slots {
		k := old.slots[j].key
		if k == 0 {
			continue
		}
		i := slotHome(k, capacity)
		for a.slots[i].key != 0 {
			if i++; i == capacity {
				i = 0
			}
		}
		a.slots[i] = keySlot{key: k, holders: old.slots[j].holders, clock: old.clock(j)}
		for w := range old.more {
			a.more[w][i] = old.more[w][j]
		}
	}
	sh.seq.Add(1)
	sh.arr.Store(a)
	sh.seq.Add(1)
	return a
}

// shrink rebuilds shards that removals left mostly empty.
func (t *keyTable) shrink() {
	for i := range t.shards {
		sh := &t.shards[i]
		if c := sh.arr.Load().cap(); underFull(sh.n, c) {
			sh.rebuild(rebuiltCap(sh.n), t.width)
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
		sh := &t.shards[i]
		sh.rebuild(sh.arr.Load().cap(), width)
	}
}
