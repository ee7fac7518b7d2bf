package kvevent_test

import (
	"fmt"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

func ExampleDecodeEventBatchStats() {
	// A batch as vLLM >= v0.24 publishes it: one block evicted from the GPU
	// cache, and an event type this package does not know.
	payload := []byte("\x93\xcb\x41\xda\x30\x54\x98\x10\x00\x00\x92" +
		"\x83\xa4type\xacBlockRemoved\xacblock_hashes\x91\x07\xa6medium\xa3GPU" +
		"\x81\xa4type\xaaBlockMoved" +
		"\x00")
	batch, stats, err := kvevent.DecodeEventBatchStats(payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("rank", batch.DataParallelRank, "at", batch.Time().UTC())
	for _, ev := range batch.Events {
		if e, ok := ev.(*kvevent.BlockRemovedEvent); ok {
			fmt.Println(e.GetType(), e.BlockHashes, e.Medium)
		}
	}
	fmt.Println("skipped events:", stats.UnknownEvents)
	// Output:
	// rank 0 at 2025-09-10 10:26:40.25 +0000 UTC
	// BLOCK_REMOVED [7] GPU
	// skipped events: 1
}

func ExampleAppendEventBatch() {
	batch := &kvevent.EventBatch{
		TS:               1757500000.25,
		DataParallelRank: kvevent.NoRank,
		Events: []kvevent.KVEvent{&kvevent.BlockStoredEvent{
			BlockHashes: []kvevent.BlockHash{1<<63 + 5},
			TokenIDs:    []uint32{1, 2},
			BlockSize:   2,
			GroupIdx:    kvevent.NoGroup,
		}},
	}
	// Encode the batch as vLLM v0.9 sent it, reusing one buffer.
	var buf []byte
	buf, err := kvevent.AppendEventBatch(buf[:0], batch, kvevent.LayoutV09)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%x\n", buf)
	// Output:
	// 92cb41da3054981000009196ab426c6f636b53746f72656491d38000000000000005c092010202c0
}
