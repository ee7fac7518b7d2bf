package indexer

import "sync/atomic"

// A lane is what one engine publisher holds in one medium and one KV-cache
// group: (pod, DP rank, medium, group). It is a holder of the model's key
// table, with a dense holder id, and it owns the map from the engine's block
// hashes to kvgate keys for the blocks it holds. That map is both how events
// naming engine hashes (a parent, a removal) find their keys and the record
// of the lane's residencies: every entry has the lane's bit set in its key's
// holder set, and nothing else does. A key may have several entries (see
// laneMap.alias); its residency lasts until the last of them goes.
type lane struct {
	id     int
	stream *stream
	medium string
	group  int
	m      laneMap
	// blocks is m.blocks() as of the last event, eviction or release that
	// changed it, for readers that take no lock.
	blocks atomic.Int64
	// blockSize is the number of tokens of the lane's blocks. Only the
	// writer stores it.
	blockSize atomic.Int64
}

// publish makes the lane's size visible to readers that take no lock.
func (ln *lane) publish() { ln.blocks.Store(int64(ln.m.blocks())) }

// laneMap maps engine block hashes to kvgate keys: an open-addressing table
// with linear probing and backward-shift deletion, used by the model's writer
// only. A key of 0 marks an empty slot, so any engine hash can be stored.
//
// Several hashes may map to one key: an engine that restarted with another
// hash seed without its stream being reset names the blocks it stores again
// by new hashes, and an engine whose events leave out inputs its hashes
// include (older vLLM sends no extra keys) names blocks that look alike to
// the index by different hashes. Every name of a key stays until it is
// deleted, so that the engine's later events can name the block by any of
// them, and the key's residency goes with its last name. aliases counts,
// for the keys with more than one name, the names beyond the first, at most
// maxNamesPerBlock-1.
//
// Engine hashes come from outside: old engines draw them from small
// integers, and a hostile one can choose them. They are placed by a keyed
// mix of the table's secret (salt), so that no choice of hashes made without
// the secret piles them onto one probe sequence.
type laneMap struct {
	// w holds the slots, two words each: w[2i] is the engine hash of slot
	// i and w[2i+1] its key, so that a probe reads one cache line.
	w []uint64
	// n is the number of entries, names included; extra is the sum of
	// aliases, so that the map holds n-extra keys.
	n, extra int
	aliases  map[uint64]int32
	salt     laneSalt
}

// laneSalt is the secret that places engine hashes in lane maps: two words
// drawn from the table's secret, one in each operand of the mix.
type laneSalt [2]uint64

// between reports whether h lies cyclically in (i, j].
func between(i, h, j int) bool {
	if i <= j {
		return i < h && h <= j
	}
	return i < h || h <= j
}

// home is the first slot probed for an engine hash in a map of capacity
// slots.
func (s laneSalt) home(hash uint64, capacity int) int {
	return home(mum(hash^s[0], s[1]), capacity)
}

// slots is the map's capacity.
func (m *laneMap) slots() int { return len(m.w) / 2 }

// hash and key are those of slot i; key is 0 for an empty slot.
func (m *laneMap) hash(i int) uint64 { return m.w[2*i] }
func (m *laneMap) key(i int) uint64  { return m.w[2*i+1] }

func (m *laneMap) set(i int, hash, key uint64) { m.w[2*i], m.w[2*i+1] = hash, key }

// slot returns the slot of hash, or the empty slot that ends its probe
// sequence.
func (m *laneMap) slot(hash uint64) (int, bool) {
	c := m.slots()
	if c == 0 {
		return 0, false
	}
	for i := m.salt.home(hash, c); ; {
		if m.w[2*i+1] == 0 {
			return i, false
		}
		if m.w[2*i] == hash {
			return i, true
		}
		if i++; i == c {
			i = 0
		}
	}
}

// blocks is the number of keys the map holds: the lane's residencies.
func (m *laneMap) blocks() int { return m.n - m.extra }

// get returns the key stored for hash.
func (m *laneMap) get(hash uint64) (uint64, bool) {
	i, ok := m.slot(hash)
	if !ok {
		return 0, false
	}
	return m.key(i), true
}

