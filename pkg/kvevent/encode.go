package kvevent

import (
	"errors"
	"fmt"
	"math/bits"
)

// Layout is a wire layout of vLLM event batches, for AppendEventBatch.
type Layout int

const (
	// LayoutCurrent is what vLLM v0.24 and later send: the envelope
	// [ts, events, data_parallel_rank|nil] and each event as a map whose
	// first key "type" holds the tag, then the fields in declaration order.
	// Fields without a default in vLLM are always present (nil when unset);
	// the others only when set.
	LayoutCurrent Layout = iota
	// LayoutPositional is what vLLM v0.10 to v0.23 send: the same envelope,
	// and each event an array of the tag and every field through group_idx
	// (BlockStored: 9 fields, BlockRemoved: 3), nil when unset. A
	// BlockStored with a KVCacheSpecKind or KVCacheSpecSlidingWindow gets
	// both as two more elements, as the last positional releases sent them.
	LayoutPositional
	// LayoutV09 is what vLLM v0.9 sent: the envelope [ts, events] without a
	// rank, BlockStored as its tag and 5 fields (block_hashes,
	// parent_block_hash, token_ids, block_size, lora_id), BlockRemoved as
	// its tag and block_hashes. Block hashes are written as the signed
	// integers Python's hash() produced: hashes of 2^63 and above come out
	// negative.
	LayoutV09
)

