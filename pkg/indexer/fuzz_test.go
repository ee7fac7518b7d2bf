package indexer

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// FuzzApplyDecodedBatch feeds whatever the decoder accepts to a table that
// already holds blocks: a batch may be refused, but it must not break the
// table's invariants or stop the next batch from being indexed.
func FuzzApplyDecodedBatch(f *testing.F) {
	for _, events := range [][]kvevent.KVEvent{
		{stored(hashSeq(1, 2), nil, tokenRange(0, 32), 16)},
		{stored(hashSeq(3, 1), ptr(uint64(2)), tokenRange(32, 16), 16), removed("GPU", 0, 1)},
		{stored(hashSeq(5, 2), nil, tokenRange(0, 8), 4), removed("CPU", 1, 5, 6)},
		{&kvevent.AllBlocksClearedEvent{}},
		{stored(hashSeq(1, 4), nil, nil, 1<<62)},
	} {
		payload, err := kvevent.EncodeEventBatch(&kvevent.EventBatch{TS: 1, Events: events})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(payload)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		batch, err := kvevent.DecodeEventBatch(payload)
		if err != nil {
			return
		}
		idx, _ := newTestTable(t, Config{})
		mustApply(t, idx, podA, stored(hashSeq(100, 2), nil, tokenRange(1000, 32), 16))
		_ = idx.ApplyBatch(podA, batch)
		if err := checkInvariants(idx); err != nil {
			t.Fatalf("after a decoded batch: %v", err)
		}
		podB := Stream{Pod: "ns/b", Model: "llama"}
		mustApply(t, idx, podB, stored(hashSeq(200, 1), nil, tokenRange(2000, 16), 16))
		if blocks, _ := match(idx, "llama", "", tokenRange(2000, 16), "ns/b"); blocks["ns/b"] != 1 {
			t.Fatalf("a good batch after the decoded one matched %d blocks, want 1", blocks["ns/b"])
		}
	})
}
