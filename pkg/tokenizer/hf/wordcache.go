package hf

import (
	"math/rand/v2"
	"sync/atomic"
)

// Bounds of the word cache.
const (
	// wordCacheSlots is the number of words the cache holds at most.
	wordCacheSlots = 1 << 16
	// maxCachedWord is the longest word cached, in bytes.
	maxCachedWord = 64
)

// wordCache remembers the ids of the words the BPE merges produced: text
// repeats its words, and a lookup costs far less than the merges. It is a
// direct-mapped table: a word has one slot, chosen by its hash, and a new
// word takes the slot from the one there before. Lookups take no lock.
type wordCache struct {
	seed  uint64
	slots []atomic.Pointer[wordEntry]
}

type wordEntry struct {
	word string
	ids  []uint32
}

func newWordCache() *wordCache {
	return &wordCache{seed: rand.Uint64(), slots: make([]atomic.Pointer[wordEntry], wordCacheSlots)}
}

// slot picks a word's slot with a seeded FNV-1a over its bytes, cheap for
// words of a few bytes; the seed keeps texts from aiming at one slot.
func (c *wordCache) slot(word string) *atomic.Pointer[wordEntry] {
	h := c.seed ^ 14695981039346656037
	for i := 0; i < len(word); i++ {
		h ^= uint64(word[i])
		h *= 1099511628211
	}
	h ^= h >> 29
	return &c.slots[h&(wordCacheSlots-1)]
}

func (c *wordCache) get(word string) ([]uint32, bool) {
	if e := c.slot(word).Load(); e != nil && e.word == word {
		return e.ids, true
	}
	return nil, false
}

// put stores ids, which the cache owns from then on, under a copy of word.
func (c *wordCache) put(word string, ids []uint32) {
	c.slot(word).Store(&wordEntry{word: string([]byte(word)), ids: ids})
}
