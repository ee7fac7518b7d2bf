package routing

import (
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

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
// inflight.PodLoad.SetRemoteBlocks).
//
// An attempt is remembered as its route's keys, on its pod's list, from
// when it opens to when it closes: recording and forgetting it cost no
// work per block. Because keys chain, an attempt shares a prompt's first n
// blocks exactly when their keys agree up to n, which a bisection finds. At
// most max blocks (the attempts' keys, counted per attempt) are remembered;
// an attempt that would exceed it is not recorded, and counted. A match
// costs a comparison per attempt in flight on the candidates, and a
// bisection per attempt that shares more of the prompt than those before.
type inFlightPrefixes struct {
	max int

	mu sync.RWMutex
	// pods has the attempts recorded on each pod, in no order.
	pods map[*inflight.PodLoad][]attempt
	// blocks counts the keys of the attempts recorded.
	blocks int
	// dropped counts attempts not recorded for lack of room.
	dropped atomic.Int64
}

// attempt is an attempt recorded, with its route's keys.
type attempt struct {
	h    *inflight.Handle
	keys []uint64
}

func newInFlightPrefixes(max int) *inFlightPrefixes {
	return &inFlightPrefixes{max: max, pods: map[*inflight.PodLoad][]attempt{}}
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
		b = appendTokens(b, tokens[i:i+blockSize])
		parent = xxh3.Hash(b)
		dst = append(dst, parent)
	}
	*buf = b
	return dst
}

// littleEndian reports whether the machine stores integers least
// significant byte first, as the keys' input does.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// appendTokens appends toks to b, each as 4 bytes, little-endian. Where
// the machine is little-endian, that is the tokens' memory as it is.
func appendTokens(b []byte, toks []uint32) []byte {
	if littleEndian && len(toks) > 0 {
		return append(b, unsafe.Slice((*byte)(unsafe.Pointer(&toks[0])), 4*len(toks))...)
	}
	return appendTokensByteByByte(b, toks)
}

// appendTokensByteByByte is appendTokens on any machine.
func appendTokensByteByByte(b []byte, toks []uint32) []byte {
	for _, t := range toks {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	return b
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
	if f.blocks+len(rt.PromptBlocks) > f.max {
		f.dropped.Add(1)
		return
	}
	f.pods[rt.Pod] = append(f.pods[rt.Pod], attempt{h, rt.PromptBlocks})
	f.blocks += len(rt.PromptBlocks)
}

// remove forgets the blocks of attempt h, if add recorded them.
func (f *inFlightPrefixes) remove(h *inflight.Handle) {
	pod := h.Route().Pod
	if pod == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	as := f.pods[pod]
	i := slices.IndexFunc(as, func(a attempt) bool { return a.h == h })
	if i < 0 {
		return
	}
	f.blocks -= len(as[i].keys)
	as[i] = as[len(as)-1]
	as[len(as)-1] = attempt{}
	if as = as[:len(as)-1]; len(as) == 0 {
		delete(f.pods, pod)
	} else {
		f.pods[pod] = as
	}
}

// len returns the number of blocks remembered, counted per attempt.
func (f *inFlightPrefixes) len() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.blocks
}

// match sets, for each candidate, InFlightMatchedBlocks: how many leading
// blocks of keys attempts in flight on its pod hold, this gateway's or, as
// the pod's load record last heard, other replicas'.
func (f *inFlightPrefixes) match(cs []Candidate, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	for j := range cs {
		c := &cs[j]
		n := 0
		for _, a := range f.pods[c.load] {
			if n = max(n, sharedBlocks(a.keys, keys, n)); n == len(keys) {
				break
			}
		}
		if n < len(keys) && c.load.HasRemoteBlocks() {
			n = remoteLeading(c.load, keys, n)
		}
		c.InFlightMatchedBlocks = n
	}
}

// sharedBlocks returns how many leading keys a and b share when that is
// more than atLeast, and atLeast otherwise. Keys chain, so they agree up to
// some length and differ from there on: one comparison tells an attempt
// that cannot share more, and a bisection finds the length.
func sharedBlocks(a, b []uint64, atLeast int) int {
	n := min(len(a), len(b))
	if atLeast >= n || a[atLeast] != b[atLeast] {
		return atLeast
	}
	// a and b agree below lo and differ at hi (n stands for past the end).
	lo, hi := atLeast+1, n
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if a[mid] == b[mid] {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// remoteLeading returns how many leading blocks of keys other replicas'
// attempts hold on pod, given that the first from are held. A replica's
// record of a pod is closed under prefixes (each attempt's keys in prompt
// order, see snapshot), so whether a key is held falls from true to false
// once along keys: remoteLeading gallops then bisects to find where.
func remoteLeading(pod *inflight.PodLoad, keys []uint64, from int) int {
	lo, hi := from, len(keys)
	for step := 1; lo < len(keys); step *= 2 {
		probe := min(lo+step-1, len(keys)-1)
		if !pod.RemoteBlock(keys[probe]) {
			hi = probe
			break
		}
		lo = probe + 1
	}
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if pod.RemoteBlock(keys[mid]) {
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
	seen := make(map[uint64][]*inflight.PodLoad, min(f.blocks, max))
	n := 0
	for pod, as := range f.pods {
		id := pod.ID()
		for _, a := range as {
			for _, k := range a.keys {
				if slices.Contains(seen[k], pod) {
					continue
				}
				if n == max {
					return out, true
				}
				seen[k] = append(seen[k], pod)
				out[id] = append(out[id], k)
				n++
			}
		}
	}
	return out, false
}
