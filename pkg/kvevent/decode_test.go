package kvevent

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestDecodeRejectsMalformedBatches(t *testing.T) {
	valid := storedMap()
	tests := []struct {
		name    string
		payload []byte
		event   int    // want DecodeError.Event
		field   string // want DecodeError.Field
		offset  int    // want DecodeError.Offset, -1 to skip the check
		msg     string // in the error
	}{
		{"empty payload", nil, -1, "", 0, "unexpected end"},
		{"envelope is a str", mp("batch"), -1, "", 0, "expected array, got str"},
		{"map envelope without events", mp(obj{"ts", 1.0}), -1, "", 0, `envelope map has no "events" key`},
		{"map envelope without ts", mp(obj{"events", arr{}}), -1, "", 0, `envelope map has no "ts" key`},
		{"map envelope with ts twice", mp(obj{"ts", 1.0, "events", arr{}, "ts", 2.0}), -1, "", 21, `duplicate envelope key "ts"`},
		{"map envelope ts is a str", mp(obj{"ts", "now", "events", arr{}}), -1, "ts", 4, "expected float or int, got str"},
		{"map envelope events is a map", mp(obj{"events", obj{}, "ts", 1.0}), -1, "events", 8, "expected array, got map"},
		{"map envelope negative rank", mp(obj{"ts", 1.0, "events", arr{}, "data_parallel_rank", -1}), -1, "data_parallel_rank", -1, "-1 is negative"},
		{"map envelope second event is bad", mp(obj{"events", arr{storedMap(), arr{"BlockRemoved", arr{1.5}}}, "ts", 1.0}), 1, "block_hashes", -1, "got float"},
		{"bad value of unknown envelope key", mp(obj{"ts", 1.0, "events", arr{}, "future", raw{0xc1}}), -1, "future", -1, "invalid type byte 0xc1"},
		{"envelope of one element", mp(arr{1.0}), -1, "", 0, "want at least 2"},
		{"ts is a string", mp(arr{"now", arr{}}), -1, "ts", 1, "expected float or int, got str"},
		{"events is a map", mp(arr{1.0, obj{}}), -1, "events", 10, "expected array, got map"},
		{"event is an int", batchOf(7), 0, "", 11, "expected event as map or array, got int"},
		{"positional event without tag", batchOf(arr{}), 0, "", 11, "no tag"},
		{"tag is an int", batchOf(arr{1, arr{}}), 0, "type", 12, "expected str, got int"},
		{"map event without type", batchOf(obj{"block_hashes", arr{}}), 0, "", 11, `no "type" key`},
		{"type is nil", batchOf(obj{"type", nil}), 0, "type", 17, "expected str, got nil"},
		{"duplicate type", batchOf(obj{"type", "BlockRemoved", "type", "BlockStored"}), 0, "", 30, `duplicate key "type"`},
		{"duplicate field", batchOf(append(storedMap(), "block_size", 4)), 0, "", -1, `duplicate key "block_size"`},
		{"block_hashes nil", batchOf(obj{"type", "BlockRemoved", "block_hashes", nil}), 0, "block_hashes", -1, "expected array, got nil"},
		{"hash is a float", batchOf(arr{"BlockRemoved", arr{1.5}}), 0, "block_hashes", -1, "expected block hash as int or bin, got float"},
		{"hash is a str", batchOf(arr{"BlockRemoved", arr{"ab"}}), 0, "block_hashes", -1, "got str"},
		{"hash is an empty digest", batchOf(arr{"BlockRemoved", arr{raw{0xc4, 0}}}), 0, "block_hashes", -1, "empty digest"},
		{"parent is a map", batchOf(arr{"BlockStored", arr{}, obj{}}), 0, "parent_block_hash", -1, "got map"},
		{"negative token", batchOf(obj{"type", "BlockStored", "token_ids", arr{1, -1}}), 0, "token_ids", -1, "token id -1 does not fit uint32"},
		{"token above uint32", batchOf(arr{"BlockStored", arr{}, nil, arr{uint64(1 << 32)}}), 0, "token_ids", -1, "token id 4294967296 does not fit uint32"},
		{"token is a float", batchOf(arr{"BlockStored", arr{}, nil, arr{2.0}}), 0, "token_ids", -1, "expected int, got float"},
		{"negative block_size", batchOf(append(obj{"type", "BlockStored"}, "block_size", -16)), 0, "block_size", -1, "-16 is negative"},
		{"block_size nil", batchOf(arr{"BlockStored", arr{}, nil, arr{}, nil}), 0, "block_size", -1, "expected int, got nil"},
		{"lora_id above int", batchOf(arr{"BlockStored", arr{}, nil, arr{}, 16, uint64(1 << 63)}), 0, "lora_id", -1, "does not fit an int"},
		{"medium is an int", batchOf(arr{"BlockRemoved", arr{}, 3}), 0, "medium", -1, "expected str, got int"},
		{"medium is bin", batchOf(arr{"BlockRemoved", arr{}, raw{0xc4, 1, 'G'}}), 0, "medium", -1, "expected str, got bin"},
		{"negative group_idx", batchOf(arr{"BlockRemoved", arr{}, "GPU", -1}), 0, "group_idx", -1, "-1 is negative"},
		{"extra_keys is a map", batchOf(storedMap("extra_keys", obj{})), 0, "extra_keys", -1, "expected array, got map"},
		{"invalid byte in extra_keys", batchOf(storedMap("extra_keys", arr{arr{raw{0xc1}}})), 0, "extra_keys", -1, "invalid type byte 0xc1"},
		{"window is a str", batchOf(storedMap("kv_cache_spec_sliding_window", "4k")), 0, "kv_cache_spec_sliding_window", -1, "expected int, got str"},
		{"session_id is an array", batchOf(storedMap("session_id", arr{})), 0, "session_id", -1, "expected str, got array"},
		{"bad value of unknown key", batchOf(storedMap("future", raw{0xc1})), 0, "future", -1, "invalid type byte 0xc1"},
		{"second event is bad", batchOf(valid, arr{"BlockRemoved", arr{-1.5}}), 1, "block_hashes", -1, "got float"},
		{"negative rank", mp(arr{1.0, arr{}, -3}), -1, "data_parallel_rank", 11, "-3 is negative"},
		{"rank is a str", mp(arr{1.0, arr{}, "0"}), -1, "data_parallel_rank", 11, "expected int, got str"},
		{"bad trailing envelope element", mp(arr{1.0, arr{}, 0, raw{0xc1}}), -1, "", 12, "invalid type byte 0xc1"},
		{"trailing bytes", append(batchOf(), 0xc0), -1, "", 12, "1 bytes follow the batch"},
		{"ext event", batchOf(raw{0xd4, 1, 0}), 0, "", 11, "got ext"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, stats, err := DecodeEventBatchStats(tt.payload)
			if err == nil {
				t.Fatalf("decoded %+v, want an error", b)
			}
			if b != nil || stats != (DecodeStats{}) {
				t.Errorf("got batch %v and stats %+v with the error", b, stats)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is a %T, want *DecodeError", err, err)
			}
			if de.Event != tt.event || de.Field != tt.field || tt.offset >= 0 && de.Offset != tt.offset {
				t.Errorf("error at event %d field %q byte %d, want event %d field %q byte %d (%v)",
					de.Event, de.Field, de.Offset, tt.event, tt.field, tt.offset, err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not say %q", err, tt.msg)
			}
		})
	}
}

