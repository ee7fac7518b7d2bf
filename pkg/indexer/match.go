package indexer

import (
	"cmp"
	"slices"
)

// MatchResult is the answer of MatchPrefix. MatchPrefix overwrites every
// field; a caller that reuses one MatchResult per goroutine lets MatchPrefix
// run without allocating once its slices have grown.
type MatchResult struct {
	// BlockSize is the model's primary block size, in tokens: the one most
	// of its engines use (the smaller of equals); 0 when the index has no
	// block of the model. Each pod is matched at its own engines' block
	// size (PodMatch.BlockSize), which is this one unless the model's
	// engines use several.
	BlockSize int
	// PromptBlocks is the number of whole blocks of BlockSize in the
	// prompt.
	PromptBlocks int
	// Pods has one entry per candidate pod, in the order of the candidates.
	Pods []PodMatch

	units   []matchUnit
	runs    []rankRuns
	masks   []uint64
	holders []uint64
	// seen is the holder set of the last block step checked.
	seen   []uint64
	walker walker
}

// PodMatch is how much of a prompt's prefix one candidate pod holds.
type PodMatch struct {
	// Pod is the candidate's pod key.
	Pod string
	// BlockSize is the block size, in tokens, the pod's run was counted
	// in: its engines' (the one of the longest run if its engines use
	// several); 0 when the index holds nothing of the pod.
	BlockSize int
	// Blocks is the number of leading blocks of the prompt the pod holds,
	// each in some medium (GPU, CPU, storage), on one DP rank: the rank
	// with the longest run. Tokens is Blocks times BlockSize.
	Blocks int
	Tokens int
	// GPUTokens is the number of leading tokens the pod holds in GPU
	// memory on one rank, the rank with the longest GPU run, and GPUBlocks
	// their number of whole blocks of BlockSize: the GPU run in blocks,
	// unless the pod's engines use several block sizes.
	GPUBlocks int
	GPUTokens int
	// Rank is the data-parallel rank (as the index's streams number them,
	// Stream.Rank) holding the pod's longest run: of equal runs, the one
	// with the longer GPU run, then the lower rank; 0 when the pod holds
	// none of the prefix. OtherRankBlocks is the longest run among the
	// pod's other ranks, in whole blocks of BlockSize: a pod whose Blocks
	// exceed it has one rank that holds more of the prefix than any other.
	Rank            int
	OtherRankBlocks int
}

// rankRuns is, during credit, the longest run of one pod's best rank so
// far, in tokens (any medium and GPU), and the longest run of its other
// ranks.
type rankRuns struct {
	tokens, gpu, other int
	set                bool
}

// matchUnit is one rank of one candidate pod, at one block size, during a
// match; its holder sets are masks[off:off+width] (any medium) and
// masks[off+width:off+2*width] (GPU).
type matchUnit struct {
	state            *podState
	pod              int
	rank             int
	blockSize        int
	off              int
	anyLen, gpuLen   int
	anyDone, gpuDone bool
}

// BlockSize reports a model's primary block size, in tokens: the one most
// of the engines holding its blocks use in their primary KV-cache group, as
// learned from their BlockStored events; false when no engine holds a block
// of the model.
func (t *SyncPrefixHashTable) BlockSize(model string) (int, bool) {
	m := t.model(model)
	if m == nil {
		return 0, false
	}
	bs := m.pods.Load().primary
	return bs, bs > 0
}

// MatchPrefix reports, for each candidate pod, how many leading blocks of a
// prompt it holds: the prompt's tokens are chunked into whole blocks of the
// block size of the pod's engines and keyed as the events were, under the
// root of model and lora (the adapter name, "" for the base model). A pod is
// credited with block i only if the same rank of the pod holds blocks 0 to
// i. The walk at a block size stops at the first block no remaining
// candidate of that size holds. Unknown models and pods get zero matches.
// out is overwritten; see MatchResult.
func (t *SyncPrefixHashTable) MatchPrefix(model, lora string, tokens []uint32, pods []string, out *MatchResult) {
	out.reset(pods)
	m := t.model(model)
	if m == nil {
		return
	}
	idx := m.pods.Load()
	if idx.primary == 0 {
		return
	}
	out.BlockSize, out.PromptBlocks = idx.primary, len(tokens)/idx.primary
	start := t.now()
	if sizes := out.collectUnits(idx, pods); sizes > 0 {
		now := t.tick(start)
		m.use(now)
		units := out.units
		if sizes > 1 {
			slices.SortStableFunc(units, func(a, b matchUnit) int { return cmp.Compare(a.blockSize, b.blockSize) })
		}
		for len(units) > 0 {
			n := 1
			for n < len(units) && units[n].blockSize == units[0].blockSize {
				n++
			}
			out.walk(m, &t.keyer, lora, tokens, units[:n], now)
			units = units[n:]
		}
		out.credit(sizes > 1, start.UnixNano())
	}
	t.metrics.matchSeconds.Observe(t.now().Sub(start).Seconds())
}

