package kvevent

import (
	"encoding/binary"
	"fmt"
	"math"
)

// A tiny msgpack builder for hand-written test payloads, well-formed or not.
// mp encodes: arr and obj (keys and values in order), string, int, uint64,
// float64, float32, bool, nil, and raw bytes verbatim.
type (
	arr []any
	obj []any // key, value, key, value...
	raw []byte
)

func mp(v any) []byte { return appendTest(nil, v) }

func appendTest(dst []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return appendNil(dst)
	case raw:
		return append(dst, v...)
	case string:
		return appendStr(dst, v)
	case int:
		return appendInt(dst, int64(v))
	case uint64:
		return appendUint(dst, v)
	case float64:
		return appendFloat64(dst, v)
	case float32:
		return binary.BigEndian.AppendUint32(append(dst, 0xca), math.Float32bits(v))
	case bool:
		if v {
			return append(dst, 0xc3)
		}
		return append(dst, 0xc2)
	case arr:
		dst = appendArrayLen(dst, len(v))
		for _, e := range v {
			dst = appendTest(dst, e)
		}
		return dst
	case obj:
		dst = appendMapLen(dst, len(v)/2)
		for _, e := range v {
			dst = appendTest(dst, e)
		}
		return dst
	}
	panic(fmt.Sprintf("mp: cannot encode %T", v))
}

// batchOf builds a current-style envelope around events with rank 0.
func batchOf(events ...any) []byte { return mp(arr{1757500000.25, arr(events), 0}) }

// storedMap is a minimal valid tagged-map BlockStored followed by extra
// key-value pairs.
func storedMap(extra ...any) obj {
	return append(obj{"type", "BlockStored", "block_hashes", arr{1}, "parent_block_hash", nil,
		"token_ids", arr{1, 2}, "block_size", 2, "lora_id", nil, "medium", "GPU", "lora_name", nil}, extra...)
}
