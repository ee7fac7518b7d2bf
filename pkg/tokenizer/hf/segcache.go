package hf

import (
	"math/rand/v2"
	"sync"

	"github.com/zeebo/xxh3"
)

// DefaultSegmentCacheBytes bounds the memory of a Tokenizer's segment
// cache.
const DefaultSegmentCacheBytes = 4 << 20

// segmentOverhead is what an entry of the segment cache takes besides its
// ids, in bytes, at most: its slot in a map (41 bytes, in a map between
// 7/16 and 7/8 full) and the rounding of its array of ids to its
// allocation's size.
const segmentOverhead = 128

// segmentBytes is what an entry of ids is charged against the budget.
func segmentBytes(ids []uint32) int { return 4*cap(ids) + segmentOverhead }

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
// current one. Each entry is charged its ids, 4 bytes each, and
// segmentOverhead: the memory held never exceeds the budget.
type segmentCache struct {
	seed      uint64
	mu        sync.Mutex
	cur, prev map[xxh3.Uint128][]uint32
	curBytes  int
	half      int
}

func newSegmentCache(maxBytes int) *segmentCache {
	return &segmentCache{seed: rand.Uint64(), cur: map[xxh3.Uint128][]uint32{}, half: maxBytes / 2}
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
	if 4*len(ids)+segmentOverhead > c.half {
		return
	}
	own := make([]uint32, len(ids))
	copy(own, ids)
	c.mu.Lock()
	c.add(k, own)
	c.mu.Unlock()
}

// add stores ids under k in the current generation. The new one starts
// empty, rather than the size of the one before, so that its map takes
// the room of the entries it holds.
func (c *segmentCache) add(k xxh3.Uint128, ids []uint32) {
	n := segmentBytes(ids)
	if c.curBytes+n > c.half {
		c.prev, c.cur, c.curBytes = c.cur, map[xxh3.Uint128][]uint32{}, 0
	}
	c.cur[k] = ids
	c.curBytes += n
}
