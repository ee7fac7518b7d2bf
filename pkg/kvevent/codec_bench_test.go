package kvevent

import (
	"math/rand/v2"
	"testing"
)

// storedBatch is the batch vLLM publishes when a request's prefill fills
// blocks blocks of 16 tokens: one BlockStored chained to a parent, 64-bit
// hashes, token ids from a 152k vocabulary, extra_keys with one nil per block
// (plain text), group 0 of a full-attention model on the GPU.
func storedBatch(blocks int) *EventBatch {
	rng := rand.New(rand.NewPCG(1, 2))
	hashes := make([]BlockHash, blocks)
	for i := range hashes {
		hashes[i] = rng.Uint64()
	}
	tokens := make([]uint32, 16*blocks)
	for i := range tokens {
		tokens[i] = rng.Uint32N(151936)
	}
	return &EventBatch{
		TS:               1757500000.25,
		DataParallelRank: 0,
		Events: []KVEvent{&BlockStoredEvent{
			BlockHashes:     hashes,
			ParentBlockHash: rng.Uint64(),
			HasParent:       true,
			TokenIDs:        tokens,
			BlockSize:       16,
			Medium:          MediumGPU,
			ExtraKeys:       make([][]byte, blocks),
			GroupIdx:        0,
			KVCacheSpecKind: "full_attention",
		}},
	}
}

// removedBatch is the batch of a step that evicted n blocks from the GPU:
// one BlockRemoved per block, as vLLM's block pool sends them.
func removedBatch(n int) *EventBatch {
	rng := rand.New(rand.NewPCG(3, 4))
	b := &EventBatch{TS: 1757500000.25, DataParallelRank: 0, Events: make([]KVEvent, n)}
	for i := range b.Events {
		b.Events[i] = &BlockRemovedEvent{BlockHashes: []BlockHash{rng.Uint64()}, Medium: MediumGPU, GroupIdx: 0}
	}
	return b
}

func mustAppend(tb testing.TB, b *EventBatch, layout Layout) []byte {
	tb.Helper()
	p, err := AppendEventBatch(nil, b, layout)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func BenchmarkDecodeEventBatch(b *testing.B) {
	for _, layout := range []Layout{LayoutCurrent, LayoutPositional} {
		for _, c := range []struct {
			name  string
			batch *EventBatch
		}{{"stored16x16", storedBatch(16)}, {"removed64", removedBatch(64)}} {
			payload := mustAppend(b, c.batch, layout)
			b.Run(c.name+"/"+layout.String(), func(b *testing.B) {
				b.SetBytes(int64(len(payload)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := DecodeEventBatch(payload); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func BenchmarkEncodeEventBatch(b *testing.B) {
	batch := storedBatch(16)
	b.Run("stored16x16/current", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := EncodeEventBatch(batch); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkAppendEventBatch(b *testing.B) {
	batch := storedBatch(16)
	for _, layout := range []Layout{LayoutCurrent, LayoutPositional} {
		b.Run("stored16x16/"+layout.String(), func(b *testing.B) {
			buf := mustAppend(b, batch, layout)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if buf, err = AppendEventBatch(buf[:0], batch, layout); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
