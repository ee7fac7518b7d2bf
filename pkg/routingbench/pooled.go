package routingbench

import (
	"encoding/binary"
	"hash/maphash"

	"github.com/kvgate/kvgate/pkg/sim"
)

// PooledBound is the yardstick of a workload's token prefix-hit ratio: the
// hit ratio of one LRU cache of blocks as large as all the fleet's caches
// together, which every request reaches, as if every engine could read
// every other's cache. A routing policy approaches it by keeping each
// prefix on as few engines as its load allows. It bounds what placement
// achieves in practice, not in theory: separate LRU caches can beat one
// large one when a partition isolates requests whose blocks are never
// reused from those that are.
//
// The pooled cache sees each request at its arrival, looks its prompt up
// (whole blocks, never the block holding the prompt's last token, as vLLM
// does) and then holds the request's blocks, touched last block first (as
// vLLM frees them, so that a prefix outlives what follows it), those of
// the tokens the engines will generate included (sim.GeneratedTokens:
// engines cache decode-filled blocks, and a conversation's next turn
// reuses them). Blocks become reusable at once, where an engine can reuse
// them only once it has computed them, and they take no space while
// requests run. Both favour the bound.
type PooledBound struct {
	// Blocks is the pooled cache's size: every engine's usable blocks.
	Blocks int `json:"blocks"`
	// PromptTokens and CachedTokens sum the prompt tokens of the requests
	// and those the pooled cache held; HitRatio is their ratio.
	PromptTokens int64   `json:"promptTokens"`
	CachedTokens int64   `json:"cachedTokens"`
	HitRatio     float64 `json:"hitRatio"`
	// hits holds each request's cached tokens, in workload order.
	hits []int
}

// NewPooledBound computes the bound for w on cfg's fleet, which it defaults.
// It fails when cfg is invalid.
func NewPooledBound(cfg Config, w *Workload) (*PooledBound, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	return pooledBound(cfg, w), nil
}

// pooledBound computes the bound for w on cfg's fleet; cfg is normalized.
func pooledBound(cfg Config, w *Workload) *PooledBound {
	bs := cfg.Engine.BlockSize
	b := &PooledBound{Blocks: cfg.Engines * (cfg.Engine.NumGPUBlocks - 1), hits: make([]int, len(w.Requests))}
	lru := newBlockLRU(b.Blocks)
	seed := maphash.MakeSeed()
	var keys []uint64
	var buf []byte
	for i := range w.Requests {
		r := &w.Requests[i]
		// The sequence the engine caches: the prompt and every generated
		// token but the last, whose KV is never computed.
		seq := r.Prompt
		if r.OutputTokens > 1 {
			seq = append(seq[:len(seq):len(seq)], sim.GeneratedTokens(cfg.Engine.OutputSeed, r.Prompt, 0, r.OutputTokens-1)...)
		}
		keys = keys[:0]
		var h maphash.Hash
		h.SetSeed(seed)
		for start := 0; start+bs <= len(seq); start += bs {
			buf = buf[:0]
			for _, t := range seq[start : start+bs] {
				buf = binary.LittleEndian.AppendUint32(buf, t)
			}
			h.Write(buf)
			keys = append(keys, h.Sum64())
		}
		hit := 0
		for _, k := range keys[:min((len(r.Prompt)-1)/bs, len(keys))] {
			if !lru.has(k) {
				break
			}
			hit++
		}
		b.hits[i] = hit * bs
		b.PromptTokens += int64(len(r.Prompt))
		b.CachedTokens += int64(hit * bs)
		for j := len(keys) - 1; j >= 0; j-- {
			lru.touch(keys[j])
		}
	}
	if b.PromptTokens > 0 {
		b.HitRatio = float64(b.CachedTokens) / float64(b.PromptTokens)
	}
	return b
}

// blockLRU is a set of block keys of bounded size that evicts the least
// recently touched key.
type blockLRU struct {
	capacity int
	nodes    []lruNode
	index    map[uint64]int32
	head     int32 // most recent, -1 when empty
	tail     int32 // least recent
}

type lruNode struct {
	key        uint64
	prev, next int32
}

func newBlockLRU(capacity int) *blockLRU {
	return &blockLRU{capacity: capacity, index: make(map[uint64]int32), head: -1, tail: -1}
}

func (l *blockLRU) has(k uint64) bool {
	_, ok := l.index[k]
	return ok
}

// touch makes k the most recent key, adding it and evicting the least
// recent one when full.
func (l *blockLRU) touch(k uint64) {
	if l.capacity <= 0 {
		return
	}
	if n, ok := l.index[k]; ok {
		l.unlink(n)
		l.pushFront(n)
		return
	}
	var n int32
	if len(l.nodes) < l.capacity {
		n = int32(len(l.nodes))
		l.nodes = append(l.nodes, lruNode{})
	} else {
		n = l.tail
		l.unlink(n)
		delete(l.index, l.nodes[n].key)
	}
	l.nodes[n].key = k
	l.index[k] = n
	l.pushFront(n)
}

func (l *blockLRU) unlink(n int32) {
	nd := &l.nodes[n]
	if nd.prev >= 0 {
		l.nodes[nd.prev].next = nd.next
	} else {
		l.head = nd.next
	}
	if nd.next >= 0 {
		l.nodes[nd.next].prev = nd.prev
	} else {
		l.tail = nd.prev
	}
}

func (l *blockLRU) pushFront(n int32) {
	nd := &l.nodes[n]
	nd.prev, nd.next = -1, l.head
	if l.head >= 0 {
		l.nodes[l.head].prev = n
	}
	l.head = n
	if l.tail < 0 {
		l.tail = n
	}
}
