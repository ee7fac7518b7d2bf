package kvevent

import (
	"bytes"
	"errors"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecodeEventBatch checks, for any input, that decoding does not panic
// and that a batch it accepts
//   - is well-formed msgpack to the reference decoder, which reads the same
//     values whenever it can decode every element;
//   - survives re-encoding in LayoutCurrent and decoding again unchanged,
//     unless the re-encoding is smaller and too small for the batch's
//     decode budget.
func FuzzDecodeEventBatch(f *testing.F) {
	for _, g := range loadGoldens(f) {
		f.Add(g.Payload)
		for _, p := range asMapEnvelopes(f, g.Payload) {
			f.Add(p)
		}
	}
	for _, layout := range []Layout{LayoutCurrent, LayoutPositional, LayoutV09} {
		b := storedBatch(2)
		if layout == LayoutV09 {
			b = &EventBatch{TS: 1, DataParallelRank: NoRank, Events: []KVEvent{
				&BlockStoredEvent{BlockHashes: []BlockHash{1 << 63}, TokenIDs: []uint32{1, 300}, GroupIdx: NoGroup}}}
		}
		f.Add(mustAppend(f, b, layout))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeEventBatch(payload)
		if err != nil {
			if _, ok := err.(*DecodeError); !ok {
				t.Fatalf("error %v is a %T, want *DecodeError", err, err)
			}
			return
		}
		r := bytes.NewReader(payload)
		if err := msgpack.NewDecoder(r).Skip(); err != nil || r.Len() != 0 {
			t.Fatalf("accepted a payload the reference decoder cannot skip: %v, %d bytes left", err, r.Len())
		}
		if ref, err := reference(payload); err == nil {
			if err := checkUntyped(b, ref); err != nil {
				t.Fatalf("reference decoder reads %x differently: %v", payload, err)
			}
		}
		enc, err := EncodeEventBatch(b)
		if err != nil {
			t.Fatalf("cannot re-encode %+v: %v", b, err)
		}
		again, err := DecodeEventBatch(enc)
		if errors.Is(err, ErrBatchTooLarge) && len(enc) < len(payload) {
			return // the re-encoding is denser: its smaller budget may not hold the same batch
		}
		if err != nil {
			t.Fatalf("cannot decode the re-encoding %x: %v", enc, err)
		}
		if d := diffBatch(again, b); d != "" {
			t.Fatalf("re-encoding %x decodes differently: %s", enc, d)
		}
	})
}
