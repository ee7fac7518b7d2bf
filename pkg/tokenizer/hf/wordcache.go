package hf

import (
	"strings"
	"sync"
)

// Bounds of the word cache.
const (
	// wordCacheShards spreads the cache over locks.
	wordCacheShards = 64
	// wordCacheWords bounds the words the cache holds; a shard that is
	// full is emptied.
	wordCacheWords = 1 << 16
	// maxCachedWord is the longest word cached, in bytes.
	maxCachedWord = 64
)

// wordCache remembers the ids of the words the BPE merges produced: text
// repeats its words, and a lookup costs far less than the merges.
type wordCache struct {
	shards [wordCacheShards]struct {
		mu sync.RWMutex
		m  map[string][]uint32
	}
}

func newWordCache() *wordCache {
	c := &wordCache{}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
	}
	return c
}

// shard picks a word's shard with FNV-1a over its bytes.
func shard(word string) int {
	h := uint32(2166136261)
	for i := 0; i < len(word); i++ {
		h ^= uint32(word[i])
		h *= 16777619
	}
	return int(h % wordCacheShards)
}

func (c *wordCache) get(word string) ([]uint32, bool) {
	s := &c.shards[shard(word)]
	s.mu.RLock()
	ids, ok := s.m[word]
	s.mu.RUnlock()
	return ids, ok
}

// put stores ids, which the cache owns from then on, under a copy of word.
func (c *wordCache) put(word string, ids []uint32) {
	s := &c.shards[shard(word)]
	s.mu.Lock()
	if len(s.m) >= wordCacheWords/wordCacheShards {
		clear(s.m)
	}
	s.m[strings.Clone(word)] = ids
	s.mu.Unlock()
}
