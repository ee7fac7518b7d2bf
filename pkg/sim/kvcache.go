package sim

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// KVCacheConfig configures a KVCache.
type KVCacheConfig struct {
	// NumBlocks is the number of physical blocks, vLLM's num_gpu_blocks. One
	// of them is reserved (vLLM's null block), so at least 2 are needed.
	NumBlocks int
	// BlockSize is the number of tokens per block.
	BlockSize int
	// HashSeed seeds the engine's block hash chains (vLLM's NONE_HASH).
	HashSeed string
	// Events makes the cache record KV-cache events for TakeEvents.
	Events bool
}

// LoRA names the adapter a request runs with. vLLM mixes the adapter's name
// into every block hash, so the same tokens under different adapters never
// share cache blocks.
type LoRA struct {
	// Name is the adapter's served name.
	Name string
	// ID is the engine's integer id for the adapter, 1 or more.
	ID int
}

// ErrBlocksInUse is returned by ResetPrefixCache while any request holds
// blocks.
var ErrBlocksInUse = errors.New("blocks are still in use")

// KVCache is the paged KV cache of one engine: vLLM's KVCacheManager over a
// BlockPool for a single full-attention group, with prefix caching and
// KV-cache events. It is a plain data structure: it knows no time, runs no
// goroutines, and is not safe for concurrent use.
//
// A request's state lives in a Sequence; the caller drives it through the
// calls vLLM's scheduler makes: ComputedBlocks and AllocateSlots when it
// schedules the request, Append for each sampled token, Free when it
// finishes or is preempted. Events accumulate until TakeEvents.
type KVCache struct {
	pool      blockPool
	blockSize int
	hasher    *blockHasher
	events    []kvevent.KVEvent
	record    bool
}

// NewKVCache returns an empty cache: every block but the reserved one free
// and nothing cached.
func NewKVCache(cfg KVCacheConfig) (*KVCache, error) {
	if cfg.NumBlocks < 2 {
		return nil, fmt.Errorf("kv cache needs at least 2 blocks, got %d", cfg.NumBlocks)
	}
	if cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("kv cache block size must be positive, got %d", cfg.BlockSize)
	}
	return &KVCache{
		pool:      newBlockPool(cfg.NumBlocks),
		blockSize: cfg.BlockSize,
		hasher:    newBlockHasher(cfg.HashSeed, cfg.BlockSize),
		record:    cfg.Events,
	}, nil
}

// BlockSize reports the number of tokens per block.
func (c *KVCache) BlockSize() int { return c.blockSize }

// NumBlocks reports the number of physical blocks, the reserved one included.
func (c *KVCache) NumBlocks() int { return len(c.pool.blocks) }

// NumFreeBlocks reports how many blocks no request holds, cached ones
// included.
func (c *KVCache) NumFreeBlocks() int { return c.pool.numFree }

// Usage reports the fraction of usable blocks that requests hold, between 0
// and 1: vLLM's kv_cache_usage_perc.
func (c *KVCache) Usage() float64 {
	usable := len(c.pool.blocks) - 1
	return 1 - float64(c.pool.numFree)/float64(usable)
}

// NewSequence returns the state of a request whose tokens so far are tokens
// (copied), run with adapter lora (nil for the base model). It holds no
// blocks.
func (c *KVCache) NewSequence(tokens []uint32, lora *LoRA) *Sequence {
	s := &Sequence{hasher: c.hasher, tokens: append([]uint32(nil), tokens...)}
	if lora != nil {
		l := *lora
		s.lora = &l
		s.hashExtra = []byte(l.Name)
		s.eventExtra = msgpackStrArray(l.Name)
	}
	s.digests = c.hasher.appendDigests(nil, s.tokens, s.hashExtra)
	return s
}

// ComputedBlocks returns how many leading blocks of s vLLM would take from
// the prefix cache: the longest run of cached full blocks, but never the
// block holding the last token, which vLLM always recomputes to get logits.
// It changes nothing.
func (c *KVCache) ComputedBlocks(s *Sequence) int {
	limit := min((len(s.tokens)-1)/c.blockSize, len(s.digests))
	return c.leadingCached(s.digests[:limit])
}

// CachedPrefixBlocks returns how many leading full blocks of tokens, run with
// adapter lora, the cache holds right now. It changes nothing, and hashes
// no block past the first one the cache lacks.
func (c *KVCache) CachedPrefixBlocks(tokens []uint32, lora *LoRA) int {
	var extra []byte
	if lora != nil {
		extra = []byte(lora.Name)
	}
	n := 0
	c.hasher.chain(c.hasher.root, 0, tokens, extra, func(d digest) bool {
		if c.pool.lookup(d) == noBlock {
			return false
		}
		n++
		return true
	})
	return n
}

