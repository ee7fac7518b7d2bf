package kvevent

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomBatch returns a batch of random events holding only what layout can
// carry, with every event stamped with the batch time as a decoder would.
func randomBatch(rng *rand.Rand, layout Layout) *EventBatch {
	b := &EventBatch{TS: rng.Float64() * 2e9, DataParallelRank: NoRank}
	if layout != LayoutV09 && rng.IntN(4) > 0 {
		b.DataParallelRank = rng.IntN(300)
	}
	at := TimeFromTS(b.TS)
	for range rng.IntN(7) {
		switch rng.IntN(3) {
		case 0:
			b.Events = append(b.Events, randomStored(rng, layout))
		case 1:
			r := &BlockRemovedEvent{BlockHashes: randomHashes(rng), GroupIdx: NoGroup}
			if layout != LayoutV09 {
				r.Medium, r.GroupIdx = randomString(rng), randomGroup(rng)
			}
			if layout == LayoutCurrent {
				r.Locality, r.Ownership = randomString(rng), randomString(rng)
			}
			b.Events = append(b.Events, r)
		default:
			b.Events = append(b.Events, &AllBlocksClearedEvent{})
		}
		setTimestamp(b.Events[len(b.Events)-1], at)
	}
	return b
}

func randomStored(rng *rand.Rand, layout Layout) *BlockStoredEvent {
	s := &BlockStoredEvent{
		BlockHashes: randomHashes(rng),
		HasParent:   rng.IntN(2) == 0,
		BlockSize:   rng.IntN(3000),
		LoraID:      rng.IntN(5) - 2,
		GroupIdx:    NoGroup,
	}
	if s.HasParent {
		s.ParentBlockHash = randomWidth(rng)
	}
	for range rng.IntN(300) {
		s.TokenIDs = append(s.TokenIDs, uint32(randomWidth(rng)))
	}
	if layout == LayoutV09 {
		return s
	}
	s.Medium, s.LoraName, s.GroupIdx = randomString(rng), randomString(rng), randomGroup(rng)
	if rng.IntN(3) > 0 {
		s.ExtraKeys = make([][]byte, rng.IntN(5))
		for i := range s.ExtraKeys {
			if rng.IntN(2) == 0 {
				s.ExtraKeys[i] = mp(arr{randomString(rng), arr{"mm-item", rng.IntN(100)}, raw{0xc4, 2, 1, 2}})
			}
		}
	}
	if rng.IntN(2) == 0 {
		s.KVCacheSpecKind, s.KVCacheSpecSlidingWindow = "sliding_window", rng.IntN(70000)
	}
	if layout == LayoutCurrent {
		s.Locality, s.Ownership, s.SessionID = randomString(rng), randomString(rng), randomString(rng)
	}
	return s
}

func randomHashes(rng *rand.Rand) []BlockHash {
	h := make([]BlockHash, rng.IntN(20))
	for i := range h {
		h[i] = randomWidth(rng)
	}
	return h
}

// randomWidth returns a random integer whose encoding may take any width.
func randomWidth(rng *rand.Rand) uint64 { return rng.Uint64() >> rng.IntN(64) }

func randomGroup(rng *rand.Rand) int { return rng.IntN(4) - 1 }

func randomString(rng *rand.Rand) string {
	return [...]string{"", MediumGPU, MediumCPU, "LOCAL", "fs-tier", strings.Repeat("x", 40), strings.Repeat("y", 300)}[rng.IntN(7)]
}

func TestGeneratedBatchesRoundTripInEveryLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, layout := range []Layout{LayoutCurrent, LayoutPositional, LayoutV09} {
		t.Run(layout.String(), func(t *testing.T) {
			for range 500 {
				want := randomBatch(rng, layout)
				payload, err := AppendEventBatch(nil, want, layout)
				if err != nil {
					t.Fatalf("encode %+v: %v", want, err)
				}
				got, err := DecodeEventBatch(payload)
				if err != nil {
					t.Fatalf("decode %x: %v", payload, err)
				}
				if d := diffBatch(got, want); d != "" {
					t.Fatalf("round trip of %x: %s", payload, d)
				}
				ref, err := reference(payload)
				if err != nil {
					t.Fatalf("reference decoder rejects %x: %v", payload, err)
				}
				if err := checkUntyped(got, ref); err != nil {
					t.Fatalf("reference decoder reads %x differently: %v", payload, err)
				}
			}
		})
	}
}

