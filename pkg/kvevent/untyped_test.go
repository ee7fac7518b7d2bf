package kvevent

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// This file checks a decoded batch against an untyped rendering of the same
// payload (vLLM's own, from the golden files, or the reference msgpack
// decoder's) without using any of the decoder's code: integers go through
// math/big, digests through the formula vLLM documents.

// positionalOrders are the field names of positional events after the tag,
// in vLLM's declaration order.
var positionalOrders = map[string][]string{
	"BlockStored": {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
		"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"},
	"BlockRemoved":     {"block_hashes", "medium", "group_idx"},
	"AllBlocksCleared": {},
}

// canon turns an untyped value (from encoding/json with UseNumber, or from
// the reference msgpack decoder) into a form that compares with
// reflect.DeepEqual: integers become "int:<decimal>", floats
// "float:<bits>", {"$bytes": hex} and bin become []byte, maps map[string]any.
func canon(v any) any {
	switch v := v.(type) {
	case json.Number:
		if i, ok := new(big.Int).SetString(string(v), 10); ok {
			return "int:" + i.String()
		}
		f, err := v.Float64()
		if err != nil {
			return fmt.Sprintf("bad number %q", v)
		}
		return canonFloat(f)
	case int8, int16, int32, int64, uint8, uint16, uint32, uint64, int, uint:
		return fmt.Sprintf("int:%d", v)
	case float32:
		return canonFloat(float64(v))
	case float64:
		return canonFloat(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = canon(e)
		}
		return out
	case map[string]any:
		if h, ok := v["$bytes"].(string); ok && len(v) == 1 {
			if b, err := hex.DecodeString(h); err == nil {
				return b
			}
		}
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = canon(e)
		}
		return out
	}
	return v
}

func canonFloat(f float64) string { return fmt.Sprintf("float:%x", math.Float64bits(f)) }

// bigOf parses a canonical integer.
func bigOf(v any) (*big.Int, bool) {
	s, ok := v.(string)
	if !ok || !strings.HasPrefix(s, "int:") {
		return nil, false
	}
	return new(big.Int).SetString(s[4:], 10)
}

var two64 = new(big.Int).Lsh(big.NewInt(1), 64)

// wantHash applies vLLM's rules to a canonical hash: an integer taken modulo
// 2^64 (two's complement for negative ones), a digest as
// int.from_bytes(digest, "big") & (2**64 - 1).
func wantHash(v any) (uint64, error) {
	if b, ok := v.([]byte); ok {
		return new(big.Int).Mod(new(big.Int).SetBytes(b), two64).Uint64(), nil
	}
	i, ok := bigOf(v)
	if !ok {
		return 0, fmt.Errorf("hash %v is neither int nor bytes", v)
	}
	return new(big.Int).Mod(i, two64).Uint64(), nil
}

func wantInt(v any, none int) (int, error) {
	if v == nil {
		return none, nil
	}
	i, ok := bigOf(v)
	if !ok || !i.IsInt64() {
		return 0, fmt.Errorf("%v is not an int", v)
	}
	return int(i.Int64()), nil
}

func wantString(v any) (string, error) {
	if v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%v is not a string", v)
	}
	return s, nil
}

// reference decodes a msgpack payload with github.com/vmihailenco/msgpack,
// rendering maps with non-string keys as map[string]any too.
func reference(payload []byte) (any, error) {
	dec := msgpack.NewDecoder(bytes.NewReader(payload))
	dec.SetMapDecoder(func(d *msgpack.Decoder) (any, error) {
		n, err := d.DecodeMapLen()
		if err != nil || n < 0 {
			return nil, err
		}
		m := make(map[string]any, n)
		for range n {
			k, err := d.DecodeInterface()
			if err != nil {
				return nil, err
			}
			v, err := d.DecodeInterface()
			if err != nil {
				return nil, err
			}
			if s, ok := k.(string); ok {
				m[s] = v
			} else {
				m[fmt.Sprintf("%T:%v", k, k)] = v
			}
		}
		return m, nil
	})
	return dec.DecodeInterface()
}