// String names the layout.
func (l Layout) String() string {
	switch l {
	case LayoutCurrent:
		return "current"
	case LayoutPositional:
		return "positional"
	case LayoutV09:
		return "v0.9"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// EncodeEventBatch encodes b the way vLLM's current publisher does
// (LayoutCurrent): byte for byte what vLLM's msgspec encoder writes for the
// same values. Per-event timestamps are not encoded; the batch carries TS.
// The errors are those of AppendEventBatch.
func EncodeEventBatch(b *EventBatch) ([]byte, error) {
	if b == nil {
		return nil, errors.New("kvevent: encode nil batch")
	}
	return AppendEventBatch(make([]byte, 0, encodedSizeHint(b)), b, LayoutCurrent)
}

// AppendEventBatch appends the encoding of b in the given layout to dst and
// returns the extended buffer. It allocates only to grow dst, so encoding
// into a reused buffer does not allocate.
//
// It returns an error, and dst unchanged in length, when the batch holds
// something the layout cannot carry (for example a Locality in
// LayoutPositional, or a data-parallel rank, medium or group in LayoutV09),
// a value no vLLM sends (a negative BlockSize or KVCacheSpecSlidingWindow,
// a GroupIdx below NoGroup, a DataParallelRank below NoRank), an ExtraKeys
// entry that is not exactly one msgpack value, or an event that is nil or
// not one of this package's event types. Bytes beyond len(dst) may have been
// written even then.
func AppendEventBatch(dst []byte, b *EventBatch, layout Layout) ([]byte, error) {
	if b == nil {
		return dst, errors.New("kvevent: encode nil batch")
	}
	if layout < LayoutCurrent || layout > LayoutV09 {
		return dst, fmt.Errorf("kvevent: encode batch: unknown layout %v", layout)
	}
	if b.DataParallelRank < NoRank || layout == LayoutV09 && b.DataParallelRank != NoRank {
		return dst, fmt.Errorf("kvevent: encode batch in %v layout: cannot carry data_parallel_rank %d", layout, b.DataParallelRank)
	}
	out := dst
	if layout == LayoutV09 {
		out = appendArrayLen(out, 2)
	} else {
		out = appendArrayLen(out, 3)
	}
	out = appendFloat64(out, b.TS)
	out = appendArrayLen(out, len(b.Events))
	for i, ev := range b.Events {
		var err error
		if out, err = appendEvent(out, ev, layout); err != nil {
			return dst, fmt.Errorf("kvevent: encode event %d of batch in %v layout: %w", i, layout, err)
		}
	}
	if layout != LayoutV09 {
		if b.DataParallelRank == NoRank {
			out = appendNil(out)
		} else {
			out = appendUint(out, uint64(b.DataParallelRank))
		}
	}
	return out, nil
}

// shape describes how one event type is laid out.
type shape struct {
	tag string
	// known holds the fields the type declares, required those without a
	// default, which tagged maps always carry.
	known, required fieldSet
	// positional is the field order of positional events. LayoutPositional
	// writes legacyLen of them, or all when any of the rest is set;
	// LayoutV09 writes v09Len.
	positional        []field
	legacyLen, v09Len int
}

var (
	storedShape = shape{
		tag:   tagBlockStored,
		known: storedFields,
		required: 1<<fieldBlockHashes | 1<<fieldParentBlockHash | 1<<fieldTokenIDs | 1<<fieldBlockSize |
			1<<fieldLoraID | 1<<fieldMedium | 1<<fieldLoraName,
		positional: storedPositional,
		legacyLen:  9,
		v09Len:     5,
	}
	removedShape = shape{
		tag:        tagBlockRemoved,
		known:      removedFields,
		required:   1<<fieldBlockHashes | 1<<fieldMedium,
		positional: removedPositional,
		legacyLen:  3,
		v09Len:     1,
	}
	clearedShape = shape{tag: tagAllBlocksCleared}
)

// appendEvent appends one event. A BlockRemovedEvent is written through a
// BlockStoredEvent holding its fields, since its fields are a subset.
func appendEvent(dst []byte, ev KVEvent, layout Layout) ([]byte, error) {
	switch e := ev.(type) {
	case *BlockStoredEvent:
		if e != nil {
			return appendShaped(dst, e, &storedShape, layout)
		}
	case *BlockRemovedEvent:
		if e != nil {
			view := BlockStoredEvent{
				BlockHashes: e.BlockHashes,
				Medium:      e.Medium,
				GroupIdx:    e.GroupIdx,
				Locality:    e.Locality,
				Ownership:   e.Ownership,
			}
			return appendShaped(dst, &view, &removedShape, layout)
		}
	case *AllBlocksClearedEvent:
		if e != nil {
			return appendShaped(dst, &BlockStoredEvent{GroupIdx: NoGroup}, &clearedShape, layout)
		}
	default:
		return dst, fmt.Errorf("cannot encode event of type %T", ev)
	}
	return dst, fmt.Errorf("cannot encode event %T(nil)", ev)
}

// appendShaped appends event e as shape s in the layout. e holds no fields
// beyond those s declares.
func appendShaped(dst []byte, e *BlockStoredEvent, s *shape, layout Layout) ([]byte, error) {
	if err := check(e); err != nil {
		return dst, err
	}
	set := presentFields(e)
	signed := layout == LayoutV09
	if layout == LayoutCurrent {
		keys := set | s.required
		dst = appendMapLen(dst, 1+bits.OnesCount16(uint16(keys)))
		dst = appendStr(dst, tagKey)
		dst = appendStr(dst, s.tag)
		for f := range numFields {
			if keys.has(f) {
				dst = appendStr(dst, fieldNames[f])
				dst = appendField(dst, e, f, signed)
			}
		}
		return dst, nil
	}
	n := s.v09Len
	if layout == LayoutPositional {
		n = s.legacyLen
		if set&fieldsOf(s.positional[n:]) != 0 {
			n = len(s.positional)
		}
	}
	carried := fieldsOf(s.positional[:n])
	if lost := set &^ carried; lost != 0 {
		f := bits.TrailingZeros16(uint16(lost))
		return dst, fmt.Errorf("%s field %s cannot be carried by this layout", s.tag, fieldNames[f])
	}
	dst = appendArrayLen(dst, 1+n)
	dst = appendStr(dst, s.tag)
	for _, f := range s.positional[:n] {
		dst = appendField(dst, e, f, signed)
	}
	return dst, nil
}

func fieldsOf(fields []field) fieldSet {
	var s fieldSet
	for _, f := range fields {
		s |= 1 << f
	}
	return s
}

// check rejects values that no vLLM sends and that the decoder would refuse.
func check(e *BlockStoredEvent) error {
	switch {
	case e.BlockSize < 0:
		return fmt.Errorf("negative block_size %d", e.BlockSize)
	case e.GroupIdx < NoGroup:
		return fmt.Errorf("group_idx %d is neither a group nor NoGroup", e.GroupIdx)
	case e.KVCacheSpecSlidingWindow < 0:
		return fmt.Errorf("negative kv_cache_spec_sliding_window %d", e.KVCacheSpecSlidingWindow)
	}
	for i, k := range e.ExtraKeys {
		if k == nil {
			continue
		}
		r := reader{buf: k}
		if r.skip() != nil || r.off != len(k) {
			return fmt.Errorf("extra_keys[%d] is not exactly one msgpack value", i)
		}
	}
	return nil
}

// presentFields returns the fields of e that hold something other than their
// zero value (NoGroup for GroupIdx, no parent for ParentBlockHash).
func presentFields(e *BlockStoredEvent) fieldSet {
	var s fieldSet
	add := func(f field, present bool) {
		if present {
			s |= 1 << f
		}
	}
	add(fieldBlockHashes, len(e.BlockHashes) > 0)
	add(fieldParentBlockHash, e.HasParent)
	add(fieldTokenIDs, len(e.TokenIDs) > 0)
	add(fieldBlockSize, e.BlockSize != 0)
	add(fieldLoraID, e.LoraID != 0)
	add(fieldMedium, e.Medium != "")
	add(fieldLoraName, e.LoraName != "")
	add(fieldExtraKeys, e.ExtraKeys != nil)
	add(fieldGroupIdx, e.GroupIdx != NoGroup)
	add(fieldSpecKind, e.KVCacheSpecKind != "")
	add(fieldSlidingWindow, e.KVCacheSpecSlidingWindow != 0)
	add(fieldLocality, e.Locality != "")
	add(fieldOwnership, e.Ownership != "")
	add(fieldSessionID, e.SessionID != "")
	return s
}

// appendField appends the value of field f of e, nil when unset. Hashes are
// written as signed integers when signed is set.
func appendField(dst []byte, e *BlockStoredEvent, f field, signed bool) []byte {
	switch f {
	case fieldBlockHashes:
		dst = appendArrayLen(dst, len(e.BlockHashes))
		for _, h := range e.BlockHashes {
			dst = appendHash(dst, h, signed)
		}
		return dst
	case fieldParentBlockHash:
		if !e.HasParent {
			return appendNil(dst)
		}
		return appendHash(dst, e.ParentBlockHash, signed)
	case fieldTokenIDs:
		dst = appendArrayLen(dst, len(e.TokenIDs))
		for _, t := range e.TokenIDs {
			if t <= 0x7f {
				dst = append(dst, byte(t))
			} else {
				dst = appendUint(dst, uint64(t))
			}
		}
		return dst
	case fieldBlockSize:
		return appendInt(dst, int64(e.BlockSize))
	case fieldLoraID:
		return appendOptInt(dst, e.LoraID, 0)
	case fieldExtraKeys:
		if e.ExtraKeys == nil {
			return appendNil(dst)
		}
		dst = appendArrayLen(dst, len(e.ExtraKeys))
		for _, k := range e.ExtraKeys {
			if k == nil {
				dst = appendNil(dst)
			} else {
				dst = append(dst, k...)
			}
		}
		return dst
	case fieldGroupIdx:
		return appendOptInt(dst, e.GroupIdx, NoGroup)
	case fieldSlidingWindow:
		return appendOptInt(dst, e.KVCacheSpecSlidingWindow, 0)
	}
	return appendOptStr(dst, stringField(e, f))
}

// stringField returns the value of a string field of e.
func stringField(e *BlockStoredEvent, f field) string {
	switch f {
	case fieldMedium:
		return e.Medium
	case fieldLoraName:
		return e.LoraName
	case fieldSpecKind:
		return e.KVCacheSpecKind
	case fieldLocality:
		return e.Locality
	case fieldOwnership:
		return e.Ownership
	default:
		return e.SessionID
	}
}

func appendHash(dst []byte, h BlockHash, signed bool) []byte {
	if signed {
		return appendInt(dst, int64(h))
	}
	return appendUint(dst, h)
}

// appendOptInt appends v, or nil when v is the value that stands for None.
func appendOptInt(dst []byte, v, none int) []byte {
	if v == none {
		return appendNil(dst)
	}
	return appendInt(dst, int64(v))
}

// appendOptStr appends s, or nil when s is "".
func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return appendNil(dst)
	}
	return appendStr(dst, s)
}

// encodedSizeHint returns an upper bound of the size of the current-layout
// encoding of b: the largest encoding of every value plus every key.
func encodedSizeHint(b *EventBatch) int {
	const (
		envelope   = 1 + 9 + 5 + 9
		eventFixed = 320 // map header, tag, every key, scalar values, headers
	)
	n := envelope
	for _, ev := range b.Events {
		n += eventFixed
		switch e := ev.(type) {
		case *BlockStoredEvent:
			if e == nil {
				continue
			}
			n += 9*len(e.BlockHashes) + 5*len(e.TokenIDs) + len(e.ExtraKeys)
			n += len(e.Medium) + len(e.LoraName) + len(e.KVCacheSpecKind) + len(e.Locality) + len(e.Ownership) + len(e.SessionID)
			for _, k := range e.ExtraKeys {
				n += len(k)
			}
		case *BlockRemovedEvent:
			if e == nil {
				continue
			}
			n += 9*len(e.BlockHashes) + len(e.Medium) + len(e.Locality) + len(e.Ownership)
		}
	}
	return n
}
