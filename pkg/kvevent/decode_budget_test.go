package kvevent

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"
)

// repeated returns an array of n copies of the encoded element elem.
func repeated(n int, elem []byte) raw {
	return append(appendArrayLen(nil, n), bytes.Repeat(elem, n)...)
}

// denseBatch is a payload whose elements each take the fewest bytes their
// kind allows, so that it decodes to the most memory per payload byte.
type denseBatch struct {
	name     string
	payload  []byte
	tooLarge bool // whether it decodes beyond the budget
	field    string
}

// denseBatches returns dense batches of about size bytes.
func denseBatches(size int) []denseBatch {
	cleared := mp(arr{"AllBlocksCleared"})
	removed := mp(arr{"BlockRemoved"})
	return []denseBatch{
		{"extra_keys of nils", batchOf(arr{"BlockStored", arr{}, nil, arr{}, 16, nil, nil, nil, repeated(size, raw{0xc0})}), true, "extra_keys"},
		{"extra_keys with a one-byte hash each", batchOf(arr{"BlockStored", repeated(size/2, raw{7}), nil, arr{}, 16, nil, nil, nil,
			repeated(size/2, raw{0xc0})}), true, "extra_keys"},
		{"tag-only BlockRemoved events", mp(arr{1.0, repeated(size/len(removed), removed)}), true, "events"},
		{"unknown events", mp(arr{1.0, repeated(size/2, raw{0x91, 0xa0})}), true, "events"},
		{"AllBlocksCleared events", mp(arr{1.0, repeated(size/len(cleared), cleared)}), false, ""},
		{"one-byte hashes", batchOf(arr{"BlockRemoved", repeated(size, raw{7})}), false, ""},
		{"one-byte tokens", batchOf(arr{"BlockStored", arr{}, nil, repeated(size, raw{7})}), false, ""},
	}
}

func TestDecodingADenseBatchStaysWithinItsBudget(t *testing.T) {
	for _, tt := range denseBatches(1 << 20) {
		t.Run(tt.name, func(t *testing.T) {
			budget := budgetPerByte*len(tt.payload) + budgetFloor
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b, err := DecodeEventBatch(tt.payload)
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(b)
			allocated := int(after.TotalAlloc - before.TotalAlloc)
			if allocated > budget {
				t.Errorf("decoding %d bytes allocated %d, beyond the budget of %d", len(tt.payload), allocated, budget)
			}
			if !tt.tooLarge {
				if err != nil {
					t.Fatalf("decode: %v", err)
				}
				return
			}
			var de *DecodeError
			if !errors.As(err, &de) || !errors.Is(err, ErrBatchTooLarge) {
				t.Fatalf("decoding %d bytes: %v (allocated %d), want a *DecodeError wrapping ErrBatchTooLarge", len(tt.payload), err, allocated)
			}
			if de.Field != tt.field || !strings.Contains(err.Error(), "may decode to") {
				t.Errorf("error %q names field %q, want %q and the budget", err, de.Field, tt.field)
			}
		})
	}
}

// budgetUsed decodes payload and returns the budget it used per payload
// byte, the floor left out.
func budgetUsed(t *testing.T, payload []byte) float64 {
	t.Helper()
	d := new(decoder)
	if _, err := d.decode(payload); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return float64(budgetPerByte*len(payload)+budgetFloor-d.budget) / float64(len(payload))
}

// TestBatchesVLLMSendsFitTheBudget decodes batches as large as vLLM sends,
// in every layout, and checks that they fit the budget without its floor.
func TestBatchesVLLMSendsFitTheBudget(t *testing.T) {
	smallVocab := storedBatch(1024)
	for _, e := range smallVocab.Events {
		for i := range e.(*BlockStoredEvent).TokenIDs {
			e.(*BlockStoredEvent).TokenIDs[i] %= 128
		}
	}
	for _, layout := range []Layout{LayoutCurrent, LayoutPositional, LayoutV09} {
		for _, c := range []struct {
			name  string
			batch *EventBatch
		}{{"evictions", removedBatch(8192)}, {"prefill", storedBatch(8192)}, {"prefill of token ids below 128", smallVocab}} {
			b := c.batch
			if layout == LayoutV09 {
				b = v09Fields(b)
			}
			p := mustAppend(t, b, layout)
			if used := budgetUsed(t, p); used > budgetPerByte {
				t.Errorf("%s in layout %v: %d bytes use %.1f bytes of budget per byte, above %d", c.name, layout, len(p), used, budgetPerByte)
			}
		}
	}
}

// v09Fields returns a copy of b without what vLLM v0.9 could not send.
func v09Fields(b *EventBatch) *EventBatch {
	out := &EventBatch{TS: b.TS, DataParallelRank: NoRank}
	for _, ev := range b.Events {
		switch e := ev.(type) {
		case *BlockRemovedEvent:
			out.Events = append(out.Events, &BlockRemovedEvent{BlockHashes: e.BlockHashes, GroupIdx: NoGroup})
		case *BlockStoredEvent:
			out.Events = append(out.Events, &BlockStoredEvent{BlockHashes: e.BlockHashes, ParentBlockHash: e.ParentBlockHash,
				HasParent: e.HasParent, TokenIDs: e.TokenIDs, BlockSize: e.BlockSize, GroupIdx: NoGroup})
		default:
			out.Events = append(out.Events, ev)
		}
	}
	return out
}

func TestDecodeErrorShortensAHugeUnknownKey(t *testing.T) {
	key := strings.Repeat("k", 1<<20)
	_, err := DecodeEventBatch(batchOf(storedMap(key, raw{0xc1})))
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("error %v, want a *DecodeError", err)
	}
	if want := key[:maxKeyInError] + "..."; de.Field != want {
		t.Errorf("field has %d bytes, want the key's first %d and an ellipsis", len(de.Field), maxKeyInError)
	}
	if len(err.Error()) > 1024 {
		t.Errorf("error message has %d bytes", len(err.Error()))
	}
}
