package hf

import (
	"math/rand/v2"
	"sync"

	"github.com/zeebo/xxh3"
)

// DefaultSegmentCacheTokens bounds the token ids a Tokenizer's segment
// cache holds: 4 MiB of them.
const DefaultSegmentCacheTokens = 1 << 20

// minCachedSegment is the shortest segment worth a cache entry: shorter
// ones encode about as fast as they hash.
const minCachedSegment = 64

// segmentCache remembers the ids of the text segments between added tokens,
// which encode independently of one another. A chat prompt is mostly
// segments seen in earlier turns (each message sits between the template's
// special tokens), so a new turn encodes only its new messages.
//
// It keeps two generations of entries: new entries go to the current one,
// and when it holds half the budget it becomes the previous one, replacing
// the older; a hit in the previous generation moves the entry to the
// current one. The token ids held never exceed the budget.
type segmentCache struct {
	seed      uint64
	mu        sync.Mutex
	cur, prev map[xxh3.Uint128][]uint32
	curTokens int
	half      int
}

func newSegmentCache(maxTokens int) *segmentCache {
	return &segmentCache{seed: rand.Uint64(), cur: map[xxh3.Uint128][]uint32{}, half: maxTokens / 2}
}

// key digests a segment; first marks the first segment of a text, which
// some pre-tokenizers treat apart.
func (c *segmentCache) key(seg string, first bool) xxh3.Uint128 {
	seed := c.seed
	if first {
		seed ^= 1
	}
	return xxh3.HashString128Seed(seg, seed)
}

func (c *segmentCache) get(k xxh3.Uint128) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ids, ok := c.cur[k]; ok {
		return ids, true
	}
	ids, ok := c.prev[k]
	if ok {
		delete(c.prev, k)
		c.add(k, ids)
	}
	return ids, ok
}

// put stores a copy of ids under k.
func (c *segmentCache) put(k xxh3.Uint128, ids []uint32) {
	if len(ids) > c.half {
		return
	}
	own := append([]uint32(nil), ids...)
	c.mu.Lock()
	c.add(k, own)
	c.mu.Unlock()
}

func (c *segmentCache) add(k xxh3.Uint128, ids []uint32) {
	if c.curTokens+len(ids) > c.half {
		c.prev, c.cur, c.curTokens = c.cur, make(map[xxh3.Uint128][]uint32, len(c.cur)), 0
	}
	c.cur[k] = ids
	c.curTokens += len(ids)
}
