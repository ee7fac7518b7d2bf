package sim

import (
	"slices"
	"testing"
	"unicode/utf8"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

func FuzzTokenizerEncode(f *testing.F) {
	for _, s := range []string{"", "Hello, world", "<|im_start|>user\nhi<|im_end|>\n", " <s></s><unk>", "héllo  wörld\t42", "\xff\xfe<|im"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		ids := Tokenizer{}.Encode(text, false)
		if len(ids) > len(text) {
			t.Fatalf("%d ids for %d bytes: a piece is never empty", len(ids), len(text))
		}
		for _, id := range ids {
			if id >= VocabSize || (id >= 5 && id < FirstPieceID) {
				t.Fatalf("id %d outside the vocabulary", id)
			}
		}
		if with := (Tokenizer{}).Encode(text, true); with[0] != BOSID || !slices.Equal(with[1:], ids) {
			t.Fatalf("with special tokens %v, without %v", with, ids)
		}
		if utf8.ValidString(text) && !slices.Equal(ids, Tokenizer{}.Encode(text, false)) {
			t.Fatal("encoding is not deterministic")
		}
	})
}

// FuzzKVCacheEventsMirrorTheCache drives a small cache with arbitrary
// admissions, decode steps, frees and resets, and checks after every
// operation that the pool is consistent and that replaying the events
// gives exactly the cached blocks: stored minus removed, per hash.
func FuzzKVCacheEventsMirrorTheCache(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 0, 4, 5, 9, 1, 1, 7, 0, 2, 8})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 3, 3, 3, 0, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		c, err := NewKVCache(KVCacheConfig{NumBlocks: 9, BlockSize: 2, HashSeed: "fuzz", Events: true})
		if err != nil {
			t.Fatal(err)
		}
		type req struct {
			s        *Sequence
			computed int
		}
		var live []*req
		announced := map[kvevent.BlockHash]int{}
		for i, op := range ops {
			switch op % 4 {
			case 0: // admit a request whose prompt is chosen by the next byte
				seed := 0
				if i+1 < len(ops) {
					seed = int(ops[i+1])
				}
				prompt := seqTokens(seed%3*10, 1+seed%7) // few distinct prefixes
				r := &req{s: c.NewSequence(prompt, nil)}
				hit := c.ComputedBlocks(r.s)
				if c.AllocateSlots(r.s, 0, hit, r.s.Len()-hit*2) {
					r.computed = r.s.Len()
					live = append(live, r)
				}
			case 1: // a decode step of every live request
				for _, r := range live {
					r.s.Append(uint32(500 + int(op)))
					if c.AllocateSlots(r.s, r.computed, 0, 1) {
						r.computed++
					}
				}
			case 2: // free the oldest request
				if len(live) > 0 {
					c.Free(live[0].s)
					live = live[1:]
				}
			case 3:
				if err := c.ResetPrefixCache(); err == nil {
					clear(announced)
				} else if len(live) == 0 {
					t.Fatalf("reset refused with no request alive: %v", err)
				}
			}
			for _, ev := range c.TakeEvents() {
				switch ev := ev.(type) {
				case *kvevent.BlockStoredEvent:
					for _, h := range ev.BlockHashes {
						announced[h]++
					}
				case *kvevent.BlockRemovedEvent:
					announced[ev.BlockHashes[0]]--
				}
			}
			checkPool(t, c, announced)
		}
	})
}

// checkPool verifies the pool's invariants and that announced holds, for
// each hash, the number of cached blocks with that hash.
func checkPool(t *testing.T, c *KVCache, announced map[kvevent.BlockHash]int) {
	t.Helper()
	p := &c.pool
	inQueue, prev := 0, noBlock
	for id := p.head; id != noBlock; id = p.blocks[id].next {
		if p.blocks[id].ref != 0 || p.blocks[id].prev != prev || id == nullBlock {
			t.Fatalf("free queue broken at block %d", id)
		}
		inQueue++
		prev = id
	}
	if p.tail != prev || inQueue != p.numFree {
		t.Fatalf("free queue holds %d blocks, counts %d", inQueue, p.numFree)
	}
	cached := map[kvevent.BlockHash]int{}
	for id := range p.blocks {
		b := &p.blocks[id]
		if b.ref < 0 {
			t.Fatalf("block %d ref %d", id, b.ref)
		}
		if b.cached {
			cached[b.digest.blockHash()]++
		}
	}
	reachable := 0
	for d, id := range p.cached {
		for ; id != noBlock; id = p.blocks[id].dupNext {
			if !p.blocks[id].cached || p.blocks[id].digest != d {
				t.Fatalf("map entry for %x reaches block %d holding %x", d.blockHash(), id, p.blocks[id].digest.blockHash())
			}
			reachable++
		}
	}
	total := 0
	for h, n := range announced {
		if n != cached[h] {
			t.Fatalf("events announce %d copies of %x, the cache holds %d", n, h, cached[h])
		}
		total += n
	}
	if total != reachable || len(cached) > len(announced) {
		t.Fatalf("%d blocks reachable from the map, %d announced, %d hashes cached", reachable, total, len(cached))
	}
}
