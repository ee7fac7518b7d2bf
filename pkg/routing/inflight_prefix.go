package routing

import (
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"

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
// LoRA adapter, so that equal keys mean equal prefixes. The hash (XXH3,
// unseeded) is the same in every process, so that gateway replicas can
// share the keys of their attempts (see Router.InFlightBlocks and
// inflight.PodLoad.SetRemoteBlocks). An attempt's blocks are added when it
// opens and removed when it closes. At most max distinct blocks are
// remembered; an attempt that would exceed it is not recorded, and counted.
type inFlightPrefixes struct {
	max int

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
	return &inFlightPrefixes{max: max, blocks: map[uint64][]podRef{},
		attempts: map[*inflight.Handle]struct{}{}}
}

// keys appends to dst the keys of the whole blocks of tokens, of blockSize
// tokens each, under model and lora, and returns the extended slice. buf is
// scratch space.
func (f *inFlightPrefixes) keys(dst []uint64, buf *[]byte, model, lora string, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	b := append((*buf)[:0], model...)
	b = append(b, 0)
	b = append(b, lora...)
	parent := xxh3.Hash(b)
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		b = binary.LittleEndian.AppendUint64(b[:0], parent)
		for _, t := range tokens[i : i+blockSize] {
			b = binary.LittleEndian.AppendUint32(b, t)
		}
		parent = xxh3.Hash(b)
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
// blocks of keys attempts in flight on its pod hold, this gateway's or, as
// the pod's load record last heard, other replicas'.
//
// What a pod holds is closed under prefixes: a key names a block and every
// block before it (keys chain), and an attempt records all its prompt's
// blocks, as does a replica's snapshot, each attempt's in prompt order. So
// whether a pod holds keys[i] falls from true to false once along keys, and
// match finds where for each candidate by galloping then bisecting: a few
// probes a candidate, where a scan of the keys would take one a block.
func (f *inFlightPrefixes) match(cs []Candidate, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	remote := false
	for j := range cs {
		remote = remote || cs[j].load.HasRemoteBlocks()
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if !remote && len(f.blocks[keys[0]]) == 0 {
		return
	}
	for j := range cs {
		c := &cs[j]
		c.InFlightMatchedBlocks = f.leading(c.load, keys)
	}
}

// leading returns how many leading blocks of keys attempts in flight on
// pod hold; f.mu is read-held.
func (f *inFlightPrefixes) leading(pod *inflight.PodLoad, keys []uint64) int {
	holds := func(i int) bool {
		k := keys[i]
		for _, r := range f.blocks[k] {
			if r.pod == pod {
				return true
			}
		}
		return pod.RemoteBlock(k)
	}
	// Gallop: held below lo, not held at hi (len(keys) stands for past
	// the end).
	lo, hi := 0, len(keys)
	for step := 1; lo < len(keys); step *= 2 {
		probe := min(lo+step-1, len(keys)-1)
		if !holds(probe) {
			hi = probe
			break
		}
		lo = probe + 1
	}
	// Bisect [lo, hi): the first block not held.
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if holds(mid) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// snapshot returns, per pod, the distinct keys of the blocks its recorded
// attempts hold, each attempt's in prompt order, at most max in all; it
// reports whether some were left out for lack of room.
func (f *inFlightPrefixes) snapshot(max int) (map[string][]uint64, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := map[string][]uint64{}
	seen := make(map[uint64][]*inflight.PodLoad, min(len(f.blocks), max))
	n, truncated := 0, false
	for h := range f.attempts {
		if truncated {
			break
		}
		rt := h.Route()
		id := rt.Pod.ID()
		for _, k := range rt.PromptBlocks {
			if slices.Contains(seen[k], rt.Pod) {
				continue
			}
			if n == max {
				truncated = true
				break
			}
			seen[k] = append(seen[k], rt.Pod)
			out[id] = append(out[id], k)
			n++
		}
	}
	return out, truncated
}