func TestDecodeErrorSaysWhereAndWhat(t *testing.T) {
	_, err := DecodeEventBatch(batchOf(obj{"type", "BlockStored", "token_ids", arr{1, -1}}))
	want := "kvevent: decode batch: event 0 field token_ids at byte 41: token id -1 does not fit uint32"
	if err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
}

func TestDecodeFailsOnEveryTruncation(t *testing.T) {
	payloads := [][]byte{mustAppend(t, storedBatch(16), LayoutCurrent), mustAppend(t, storedBatch(16), LayoutPositional)}
	for _, g := range loadGoldens(t) {
		payloads = append(payloads, g.Payload)
	}
	for _, p := range payloads {
		for n := range len(p) {
			b, err := DecodeEventBatch(p[:n])
			var de *DecodeError
			if !errors.As(err, &de) || b != nil {
				t.Fatalf("decoding %d of %d bytes of %x: %v, %v; want a *DecodeError", n, len(p), p, b, err)
			}
			if de.Offset < 0 || de.Offset > n {
				t.Fatalf("decoding %d bytes: error offset %d outside the payload", n, de.Offset)
			}
		}
	}
}

func TestHugeLengthHeadersFailBeforeAllocating(t *testing.T) {
	u32 := raw{0xff, 0xff, 0xff, 0xff}
	tests := []struct {
		name    string
		payload []byte
	}{
		{"envelope array32", append(raw{0xdd}, u32...)},
		{"envelope map32", append(raw{0xdf}, u32...)},
		{"map envelope events array32", mp(obj{"ts", 1.0, "events", append(raw{0xdd}, u32...)})},
		{"events array32", mp(arr{1.0, append(raw{0xdd}, u32...)})},
		{"event map32", batchOf(append(raw{0xdf}, u32...))},
		{"block_hashes array32", batchOf(arr{"BlockRemoved", append(raw{0xdd}, u32...)})},
		{"token_ids array32", batchOf(arr{"BlockStored", arr{}, nil, append(raw{0xdd}, u32...)})},
		{"token_ids array16", batchOf(arr{"BlockStored", arr{}, nil, raw{0xdc, 0xff, 0xff}})},
		{"extra_keys array32", batchOf(storedMap("extra_keys", append(raw{0xdd}, u32...)))},
		{"medium str32", batchOf(arr{"BlockRemoved", arr{}, append(raw{0xdb}, u32...)})},
		{"digest bin32", batchOf(arr{"BlockRemoved", arr{append(raw{0xc6}, u32...)}})},
		{"nested arrays in extra_keys", batchOf(storedMap("extra_keys", arr{append(raw{0x91, 0x91, 0xdd}, u32...)}))},
		{"ext32 in an unknown key", batchOf(storedMap("future", append(raw{0xc9}, u32...)))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeEventBatch(tt.payload); err == nil {
				t.Fatal("decoded, want an error")
			}
			const runs = 100
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range runs {
				_, _ = DecodeEventBatch(tt.payload)
			}
			runtime.ReadMemStats(&after)
			if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 4096 {
				t.Errorf("a failed decode allocated %d bytes", per)
			}
		})
	}
}