func TestLargeListsAndStringsRoundTrip(t *testing.T) {
	s := &BlockStoredEvent{
		BlockHashes: make([]BlockHash, 70000),
		TokenIDs:    make([]uint32, 70000),
		BlockSize:   1,
		LoraName:    strings.Repeat("l", 70000),
		GroupIdx:    NoGroup,
	}
	for i := range s.TokenIDs {
		s.BlockHashes[i], s.TokenIDs[i] = uint64(i)<<40, uint32(i)
	}
	want := &EventBatch{TS: 1, DataParallelRank: 0, Events: []KVEvent{s}}
	setTimestamp(s, want.Time())
	payload, err := EncodeEventBatch(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeEventBatch(payload)
	if err != nil {
		t.Fatal(err)
	}
	if d := diffBatch(got, want); d != "" {
		t.Error(d)
	}
}

func TestPositionalLayoutWritesSpecFieldsOnlyWhenSet(t *testing.T) {
	s := &BlockStoredEvent{BlockHashes: []BlockHash{1}, BlockSize: 16, Medium: MediumGPU, GroupIdx: 0}
	b := &EventBatch{TS: 1, DataParallelRank: 0, Events: []KVEvent{s}}
	for _, tt := range []struct {
		kind   string
		window int
		want   any
	}{
		{"", 0, arr{"BlockStored", arr{1}, nil, arr{}, 16, nil, "GPU", nil, nil, 0}},
		{"full_attention", 0, arr{"BlockStored", arr{1}, nil, arr{}, 16, nil, "GPU", nil, nil, 0, "full_attention", nil}},
		{"", 4096, arr{"BlockStored", arr{1}, nil, arr{}, 16, nil, "GPU", nil, nil, 0, nil, 4096}},
	} {
		s.KVCacheSpecKind, s.KVCacheSpecSlidingWindow = tt.kind, tt.window
		got := mustAppend(t, b, LayoutPositional)
		if want := mp(arr{1.0, arr{tt.want}, 0}); !bytes.Equal(got, want) {
			t.Errorf("kind %q window %d: encoded\n%x\nwant\n%x", tt.kind, tt.window, got, want)
		}
	}
}

type otherEvent struct{ AllBlocksClearedEvent }

func TestAppendEventBatchRejectsWhatTheLayoutCannotCarry(t *testing.T) {
	stored := func(f func(*BlockStoredEvent)) *EventBatch {
		s := &BlockStoredEvent{BlockHashes: []BlockHash{1}, GroupIdx: NoGroup}
		f(s)
		return &EventBatch{DataParallelRank: NoRank, Events: []KVEvent{s}}
	}
	removed := func(f func(*BlockRemovedEvent)) *EventBatch {
		r := &BlockRemovedEvent{GroupIdx: NoGroup}
		f(r)
		return &EventBatch{DataParallelRank: NoRank, Events: []KVEvent{r}}
	}
	tests := []struct {
		name   string
		batch  *EventBatch
		layout Layout
		msg    string
	}{
		{"nil batch", nil, LayoutCurrent, "nil batch"},
		{"unknown layout", &EventBatch{}, Layout(9), "unknown layout Layout(9)"},
		{"rank below NoRank", &EventBatch{DataParallelRank: -2}, LayoutCurrent, "data_parallel_rank -2"},
		{"rank in v0.9", &EventBatch{DataParallelRank: 0}, LayoutV09, "v0.9 layout: cannot carry data_parallel_rank 0"},
		{"nil event", &EventBatch{Events: []KVEvent{nil}}, LayoutCurrent, "event 0 of batch in current layout: cannot encode event of type <nil>"},
		{"nil stored event", &EventBatch{Events: []KVEvent{(*BlockStoredEvent)(nil)}}, LayoutCurrent, "cannot encode event *kvevent.BlockStoredEvent(nil)"},
		{"foreign event type", &EventBatch{Events: []KVEvent{&otherEvent{}}}, LayoutCurrent, "type *kvevent.otherEvent"},
		{"negative block size", stored(func(s *BlockStoredEvent) { s.BlockSize = -1 }), LayoutCurrent, "negative block_size -1"},
		{"group below NoGroup", stored(func(s *BlockStoredEvent) { s.GroupIdx = -2 }), LayoutCurrent, "group_idx -2"},
		{"negative window", stored(func(s *BlockStoredEvent) { s.KVCacheSpecSlidingWindow = -1 }), LayoutCurrent, "negative kv_cache_spec_sliding_window"},
		{"empty extra key", stored(func(s *BlockStoredEvent) { s.ExtraKeys = [][]byte{{}} }), LayoutCurrent, "extra_keys[0] is not exactly one msgpack value"},
		{"truncated extra key", stored(func(s *BlockStoredEvent) { s.ExtraKeys = [][]byte{nil, {0x92, 1}} }), LayoutCurrent, "extra_keys[1]"},
		{"two values in an extra key", stored(func(s *BlockStoredEvent) { s.ExtraKeys = [][]byte{{1, 2}} }), LayoutCurrent, "extra_keys[0]"},
		{"locality in positional", stored(func(s *BlockStoredEvent) { s.Locality = "LOCAL" }), LayoutPositional, "BlockStored field locality cannot be carried"},
		{"session in positional", stored(func(s *BlockStoredEvent) { s.SessionID = "s" }), LayoutPositional, "field session_id"},
		{"ownership of removal in positional", removed(func(r *BlockRemovedEvent) { r.Ownership = "t" }), LayoutPositional, "BlockRemoved field ownership"},
		{"medium in v0.9", stored(func(s *BlockStoredEvent) { s.Medium = MediumGPU }), LayoutV09, "field medium"},
		{"lora name in v0.9", stored(func(s *BlockStoredEvent) { s.LoraName = "a" }), LayoutV09, "field lora_name"},
		{"extra keys in v0.9", stored(func(s *BlockStoredEvent) { s.ExtraKeys = [][]byte{} }), LayoutV09, "field extra_keys"},
		{"group in v0.9", stored(func(s *BlockStoredEvent) { s.GroupIdx = 0 }), LayoutV09, "field group_idx"},
		{"spec kind in v0.9", stored(func(s *BlockStoredEvent) { s.KVCacheSpecKind = "mamba" }), LayoutV09, "field kv_cache_spec_kind"},
		{"medium of removal in v0.9", removed(func(r *BlockRemovedEvent) { r.Medium = MediumCPU }), LayoutV09, "BlockRemoved field medium"},
		{"group of removal in v0.9", removed(func(r *BlockRemovedEvent) { r.GroupIdx = 1 }), LayoutV09, "BlockRemoved field group_idx"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("keep")
			got, err := AppendEventBatch(prefix, tt.batch, tt.layout)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %v, want one saying %q", err, tt.msg)
			}
			if string(got) != "keep" {
				t.Errorf("returned %q, want dst unchanged", got)
			}
		})
	}
}

func TestAppendEventBatchAppendsToDst(t *testing.T) {
	b := storedBatch(2)
	alone := mustAppend(t, b, LayoutCurrent)
	got, err := AppendEventBatch([]byte("prefix"), b, LayoutCurrent)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, append([]byte("prefix"), alone...)) {
		t.Errorf("appended %x, want prefix then %x", got, alone)
	}
	enc, err := EncodeEventBatch(b)
	if err != nil || !bytes.Equal(enc, alone) {
		t.Errorf("EncodeEventBatch %x, %v; want %x", enc, err, alone)
	}
}

func TestEncodeSizeHintBoundsTheEncoding(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		b := randomBatch(rng, LayoutCurrent)
		if n, hint := len(mustAppend(t, b, LayoutCurrent)), encodedSizeHint(b); n > hint {
			t.Fatalf("encoding takes %d bytes, hint %d", n, hint)
		}
	}
}
