package sim

// noBlock terminates the block lists threaded through kvBlock.
const noBlock int32 = -1

// kvBlock is one physical KV-cache block of a blockPool.
type kvBlock struct {
	// ref counts the sequences holding the block. A block with ref 0 is in
	// the free queue; if it is also cached it is an eviction candidate.
	ref int32
	// prev and next link the free queue while ref is 0.
	prev, next int32
	// dupNext links the blocks cached under the same digest, in the order
	// they were cached.
	dupNext int32
	// cached reports that digest names the block's content and the block is
	// reachable from blockPool.cached.
	cached bool
	digest digest
}

// blockPool is vLLM's BlockPool for one full-attention KV-cache group: a
// fixed array of blocks, a free queue in eviction order, and the map from
// digest to the cached blocks holding that content.
//
// The free queue is a doubly linked list threaded through the blocks.
// Allocation pops from its head; a freed block goes to its tail; a cached
// free block that a new request hits is unlinked from wherever it is. So the
// head is always the least recently freed block, which is what vLLM evicts.
type blockPool struct {
	blocks []kvBlock
	// head and tail of the free queue, noBlock when it is empty.
	head, tail int32
	numFree    int
	// cached maps a digest to the first block cached under it. Like vLLM,
	// the pool does not deduplicate: a running request, which never looks
	// the cache up again, that fills a block another request cached since
	// caches its own copy (see dupNext).
	cached map[digest]int32
}

// nullBlock is block 0, which vLLM reserves as a placeholder and never
// hands out, so an engine with N blocks caches at most N-1.
const nullBlock int32 = 0

func newBlockPool(numBlocks int) blockPool {
	p := blockPool{
		blocks: make([]kvBlock, numBlocks),
		head:   noBlock,
		tail:   noBlock,
		cached: make(map[digest]int32),
	}
	for i := range p.blocks {
		p.blocks[i].dupNext = noBlock
		p.pushTail(int32(i))
	}
	p.unlink(nullBlock)
	return p
}

// pushTail appends block id to the free queue.
func (p *blockPool) pushTail(id int32) {
	b := &p.blocks[id]
	b.prev, b.next = p.tail, noBlock
	if p.tail == noBlock {
		p.head = id
	} else {
		p.blocks[p.tail].next = id
	}
	p.tail = id
	p.numFree++
}

// unlink removes block id from the free queue.
func (p *blockPool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev == noBlock {
		p.head = b.next
	} else {
		p.blocks[b.prev].next = b.next
	}
	if b.next == noBlock {
		p.tail = b.prev
	} else {
		p.blocks[b.next].prev = b.prev
	}
	b.prev, b.next = noBlock, noBlock
	p.numFree--
}

// lookup returns the block to reuse for digest d, or noBlock. Among copies
// it returns the one cached first, as vLLM does.
func (p *blockPool) lookup(d digest) int32 {
	if id, ok := p.cached[d]; ok {
		return id
	}
	return noBlock
}

// cache records that block id holds the content named by d.
func (p *blockPool) cache(id int32, d digest) {
	b := &p.blocks[id]
	b.digest, b.cached, b.dupNext = d, true, noBlock
	first, ok := p.cached[d]
	if !ok {
		p.cached[d] = id
		return
	}
	for p.blocks[first].dupNext != noBlock {
		first = p.blocks[first].dupNext
	}
	p.blocks[first].dupNext = id
}

// uncache forgets that block id holds cached content and reports whether it
// did: false for a block that was not cached.
func (p *blockPool) uncache(id int32) bool {
	b := &p.blocks[id]
	if !b.cached {
		return false
	}
	b.cached = false
	first := p.cached[b.digest]
	if first == id {
		if b.dupNext == noBlock {
			delete(p.cached, b.digest)
		} else {
			p.cached[b.digest] = b.dupNext
		}
	} else {
		prev := first
		for p.blocks[prev].dupNext != id {
			prev = p.blocks[prev].dupNext
		}
		p.blocks[prev].dupNext = b.dupNext
	}
	b.dupNext = noBlock
	return true
}

// clearCache forgets every cached block.
func (p *blockPool) clearCache() {
	clear(p.cached)
	for i := range p.blocks {
		p.blocks[i].cached = false
		p.blocks[i].dupNext = noBlock
	}
}
