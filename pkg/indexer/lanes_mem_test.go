package indexer

import (
	"runtime"
	"testing"
)

// BenchmarkMemoryPerBlockByLanes loads 262,144 distinct blocks, each held
// by one lane, spread over 1, 64, 65, 256 and 1024 lanes (pods of one
// model), and reports the heap they take per block, measured after
// garbage collection. A key's holder set has a word per 64 lane ids of the
// model, so the cost per block grows by 8 bytes per 64 lanes, whoever
// holds the block.
func BenchmarkMemoryPerBlockByLanes(b *testing.B) {
	const blocks, perEvent, bs = 1 << 18, 16, 4
	for _, lanes := range []int{1, 64, 65, 256, 1024} {
		b.Run(itoa(lanes), func(b *testing.B) {
			for range b.N {
				before := heapInUse()
				idx, _ := newTestTable(b, Config{})
				for e := range blocks / perEvent {
					pod := e % lanes
					ev := stored(hashSeq(uint64(e*perEvent)+1, perEvent), nil, tokenRange(e*perEvent*bs, perEvent*bs), bs)
					if err := idx.ProcessBlockStored(Stream{Pod: "ns/p" + itoa(pod), Model: "llama"}, ev); err != nil {
						b.Fatal(err)
					}
				}
				after := heapInUse()
				if st := idx.Stats(); st[0].Entries != blocks {
					b.Fatalf("entries = %d, want %d", st[0].Entries, blocks)
				}
				b.ReportMetric(float64(after-before)/blocks, "B/block")
				runtime.KeepAlive(idx)
			}
		})
	}
}
