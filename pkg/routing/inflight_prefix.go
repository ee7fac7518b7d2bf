package routing

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/pkg/inflight"
)

// DefaultMaxInFlightPrefixBlocks bounds the prompt blocks the Router
// remembers for attempts in flight (see inFlightPrefixes).
const DefaultMaxInFlightPrefixBlocks = 1 << 20

// inFlightPrefixes remembers, per pod, the prompt blocks of the attempts
// the gateway sent there and has not seen close. The engine computes such
// a prompt before any request sent after it (vLLM schedules first come,
// first served) and keeps its blocks while the request runs, so a later
// request sharing its prefix will find that prefix cached on the pod, even
// though the index learns of it only when the prefill ends: under load, many
// seconds after routing. kv-aware credits a pod with the longer of what the
// index reports and what is in flight there.
//
// Blocks are keyed by a chain of hashes of their tokens (block i's key
// hashes block i-1's key and its own tokens), rooted in the model and the
// LoRA adapter, so that equal keys mean equal prefixes. An attempt's blocks
// are added when it opens and removed when it closes. At most max distinct
// blocks are remembered; an attempt that would exceed it is not recorded,
// and counted.
type inFlightPrefixes struct {
	seed maphash.Seed
	max  int

	mu     sync.RWMutex
	blocks map[uint64][]podRef
	// attempts are the attempts recorded.
	attempts map[*inflight.Handle]struct{}
	// dropped counts attempts not recorded for lack of room.
	dropped atomic.Int64
}

// podRef counts the attempts on one pod holding a block.
type podRef struct {
	pod *inflight.PodLoad
	n   int32
}

func newInFlightPrefixes(max int) *inFlightPrefixes {
	return &inFlightPrefixes{seed: maphash.MakeSeed(), max: max, blocks: map[uint64][]podRef{},
		attempts: map[*inflight.Handle]struct{}{}}
}

// keys appends to dst the keys of the whole blocks of tokens, of blockSize
// tokens each, under model and lora, and returns the extended slice. buf is
// scratch space.
func (f *inFlightPrefixes) keys(dst []uint64, buf *[]byte, model, lora string, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	var h maphash.Hash
	h.SetSeed(f.seed)
	h.WriteString(model)
	h.WriteByte(0)
	h.WriteString(lora)
	parent := h.Sum64()
	b := *buf
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		b = binary.LittleEndian.AppendUint64(b[:0], parent)
		for _, t := range tokens[i : i+blockSize] {
			b = binary.LittleEndian.AppendUint32(b, t)
		}
		parent = maphash.Bytes(f.seed, b)
		dst = append(dst, parent)
	}
	*buf = b
	return dst
}

// add records the blocks of attempt h (its route's PromptBlocks) as held
// on its pod, unless that would exceed the bound.
func (f *inFlightPrefixes) add(h *inflight.Handle) {
	rt := h.Route()
	if rt.Pod == nil || len(rt.PromptBlocks) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.blocks)+len(rt.PromptBlocks) > f.max {
		f.dropped.Add(1)
		return
	}
	f.attempts[h] = struct{}{}
	for _, k := range rt.PromptBlocks {
		refs := f.blocks[k]
		found := false
		for i := range refs {
			if refs[i].pod == rt.Pod {
				refs[i].n++
				found = true
				break
			}
		}
		if !found {
			f.blocks[k] = append(refs, podRef{pod: rt.Pod, n: 1})
		}
	}
}

// remove forgets the blocks of attempt h, if add recorded them.
func (f *inFlightPrefixes) remove(h *inflight.Handle) {
	rt := h.Route()
	if rt.Pod == nil || len(rt.PromptBlocks) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.attempts[h]; !ok {
		return
	}
	delete(f.attempts, h)
	for _, k := range rt.PromptBlocks {
		refs := f.blocks[k]
		for i := range refs {
			if refs[i].pod != rt.Pod {
				continue
			}
			if refs[i].n--; refs[i].n <= 0 {
				refs[i] = refs[len(refs)-1]
				refs = refs[:len(refs)-1]
			}
			break
		}
		if len(refs) == 0 {
			delete(f.blocks, k)
		} else {
			f.blocks[k] = refs
		}
	}
}

// len returns the number of distinct blocks remembered.
func (f *inFlightPrefixes) len() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.blocks)
}

// match sets, for each candidate, InFlightMatchedBlocks: how many leading
// blocks of keys attempts in flight on its pod hold.
func (f *inFlightPrefixes) match(cs []Candidate, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if len(f.blocks) == 0 {
		return
	}
	alive := len(cs)
	for i := range keys {
		refs := f.blocks[keys[i]]
		if len(refs) == 0 {
			return
		}
		for j := range cs {
			c := &cs[j]
			if c.InFlightMatchedBlocks != i {
				continue
			}
			for _, r := range refs {
				if r.pod == c.load {
					c.InFlightMatchedBlocks++
					break
				}
			}
			if c.InFlightMatchedBlocks == i {
				alive--
			}
		}
		if alive == 0 {
			return
		}
	}
}