// mapEnvelope returns the fields of a map envelope in positional order, and
// false when ts or events is missing.
func mapEnvelope(m map[string]any) ([]any, bool) {
	ts, hasTS := m["ts"]
	events, hasEvents := m["events"]
	if !hasTS || !hasEvents {
		return nil, false
	}
	env := []any{ts, events}
	if rank, ok := m["data_parallel_rank"]; ok {
		env = append(env, rank)
	}
	return env, true
}

// checkUntyped reports the first difference between batch and what vLLM's
// rules make of the untyped batch v.
func checkUntyped(batch *EventBatch, v any) error {
	env, ok := canon(v).([]any)
	if m, isMap := canon(v).(map[string]any); isMap {
		env, ok = mapEnvelope(m)
	}
	if !ok || len(env) < 2 {
		return fmt.Errorf("untyped envelope %v", v)
	}
	ts := env[0]
	if i, ok := bigOf(ts); ok {
		f, _ := new(big.Float).SetInt(i).Float64()
		ts = canonFloat(f)
	}
	if ts != canonFloat(batch.TS) {
		return fmt.Errorf("ts %v, want %v", batch.TS, env[0])
	}
	wantRank := NoRank
	if len(env) > 2 {
		var err error
		if wantRank, err = wantInt(env[2], NoRank); err != nil {
			return fmt.Errorf("data_parallel_rank: %w", err)
		}
	}
	if batch.DataParallelRank != wantRank {
		return fmt.Errorf("data_parallel_rank %d, want %d", batch.DataParallelRank, wantRank)
	}
	events, ok := env[1].([]any)
	if !ok {
		return fmt.Errorf("untyped events %v", env[1])
	}
	at := TimeFromTS(batch.TS)
	k := 0
	for i, ue := range events {
		tag, fields := untypedEvent(ue)
		if _, known := positionalOrders[tag]; !known {
			continue
		}
		if k >= len(batch.Events) {
			return fmt.Errorf("event %d (%s) missing from the batch", i, tag)
		}
		if err := checkEvent(batch.Events[k], tag, fields, at); err != nil {
			return fmt.Errorf("event %d (%s): %w", i, tag, err)
		}
		k++
	}
	if k != len(batch.Events) {
		return fmt.Errorf("batch has %d events, want %d", len(batch.Events), k)
	}
	return nil
}

// untypedEvent returns the tag and the fields by name of a canonical event,
// positional or map.
func untypedEvent(ue any) (string, map[string]any) {
	switch e := ue.(type) {
	case map[string]any:
		tag, _ := e["type"].(string)
		return tag, e
	case []any:
		if len(e) == 0 {
			return "", nil
		}
		tag, _ := e[0].(string)
		fields := map[string]any{}
		for j, name := range positionalOrders[tag] {
			if j+1 < len(e) {
				fields[name] = e[j+1]
			}
		}
		return tag, fields
	}
	return "", nil
}

// checkEvent compares one decoded event with the untyped fields of its
// source. Fields the source lacks must hold their defaults.
func checkEvent(got KVEvent, tag string, f map[string]any, at time.Time) error {
	want, wantExtras, err := eventFromUntyped(tag, f)
	if err != nil {
		return err
	}
	setTimestamp(want, at)
	if !got.GetTimestamp().Equal(at) {
		return fmt.Errorf("timestamp %v, want %v", got.GetTimestamp(), at)
	}
	if s, ok := got.(*BlockStoredEvent); ok {
		c := *s
		if err := checkExtraKeys(c.ExtraKeys, wantExtras); err != nil {
			return err
		}
		c.ExtraKeys = nil
		got = &c
	}
	if msg := diffEvent(got, want); msg != "" {
		return fmt.Errorf("%s", msg)
	}
	return nil
}