func (c *KVCache) leadingCached(ds []digest) int {
	for i, d := range ds {
		if c.pool.lookup(d) == noBlock {
			return i
		}
	}
	return len(ds)
}

// AllocateSlots gives s the blocks it needs to compute numNewTokens more
// tokens, like vLLM's allocate_slots, and reports whether it could; on false
// nothing changed.
//
// computed is the number of tokens of s already computed (0 unless s is
// running). hitBlocks is what ComputedBlocks returned for s, to be reused
// from the prefix cache; it must be 0 when s holds blocks. The hit blocks
// are taken first (so they cannot be evicted by this allocation), then new
// blocks are popped from the head of the free queue, evicting what they
// cached (one BlockRemoved each). Finally every block that the scheduled
// tokens fill is cached and announced in one BlockStored event.
func (c *KVCache) AllocateSlots(s *Sequence, computed, hitBlocks, numNewTokens int) bool {
	bs := c.blockSize
	total := computed + hitBlocks*bs + numNewTokens
	toAllocate := max((total+bs-1)/bs-len(s.blocks)-hitBlocks, 0)
	evictable := 0
	for _, d := range s.digests[:hitBlocks] {
		if c.pool.blocks[c.mustLookup(d)].ref == 0 {
			evictable++
		}
	}
	if toAllocate+evictable > c.pool.numFree {
		return false
	}
	for _, d := range s.digests[:hitBlocks] {
		id := c.mustLookup(d)
		if c.pool.blocks[id].ref == 0 {
			c.pool.unlink(id)
		}
		c.pool.blocks[id].ref++
		s.blocks = append(s.blocks, id)
	}
	s.numCachedBlocks += hitBlocks
	for range toAllocate {
		s.blocks = append(s.blocks, c.popFree())
	}
	c.cacheFullBlocks(s, min(total, len(s.tokens)))
	return true
}

func (c *KVCache) mustLookup(d digest) int32 {
	id := c.pool.lookup(d)
	if id == noBlock {
		panic("sim: AllocateSlots with more hit blocks than ComputedBlocks returned")
	}
	return id
}

// popFree takes the block at the head of the free queue, evicting its cached
// content.
func (c *KVCache) popFree() int32 {
	id := c.pool.head
	c.pool.unlink(id)
	b := &c.pool.blocks[id]
	if c.pool.uncache(id) && c.record {
		// One allocation for the event and its one-hash slice.
		r := &struct {
			ev   kvevent.BlockRemovedEvent
			hash [1]kvevent.BlockHash
		}{hash: [1]kvevent.BlockHash{b.digest.blockHash()}}
		r.ev = kvevent.BlockRemovedEvent{BlockHashes: r.hash[:], Medium: kvevent.MediumGPU, GroupIdx: 0}
		c.events = append(c.events, &r.ev)
	}
	b.ref = 1
	return id
}

// cacheFullBlocks caches the blocks of s that the first numTokens tokens
// fill and that are not cached yet: vLLM's cache_full_blocks.
func (c *KVCache) cacheFullBlocks(s *Sequence, numTokens int) {
	from, to := s.numCachedBlocks, numTokens/c.blockSize
	if to <= from {
		return
	}
	for i := from; i < to; i++ {
		c.pool.cache(s.blocks[i], s.digests[i])
	}
	s.numCachedBlocks = to
	if c.record {
		c.events = append(c.events, s.storedEvent(from, to))
	}
}

// Free releases the blocks of s, last block first, so that the tail of a
// finished request is evicted before its head (which other requests are
// more likely to share). Cached blocks stay cached until evicted.
func (c *KVCache) Free(s *Sequence) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		id := s.blocks[i]
		b := &c.pool.blocks[id]
		b.ref--
		if b.ref == 0 {
			c.pool.pushTail(id)
		}
	}
	s.blocks = s.blocks[:0]
	s.numCachedBlocks = 0
}

// ResetPrefixCache forgets every cached block and records AllBlocksCleared.
// Like vLLM it refuses, returning an error wrapping ErrBlocksInUse, while
// any request holds blocks.
func (c *KVCache) ResetPrefixCache() error {
	if used := len(c.pool.blocks) - 1 - c.pool.numFree; used > 0 {
		return fmt.Errorf("reset prefix cache: %d %w", used, ErrBlocksInUse)
	}
	c.pool.clearCache()
	if c.record {
		c.events = append(c.events, &kvevent.AllBlocksClearedEvent{})
	}
	return nil
}

// TakeEvents returns the events recorded since the last call, in the order
// they happened, and hands them to the caller. Their timestamps are unset:
// the engine stamps them with the time of the batch that carries them.
func (c *KVCache) TakeEvents() []kvevent.KVEvent {
	ev := c.events
	c.events = nil
	return ev
}
