package tokenizer

import (
	"maps"
	"sync"
)

// result is one tokenization: vLLM's token ids and the model's context
// length. tokens is shared by every caller and must not be modified.
type result struct {
	tokens      []uint32
	maxModelLen int
}

// entry is a cached result on the recency list.
type entry struct {
	key        digest
	res        result
	prev, next *entry
}

// call is a tokenization in flight. done is closed once res and err are set.
type call struct {
	done chan struct{}
	res  result
	err  error
}

// entryOverhead is what an entry takes besides its ids, in bytes, at
// most: the entry itself (64), its share of the map (25 to 60 bytes once
// built, up to twice that before it is built again, see remove) and the
// rounding of a small array of ids to its allocation's size.
// TestCacheStaysWithinItsBudget checks it on the heap.
const entryOverhead = 192

// entryBytes is what an entry of ids is charged against the budget.
func entryBytes(ids []uint32) int { return 4*cap(ids) + entryOverhead }

// cache is an LRU cache of results bounded by the bytes they take, and
// the registry of calls in flight, so that concurrent identical misses share
// one call. One mutex guards both: deciding between hit, join and lead is a
// single step.
type cache struct {
	mu       sync.Mutex
	entries  map[digest]*entry
	inflight map[digest]*call
	root     entry // sentinel: root.next is the most recently used entry
	tokens   int
	bytes    int
	maxBytes int
	removed  int // deletions from entries since it was built
	m        *metrics
}

func newCache(maxBytes int, m *metrics) *cache {
	c := &cache{
		entries:  map[digest]*entry{},
		inflight: map[digest]*call{},
		maxBytes: maxBytes,
		m:        m,
	}
	c.root.next, c.root.prev = &c.root, &c.root
	return c
}

// acquire looks key up. On a hit it returns the cached result and hit true.
// Otherwise it returns the call to wait for, creating it when none is in
// flight, in which case leader is true and the caller must complete it.
func (c *cache) acquire(key digest) (res result, cl *call, leader, hit bool) {
	c.mu.Lock()
	if e, ok := c.entries[key]; ok {
		c.unlink(e)
		c.pushFront(e)
		res = e.res
		c.mu.Unlock()
		c.m.hits.Inc()
		return res, nil, false, true
	}
	cl, ok := c.inflight[key]
	if !ok {
		cl = &call{done: make(chan struct{})}
		c.inflight[key] = cl
	}
	c.mu.Unlock()
	c.m.misses.Inc()
	return result{}, cl, !ok, false
}

// peekFirst returns the cached result of the first of keys the cache
// holds, counting nothing, under one hold of the lock.
func (c *cache) peekFirst(keys []digest) (result, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, key := range keys {
		if e, ok := c.entries[key]; ok {
			c.unlink(e)
			c.pushFront(e)
			return e.res, true
		}
	}
	return result{}, false
}

// complete ends cl with res or err, caches a successful result, and wakes
// the callers waiting for it.
func (c *cache) complete(key digest, cl *call, res result, err error) {
	cl.res, cl.err = res, err
	c.mu.Lock()
	delete(c.inflight, key)
	if err == nil {
		c.store(key, res)
	}
	c.mu.Unlock()
	close(cl.done)
}

// store adds res under key, evicting the least recently used entries until
// the total fits. Only the call that completes key stores it, so key is not
// cached yet. An empty result is not stored, nor one larger than the whole
// cache.
func (c *cache) store(key digest, res result) {
	n := entryBytes(res.tokens)
	if len(res.tokens) == 0 || n > c.maxBytes {
		return
	}
	for c.bytes+n > c.maxBytes {
		c.remove(c.root.prev)
		c.m.evictions.Inc()
	}
	e := &entry{key: key, res: res}
	c.entries[key] = e
	c.pushFront(e)
	c.tokens += len(res.tokens)
	c.bytes += n
	c.setGauges()
}

// remove deletes e. A Go map keeps some of the slots deletions free: under
// the churn of evictions one grows to a dozen slots per entry. So the map
// is built again once a quarter of its entries were deleted, which costs
// four insertions per deletion, in bursts.
func (c *cache) remove(e *entry) {
	c.unlink(e)
	delete(c.entries, e.key)
	c.removed++
	if c.removed > len(c.entries)/4+64 {
		fresh := make(map[digest]*entry, len(c.entries))
		maps.Copy(fresh, c.entries)
		c.entries, c.removed = fresh, 0
	}
	c.tokens -= len(e.res.tokens)
	c.bytes -= entryBytes(e.res.tokens)
	c.setGauges()
}

func (c *cache) setGauges() {
	c.m.cachedTokens.Set(float64(c.tokens))
	c.m.cachedBytes.Set(float64(c.bytes))
	c.m.cachedEntries.Set(float64(len(c.entries)))
}

func (c *cache) unlink(e *entry) {
	e.prev.next = e.next
	e.next.prev = e.prev
}

func (c *cache) pushFront(e *entry) {
	e.prev = &c.root
	e.next = c.root.next
	c.root.next.prev = e
	c.root.next = e
}