// eventFromUntyped builds the event vLLM's rules make of untyped fields,
// except for extra_keys, which it returns separately as canonical values
// (nil when absent).
func eventFromUntyped(tag string, f map[string]any) (KVEvent, []any, error) {
	var extras []any
	s := &BlockStoredEvent{GroupIdx: NoGroup}
	for name, v := range f {
		var err error
		switch name {
		case "block_hashes":
			s.BlockHashes, err = wantHashes(v)
		case "parent_block_hash":
			if v != nil {
				s.HasParent = true
				s.ParentBlockHash, err = wantHash(v)
			}
		case "token_ids":
			s.TokenIDs, err = wantTokens(v)
		case "block_size":
			s.BlockSize, err = wantInt(v, 0)
		case "lora_id":
			s.LoraID, err = wantInt(v, 0)
		case "medium":
			s.Medium, err = wantString(v)
		case "lora_name":
			s.LoraName, err = wantString(v)
		case "extra_keys":
			if v != nil {
				var ok bool
				if extras, ok = v.([]any); !ok {
					err = fmt.Errorf("extra_keys %v is not a list", v)
				}
			}
		case "group_idx":
			s.GroupIdx, err = wantInt(v, NoGroup)
		case "kv_cache_spec_kind":
			s.KVCacheSpecKind, err = wantString(v)
		case "kv_cache_spec_sliding_window":
			s.KVCacheSpecSlidingWindow, err = wantInt(v, 0)
		case "locality":
			s.Locality, err = wantString(v)
		case "ownership":
			s.Ownership, err = wantString(v)
		case "session_id":
			s.SessionID, err = wantString(v)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	switch tag {
	case "BlockStored":
		return s, extras, nil
	case "BlockRemoved":
		return &BlockRemovedEvent{BlockHashes: s.BlockHashes, Medium: s.Medium, GroupIdx: s.GroupIdx,
			Locality: s.Locality, Ownership: s.Ownership}, nil, nil
	default:
		return &AllBlocksClearedEvent{}, nil, nil
	}
}

func wantHashes(v any) ([]BlockHash, error) { return wantList(v, wantHash) }

func wantTokens(v any) ([]uint32, error) {
	return wantList(v, func(e any) (uint32, error) {
		i, ok := bigOf(e)
		if !ok || i.Sign() < 0 || i.BitLen() > 32 {
			return 0, fmt.Errorf("token %v", e)
		}
		return uint32(i.Uint64()), nil
	})
}

func wantList[T any](v any, want func(any) (T, error)) ([]T, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%v is not a list", v)
	}
	var out []T
	for _, e := range list {
		x, err := want(e)
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, nil
}

// checkExtraKeys compares decoded extra keys with canonical untyped ones
// (nil: no list) by decoding each entry with the reference decoder.
func checkExtraKeys(got [][]byte, want []any) error {
	if (got == nil) != (want == nil) || len(got) != len(want) {
		return fmt.Errorf("extra_keys %q, want %v", got, want)
	}
	for i, raw := range got {
		if raw == nil || want[i] == nil {
			if (raw == nil) != (want[i] == nil) {
				return fmt.Errorf("extra_keys[%d] %x, want %v", i, raw, want[i])
			}
			continue
		}
		v, err := reference(raw)
		if err != nil {
			return fmt.Errorf("extra_keys[%d] %x: %w", i, raw, err)
		}
		if !reflect.DeepEqual(canon(v), want[i]) {
			return fmt.Errorf("extra_keys[%d] %v, want %v", i, canon(v), want[i])
		}
	}
	return nil
}

func setTimestamp(ev KVEvent, at time.Time) {
	switch e := ev.(type) {
	case *BlockStoredEvent:
		e.Timestamp = at
	case *BlockRemovedEvent:
		e.Timestamp = at
	case *AllBlocksClearedEvent:
		e.Timestamp = at
	}
}
