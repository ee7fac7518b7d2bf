package kvevent

import "encoding/binary"

// The names vLLM uses on the wire: event tags (the Python class names), the
// map key that carries them, and the fields of BlockStored and BlockRemoved in
// declaration order, which is also their order in positional events.

const (
	tagKey              = "type"
	tagBlockStored      = "BlockStored"
	tagBlockRemoved     = "BlockRemoved"
	tagAllBlocksCleared = "AllBlocksCleared"
)

// field identifies one event field vLLM sends.
type field uint8

const (
	fieldBlockHashes field = iota
	fieldParentBlockHash
	fieldTokenIDs
	fieldBlockSize
	fieldLoraID
	fieldMedium
	fieldLoraName
	fieldExtraKeys
	fieldGroupIdx
	fieldSpecKind
	fieldSlidingWindow
	fieldLocality
	fieldOwnership
	fieldSessionID
	numFields
)

// fieldNames holds each field's key in tagged-map events.
var fieldNames = [numFields]string{
	fieldBlockHashes:     "block_hashes",
	fieldParentBlockHash: "parent_block_hash",
	fieldTokenIDs:        "token_ids",
	fieldBlockSize:       "block_size",
	fieldLoraID:          "lora_id",
	fieldMedium:          "medium",
	fieldLoraName:        "lora_name",
	fieldExtraKeys:       "extra_keys",
	fieldGroupIdx:        "group_idx",
	fieldSpecKind:        "kv_cache_spec_kind",
	fieldSlidingWindow:   "kv_cache_spec_sliding_window",
	fieldLocality:        "locality",
	fieldOwnership:       "ownership",
	fieldSessionID:       "session_id",
}

// Positional events list their fields after the tag in this order; each vLLM
// version sends a prefix of it. Fields added after vLLM stopped sending
// positional events (locality, ownership, session_id) never appear here.
var (
	storedPositional  = []field{fieldBlockHashes, fieldParentBlockHash, fieldTokenIDs, fieldBlockSize, fieldLoraID, fieldMedium, fieldLoraName, fieldExtraKeys, fieldGroupIdx, fieldSpecKind, fieldSlidingWindow}
	removedPositional = []field{fieldBlockHashes, fieldMedium, fieldGroupIdx}
)

// fieldSet is a set of fields, one bit per field.
type fieldSet uint16

func (s fieldSet) has(f field) bool { return s&(1<<f) != 0 }

const (
	storedFields  fieldSet = 1<<numFields - 1
	removedFields fieldSet = 1<<fieldBlockHashes | 1<<fieldMedium | 1<<fieldGroupIdx | 1<<fieldLocality | 1<<fieldOwnership
)

// lookupField returns the field a map key names. vLLM writes keys in
// declaration order, so the field after the previous one is tried first.
func lookupField(key []byte, next field) (field, bool) {
	if next < numFields && string(key) == fieldNames[next] {
		return next, true
	}
	for f, name := range fieldNames[:] {
		if string(key) == name {
			return field(f), true
		}
	}
	return 0, false
}

// eventTypeOfTag returns the event type a vLLM tag names.
func eventTypeOfTag(tag []byte) (EventType, bool) {
	switch string(tag) {
	case tagBlockStored:
		return EventTypeBlockStored, true
	case tagBlockRemoved:
		return EventTypeBlockRemoved, true
	case tagAllBlocksCleared:
		return EventTypeAllCleared, true
	}
	return "", false
}

// BlockHashFromDigest returns the BlockHash of a block whose hash arrives as
// raw digest bytes: the last 8 bytes read big-endian, zero-extended when the
// digest is shorter. For vLLM's 32-byte digests this is exactly the integer
// vLLM sends instead when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is on,
// int.from_bytes(digest, "big") & (2**64 - 1), so both forms of one block
// compare equal.
func BlockHashFromDigest(digest []byte) BlockHash {
	if len(digest) >= 8 {
		return binary.BigEndian.Uint64(digest[len(digest)-8:])
	}
	var h BlockHash
	for _, b := range digest {
		h = h<<8 | BlockHash(b)
	}
	return h
}

// commonStrings holds the values of medium, kv_cache_spec_kind and locality
// that vLLM sends, so decoding them does not allocate.
var commonStrings = func() map[string]string {
	m := make(map[string]string)
	for _, s := range []string{
		MediumGPU, MediumCPU, MediumStorage, "FS", "OBJ",
		"full_attention", "mla_attention", "sliding_window", "sliding_window_mla", "mamba",
		"chunked_local_attention", "sink_full_attention", "encoder_only_attention",
		"cross_attention", "unknown",
		"LOCAL", "REMOTE",
	} {
		m[s] = s
	}
	return m
}()

// internString returns b as a string, sharing the common values, and the
// bytes it copied.
func internString(b []byte) (string, int) {
	if s, ok := commonStrings[string(b)]; ok {
		return s, 0
	}
	return string(b), len(b)
}
