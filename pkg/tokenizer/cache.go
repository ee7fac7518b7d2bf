package tokenizer

import "sync"

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

// cache is an LRU cache of results bounded by their total token count, and
// the registry of calls in flight, so that concurrent identical misses share
// one call. One mutex guards both: deciding between hit, join and lead is a
// single step.
type cache struct {
	mu        sync.Mutex
	entries   map[digest]*entry
	inflight  map[digest]*call
	root      entry // sentinel: root.next is the most recently used entry
	tokens    int
	maxTokens int
	m         *metrics
}

func newCache(maxTokens int, m *metrics) *cache {
	c := &cache{
		entries:   map[digest]*entry{},
		inflight:  map[digest]*call{},
		maxTokens: maxTokens,
		m:         m,
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

// peek returns the cached result of key, counting nothing.
func (c *cache) peek(key digest) (result, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return result{}, false
	}
	c.unlink(e)
	c.pushFront(e)
	return e.res, true
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
// cached yet. An empty result is not stored, so that the token budget also
// bounds the number of entries; nor is one larger than the whole cache.
func (c *cache) store(key digest, res result) {
	n := len(res.tokens)
	if n == 0 || n > c.maxTokens {
		return
	}
	for c.tokens+n > c.maxTokens {
		c.remove(c.root.prev)
		c.m.evictions.Inc()
	}
	e := &entry{key: key, res: res}
	c.entries[key] = e
	c.pushFront(e)
	c.tokens += n
	c.m.cachedTokens.Set(float64(c.tokens))
	c.m.cachedEntries.Set(float64(len(c.entries)))
}

func (c *cache) remove(e *entry) {
	c.unlink(e)
	delete(c.entries, e.key)
	c.tokens -= len(e.res.tokens)
	c.m.cachedTokens.Set(float64(c.tokens))
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