// add maps hash, which m does not hold, to key. at is where slot said the
// probe sequence of hash ends, or -1 when m may have changed since.
func (m *laneMap) add(at int, hash, key uint64) {
	if at < 0 || m.slots() == 0 || overFull(m.n+1, m.slots()) {
		if m.slots() == 0 || overFull(m.n+1, m.slots()) {
			m.rebuild(capFor(m.n + 1))
		}
		at, _ = m.slot(hash)
	}
	m.set(at, hash, key)
	m.n++
}

// alias maps hash, which m does not hold, to key, which m holds under
// other hashes. at is as for add.
func (m *laneMap) alias(at int, hash, key uint64) {
	m.add(at, hash, key)
	if m.aliases == nil {
		m.aliases = make(map[uint64]int32)
	}
	m.aliases[key]++
	m.extra++
}

// del removes hash and returns the key it mapped to; last reports whether
// that was the key's last name.
func (m *laneMap) del(hash uint64) (key uint64, last, ok bool) {
	i, ok := m.slot(hash)
	if !ok {
		return 0, false, false
	}
	key = m.key(i)
	m.deleteAt(i)
	if underFull(m.n, m.slots()) {
		m.rebuild(capFor(m.n))
	}
	return key, !m.unname(key), true
}

// unname accounts for a deleted name of key and reports whether key has
// names left.
func (m *laneMap) unname(key uint64) bool {
	if m.extra == 0 {
		return false
	}
	c, ok := m.aliases[key]
	if !ok {
		return false
	}
	if c--; c == 0 {
		delete(m.aliases, key)
	} else {
		m.aliases[key] = c
	}
	m.extra--
	return true
}

// deleteAt empties slot i, moving back the entries after it whose probe
// sequence passes through it (backward-shift deletion). It moves entries
// only from after the hole, up to the next empty slot.
func (m *laneMap) deleteAt(i int) {
	c := m.slots()
	for j := i; ; {
		if j++; j == c {
			j = 0
		}
		if m.key(j) == 0 {
			break
		}
		if between(i, m.salt.home(m.hash(j), c), j) {
			continue
		}
		m.set(i, m.hash(j), m.key(j))
		i = j
	}
	m.set(i, 0, 0)
	m.n--
}

// removeKeys removes the entries whose key is in s, every name of each key,
// and returns how many keys went. It deletes in place, in one pass over the
// slots that starts at an empty one: no run of entries crosses the pass's
// start, so an entry that a deletion moves back lands where the pass looks
// again, and every entry is looked at once.
func (m *laneMap) removeKeys(s *keySet) int {
	if m.n == 0 {
		return 0
	}
	c, start := m.slots(), 0
	for m.key(start) != 0 {
		start++
	}
	n := 0
	for i, seen := start, 0; seen < c; {
		if k := m.key(i); k != 0 && s.has(k) {
			m.deleteAt(i)
			if !m.unname(k) {
				n++
			}
			continue
		}
		seen++
		if i++; i == c {
			i = 0
		}
	}
	if underFull(m.n, c) {
		m.rebuild(capFor(m.n))
	}
	return n
}

// rebuild moves the entries into new slots of the given capacity.
func (m *laneMap) rebuild(capacity int) {
	old := *m
	m.w = make([]uint64, 2*capacity)
	for j := range old.slots() {
		k := old.key(j)
		if k == 0 {
			continue
		}
		i := m.salt.home(old.hash(j), capacity)
		for m.key(i) != 0 {
			if i++; i == capacity {
				i = 0
			}
		}
		m.set(i, old.hash(j), k)
	}
}

// takeKeys empties the map and returns its keys, each once, in the map's
// own memory, with as much room after them: the keys and scratch of a
// release of the lane (see keyTable.release).
func (m *laneMap) takeKeys() (keys, scratch []uint64) {
	// Slot j's key is at 2j+1, past every word written before it.
	n := 0
	for j := range m.slots() {
		if k := m.key(j); k != 0 && !m.unname(k) {
			m.w[n] = k
			n++
		}
	}
	keys, scratch = m.w[:n:n], m.w[n:2*n]
	*m = laneMap{salt: m.salt}
	return keys, scratch
}

// reset drops every entry and the slots.
func (m *laneMap) reset() { *m = laneMap{salt: m.salt} }