func (out *MatchResult) reset(pods []string) {
	out.BlockSize, out.PromptBlocks = 0, 0
	out.Pods = out.Pods[:0]
	for _, p := range pods {
		out.Pods = append(out.Pods, PodMatch{Pod: p})
	}
	out.units, out.masks = out.units[:0], out.masks[:0]
}

// collectUnits gathers the ranks and block sizes of the candidates that
// hold anything, and returns how many block sizes they have (0 for no
// unit, 2 for two or more).
func (out *MatchResult) collectUnits(idx *podIndex, pods []string) (sizes int) {
	w := idx.width
	for i, p := range pods {
		ph := idx.pods[p]
		if ph == nil {
			continue
		}
		for _, u := range ph.units {
			out.units = append(out.units, matchUnit{state: ph.state, pod: i, rank: u.rank, blockSize: u.blockSize, off: len(out.masks)})
			out.masks = append(out.masks, u.any...)
			out.masks = append(out.masks, u.gpu...)
		}
	}
	if cap(out.holders) < w {
		out.holders, out.seen = make([]uint64, w), make([]uint64, w)
	}
	out.holders, out.seen = out.holders[:w], out.seen[:w]
	if len(out.units) == 0 {
		return 0
	}
	if len(idx.sizes) > 1 {
		for _, u := range out.units[1:] {
			if u.blockSize != out.units[0].blockSize {
				return 2
			}
		}
	}
	return 1
}

// walkBatch is how many blocks a walk keys and prefetches at a time. It keys
// one batch ahead of its lookups, so that the slots of a batch arrive while
// the walk hashes the next one. The first block is looked up alone: a miss
// there costs one block's keying.
const walkBatch = 16

// walker is the state of one walk: the keys of the batch being looked up and
// of the next one, and their slots to prefetch.
type walker struct {
	keys   *keyTable
	keyer  *keyer
	tokens []uint32
	bs     int
	key    uint64
	cur    [walkBatch]uint64
	next   [walkBatch]uint64
	slots  [walkBatch]*keySlot
}

// fill keys the blocks [from, from+len(dst)) into dst, chaining from w.key,
// and prefetches their slots.
func (w *walker) fill(dst []uint64, from int) {
	bs, key := w.bs, w.key
	for j := range dst {
		b := from + j
		key = w.keyer.block(key, w.tokens[b*bs:(b+1)*bs], 0)
		dst[j] = key
		w.slots[j] = w.keys.homeSlot(key)
	}
	w.key = key
	prefetchSlots(w.slots[:len(dst)])
}

// release drops the walker's references to the prompt and the table, so that
// a MatchResult kept between matches does not keep old slot arrays alive.
func (w *walker) release() {
	w.keys, w.keyer, w.tokens = nil, nil, nil
	clear(w.slots[:])
}

// walk keys the prompt block by block at the block size of units, which
// share it, and follows each unit's runs until no unit is left.
func (out *MatchResult) walk(m *modelTable, k *keyer, lora string, tokens []uint32, units []matchUnit, now uint32) {
	bs, n := units[0].blockSize, out.PromptBlocks
	if bs != out.BlockSize {
		n = len(tokens) / bs
	}
	alive := len(units)
	w := &out.walker
	w.keys, w.tokens, w.bs = &m.keys, tokens, bs
	w.keyer, w.key = k, k.root(m.name, lora)
	i := 0
	if n > 0 {
		w.fill(w.cur[:1], 0)
		if m.keys.lookup(w.cur[0], now, out.holders) {
			alive = out.step(units, 0, alive)
			copy(out.seen, out.holders)
			i = 1
		} else {
			alive = 0
		}
	}
	curN := 0
	if alive > 0 {
		curN = min(walkBatch, n-i)
		w.fill(w.cur[:curN], i)
	}
walk:
	for curN > 0 {
		nextN := min(walkBatch, n-i-curN)
		w.fill(w.next[:nextN], i+curN)
		for _, key := range w.cur[:curN] {
			if !m.keys.lookup(key, now, out.holders) {
				break walk
			}
			// Runs end only where the holder set changes: a block held
			// as the previous one was leaves every running unit running.
			if !slices.Equal(out.holders, out.seen) {
				alive = out.step(units, i, alive)
				copy(out.seen, out.holders)
			}
			i++
			if alive == 0 {
				break walk
			}
		}
		w.cur, curN = w.next, nextN
	}
	w.release()
	for u := range units {
		un := &units[u]
		if !un.anyDone {
			un.anyLen = i
		}
		if !un.gpuDone {
			un.gpuLen = i
		}
	}
}