func TestDecodeSkipsAndCountsWhatItDoesNotKnow(t *testing.T) {
	payload := mp(arr{1757500000.25, arr{
		storedMap("future_field", arr{1, 2}, 7, "int key"),
		obj{"type", "BlockMoved", "block_hashes", arr{1}},
		arr{"BlockRemoved", arr{5}, "CPU", 2, "future positional"},
		obj{"type", "BlockRemoved", "block_hashes", arr{6}, "token_ids", arr{1}},
		arr{"SnapshotTaken", 1, 2, 3},
		obj{"type", "AllBlocksCleared", "reason", "reset"},
	}, 1, raw{0xc4, 2, 0xab, 0xcd}, "more"})
	b, stats, err := DecodeEventBatchStats(payload)
	if err != nil {
		t.Fatal(err)
	}
	want := DecodeStats{UnknownEvents: 2, UnknownKeys: 4, UnknownFields: 3}
	if stats != want {
		t.Errorf("stats %+v, want %+v", stats, want)
	}
	at := TimeFromTS(1757500000.25)
	wantBatch := &EventBatch{TS: 1757500000.25, DataParallelRank: 1, Events: []KVEvent{
		&BlockStoredEvent{Timestamp: at, BlockHashes: []BlockHash{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2,
			Medium: MediumGPU, GroupIdx: NoGroup},
		&BlockRemovedEvent{Timestamp: at, BlockHashes: []BlockHash{5}, Medium: MediumCPU, GroupIdx: 2},
		&BlockRemovedEvent{Timestamp: at, BlockHashes: []BlockHash{6}, GroupIdx: NoGroup},
		&AllBlocksClearedEvent{Timestamp: at},
	}}
	if d := diffBatch(b, wantBatch); d != "" {
		t.Error(d)
	}
}

func TestDecodeAcceptsEveryEncodingVLLMMightUse(t *testing.T) {
	at := TimeFromTS(1757500000.25)
	tests := []struct {
		name    string
		payload []byte
		want    *EventBatch
	}{{
		name:    "tag after the fields",
		payload: batchOf(obj{"block_hashes", arr{3}, "medium", "GPU", "type", "BlockRemoved"}),
		want: &EventBatch{TS: 1757500000.25, Events: []KVEvent{
			&BlockRemovedEvent{Timestamp: at, BlockHashes: []BlockHash{3}, Medium: MediumGPU, GroupIdx: NoGroup}}},
	}, {
		name:    "short positional events take defaults",
		payload: batchOf(arr{"BlockStored", arr{9}}, arr{"BlockRemoved"}),
		want: &EventBatch{TS: 1757500000.25, Events: []KVEvent{
			&BlockStoredEvent{Timestamp: at, BlockHashes: []BlockHash{9}, GroupIdx: NoGroup},
			&BlockRemovedEvent{Timestamp: at, GroupIdx: NoGroup}}},
	}, {
		name:    "mixed layouts in one batch",
		payload: batchOf(arr{"BlockRemoved", arr{1}, "GPU", 0}, obj{"type", "BlockRemoved", "block_hashes", arr{2}, "medium", "CPU"}),
		want: &EventBatch{TS: 1757500000.25, Events: []KVEvent{
			&BlockRemovedEvent{Timestamp: at, BlockHashes: []BlockHash{1}, Medium: MediumGPU, GroupIdx: 0},
			&BlockRemovedEvent{Timestamp: at, BlockHashes: []BlockHash{2}, Medium: MediumCPU, GroupIdx: NoGroup}}},
	}, {
		name:    "hashes of every form",
		payload: batchOf(arr{"BlockRemoved", arr{0, -1, raw{0xd0, 0x80}, uint64(1<<64 - 2), raw{0xc4, 3, 1, 2, 3}, raw{0xc5, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 42}}}),
		want: &EventBatch{TS: 1757500000.25, Events: []KVEvent{
			&BlockRemovedEvent{Timestamp: at, BlockHashes: []BlockHash{0, 1<<64 - 1, 1<<64 - 128, 1<<64 - 2, 0x010203, 42}, GroupIdx: NoGroup}}},
	}, {
		name:    "float32 ts and nil rank",
		payload: mp(arr{float32(1.5), arr{}, nil}),
		want:    &EventBatch{TS: 1.5, DataParallelRank: NoRank},
	}, {
		name:    "integer ts and no rank",
		payload: mp(arr{1757500000, arr{arr{"AllBlocksCleared"}}}),
		want: &EventBatch{TS: 1757500000, DataParallelRank: NoRank, Events: []KVEvent{
			&AllBlocksClearedEvent{Timestamp: time.Unix(1757500000, 0)}}},
	}, {
		name:    "explicit nils for optional fields",
		payload: batchOf(storedMap("extra_keys", nil, "group_idx", nil, "kv_cache_spec_kind", nil, "kv_cache_spec_sliding_window", nil, "session_id", nil)),
		want: &EventBatch{TS: 1757500000.25, Events: []KVEvent{
			&BlockStoredEvent{Timestamp: at, BlockHashes: []BlockHash{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2,
				Medium: MediumGPU, GroupIdx: NoGroup}}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := DecodeEventBatch(tt.payload)
			if err != nil {
				t.Fatal(err)
			}
			if d := diffBatch(b, tt.want); d != "" {
				t.Error(d)
			}
		})
	}
}

func TestDecodedBatchDoesNotAliasThePayload(t *testing.T) {
	payload := batchOf(obj{"type", "BlockStored", "block_hashes", arr{1}, "lora_name", "sql-adapter",
		"extra_keys", arr{arr{"salt"}, nil}, "session_id", "s-1"})
	b, err := DecodeEventBatch(payload)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := DecodeEventBatch(payload)
	for i := range payload {
		payload[i] = 0xc1
	}
	if d := diffBatch(b, want); d != "" {
		t.Errorf("batch changed with the payload: %s", d)
	}
	s := b.Events[0].(*BlockStoredEvent)
	if s.LoraName != "sql-adapter" || string(s.ExtraKeys[0]) != "\x91\xa4salt" || s.ExtraKeys[1] != nil {
		t.Errorf("decoded %+v", s)
	}
}

func TestDecodedSlicesDoNotOverlap(t *testing.T) {
	payload := batchOf(
		storedMap("extra_keys", arr{"a", "b"}),
		arr{"BlockRemoved", arr{7, 8}},
		storedMap("extra_keys", arr{"c"}),
	)
	b, err := DecodeEventBatch(payload)
	if err != nil {
		t.Fatal(err)
	}
	first := b.Events[0].(*BlockStoredEvent)
	first.BlockHashes = append(first.BlockHashes, 99)
	first.TokenIDs = append(first.TokenIDs, 99)
	first.ExtraKeys[0] = append(first.ExtraKeys[0], 0xc0)
	first.ExtraKeys = append(first.ExtraKeys, nil)
	if got := b.Events[1].(*BlockRemovedEvent).BlockHashes; got[0] != 7 {
		t.Errorf("appending to one event's hashes changed the next: %v", got)
	}
	third := b.Events[2].(*BlockStoredEvent)
	if third.BlockHashes[0] != 1 || third.TokenIDs[0] != 1 || string(third.ExtraKeys[0]) != "\xa1c" {
		t.Errorf("appending to one event's lists changed another: %+v", third)
	}
	if string(first.ExtraKeys[1]) != "\xa1b" {
		t.Errorf("appending to one extra key changed the next: %q", first.ExtraKeys[1])
	}
}