// step ends the runs of the running units, units[:alive], that do not hold
// block i, whose holder set is in out.holders. It moves the units it ends
// behind the running ones and returns how many still run.
func (out *MatchResult) step(units []matchUnit, i, alive int) int {
	h, w := out.holders, len(out.holders)
	for u := 0; u < alive; {
		un := &units[u]
		if !intersects(h, out.masks[un.off:un.off+w]) {
			un.anyDone, un.anyLen = true, i
			if !un.gpuDone {
				un.gpuDone, un.gpuLen = true, i
			}
			alive--
			units[u], units[alive] = units[alive], units[u]
			continue
		}
		if !un.gpuDone && !intersects(h, out.masks[un.off+w:un.off+2*w]) {
			un.gpuDone, un.gpuLen = true, i
		}
		u++
	}
	return alive
}

// credit turns unit runs into per-pod results, keeping each pod's longest
// runs in tokens and the rank holding the longest, and records the match
// as activity of the credited pods. mixed says that the units have more
// than one block size.
func (out *MatchResult) credit(mixed bool, nowNanos int64) {
	ranked := false
	for _, un := range out.units {
		p := &out.Pods[un.pod]
		if mixed {
			if tokens := un.anyLen * un.blockSize; tokens > p.Tokens || p.BlockSize == 0 {
				p.BlockSize, p.Blocks, p.Tokens = un.blockSize, un.anyLen, tokens
			}
			p.GPUTokens = max(p.GPUTokens, un.gpuLen*un.blockSize)
		} else {
			p.BlockSize = un.blockSize
			p.Blocks = max(p.Blocks, un.anyLen)
			p.GPUBlocks = max(p.GPUBlocks, un.gpuLen)
		}
		if un.anyLen > 0 {
			if !ranked {
				out.resetRuns()
				ranked = true
			}
			out.runs[un.pod].add(p, un.rank, un.anyLen*un.blockSize, un.gpuLen*un.blockSize)
			un.state.matched(nowNanos)
		}
	}
	for i := range out.Pods {
		p := &out.Pods[i]
		if !mixed {
			p.Tokens, p.GPUTokens = p.Blocks*p.BlockSize, p.GPUBlocks*p.BlockSize
		} else if p.BlockSize > 0 {
			p.GPUBlocks = p.GPUTokens / p.BlockSize
		}
		if ranked && out.runs[i].other > 0 {
			p.OtherRankBlocks = out.runs[i].other / p.BlockSize
		}
	}
}

// resetRuns makes out.runs one empty entry per pod.
func (out *MatchResult) resetRuns() {
	if cap(out.runs) < len(out.Pods) {
		out.runs = make([]rankRuns, len(out.Pods))
	}
	out.runs = out.runs[:len(out.Pods)]
	clear(out.runs)
}

// add counts a run of rank, tokens long in any medium and gpu in GPU
// memory, keeping in p.Rank the rank of the longest run (then of the
// longest GPU run, then the lowest) and in r.other the longest run of the
// pod's other ranks. A rank may have runs at several block sizes; runs of
// no block are not counted.
func (r *rankRuns) add(p *PodMatch, rank, tokens, gpu int) {
	switch {
	case !r.set:
		r.set, p.Rank, r.tokens, r.gpu = true, rank, tokens, gpu
	case tokens > r.tokens || tokens == r.tokens && (gpu > r.gpu || gpu == r.gpu && rank < p.Rank):
		if rank != p.Rank {
			// The old best is the longest of the runs so far, all
			// of which are now of other ranks or shorter.
			r.other = max(r.other, r.tokens)
		}
		p.Rank, r.tokens, r.gpu = rank, tokens, gpu
	case rank != p.Rank:
		r.other = max(r.other, tokens)
	}
}

func intersects(a, b []uint64) bool {
	if len(a) == 1 {
		return a[0]&b[0] != 0
	}
	for i, x := range a {
		if x&b[i] != 0 {
			return true
		}
	}
	return false
}
