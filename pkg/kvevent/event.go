package kvevent

import (
	"math"
	"time"
)

// EventType names the kind of a KVEvent.
type EventType string

const (
	// EventTypeBlockStored reports blocks that became resident in a KV cache.
	EventTypeBlockStored EventType = "BLOCK_STORED"
	// EventTypeBlockRemoved reports blocks that were evicted from a KV cache.
	EventTypeBlockRemoved EventType = "BLOCK_REMOVED"
	// EventTypeAllCleared reports that an engine dropped its whole KV cache
	// (vLLM's reset_prefix_cache).
	EventTypeAllCleared EventType = "ALL_BLOCKS_CLEARED"
)

// Storage media named by vLLM in the medium field of an event. An event
// without a medium (vLLM before v0.10) describes the GPU cache. Connectors may
// send other values, which are kept as they are.
const (
	MediumGPU     = "GPU"
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
)

// NoGroup is the GroupIdx of an event that names no KV-cache group: vLLM
// before group_idx existed, or a connector that leaves it unset. Such an event
// belongs to the engine's only group, group 0.
const NoGroup = -1

// NoRank is the DataParallelRank of a batch that carries none: vLLM v0.9's
// two-element envelope, or an explicit nil.
const NoRank = -1

// KVEvent is one decoded KV-cache event: *BlockStoredEvent,
// *BlockRemovedEvent or *AllBlocksClearedEvent.
type KVEvent interface {
	// GetType reports which kind of event this is.
	GetType() EventType
	// GetTimestamp reports when the engine published the batch holding the
	// event (vLLM stamps batches, not events).
	GetTimestamp() time.Time
}

// BlockHash is an engine's identifier for one KV-cache block, normalised to
// 64 bits when the event is decoded.
//
// vLLM sends block hashes in three forms: an unsigned msgpack integer of any
// width (the default since v0.10.2: the low 64 bits of a 32-byte digest), a
// possibly negative int64 (v0.9 to v0.10.1, Python's hash()), or the 32 raw
// digest bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0). Integers are kept as
// their 64-bit two's-complement pattern and byte strings become their last 8
// bytes read big-endian (BlockHashFromDigest), which is exactly how vLLM
// derives its integer form from a digest. So one engine names a block by the same BlockHash whichever
// form it is configured to send, and a parent hash always compares equal to
// the hash its parent block was stored under.
type BlockHash = uint64

// BlockStoredEvent reports that an engine stored new blocks of one request in
// its KV cache.
type BlockStoredEvent struct {
	// Timestamp is the time of the batch that carried the event.
	Timestamp time.Time
	// BlockHashes names the new blocks in chain order: block i+1 extends the
	// prefix that ends with block i.
	BlockHashes []BlockHash
	// ParentBlockHash is the hash of the block that precedes BlockHashes[0];
	// it is meaningful only when HasParent is set. An event without a parent
	// starts at the first token of the prompt.
	ParentBlockHash BlockHash
	HasParent       bool
	// TokenIDs holds the tokens of all new blocks, concatenated: BlockSize
	// tokens per block. Engines that drop some hashes (sparse or null blocks)
	// may send more tokens than len(BlockHashes)*BlockSize.
	TokenIDs []uint32
	// BlockSize is the number of tokens per block in this event's KV-cache
	// group.
	BlockSize int
	// LoraID is the engine's adapter id, 0 when none (vLLM's adapter ids
	// start at 1). vLLM deprecates it in favour of LoraName.
	LoraID int
	// LoraName names the LoRA adapter the blocks were computed with, "" for
	// the base model.
	LoraName string
	// Medium is where the blocks live: MediumGPU, MediumCPU, MediumStorage or
	// another connector-defined tier; "" when the engine does not say.
	Medium string
	// ExtraKeys holds, per block, the msgpack encoding of the extra values
	// vLLM mixed into that block's hash (LoRA name, multimodal items,
	// cache_salt, prompt-embedding digests), or nil for a block without any.
	// ExtraKeys itself is nil when the event carries no list.
	ExtraKeys [][]byte
	// GroupIdx is the KV-cache group of the blocks (hybrid models store the
	// same hashes once per group), or NoGroup.
	GroupIdx int
	// KVCacheSpecKind describes the group's attention, e.g. "full_attention"
	// or "sliding_window"; "" when not sent.
	KVCacheSpecKind string
	// KVCacheSpecSlidingWindow is the group's window in tokens, 0 when not
	// sent.
	KVCacheSpecSlidingWindow int
	// Locality, Ownership and SessionID are newer optional vLLM fields, ""
	// when not sent.
	Locality  string
	Ownership string
	SessionID string
}

// BlockRemovedEvent reports that an engine evicted blocks from one medium of
// its KV cache.
type BlockRemovedEvent struct {
	// Timestamp is the time of the batch that carried the event.
	Timestamp time.Time
	// BlockHashes names the evicted blocks. vLLM's GPU block pool sends one
	// hash per event; offloading connectors may send several.
	BlockHashes []BlockHash
	// Medium is the tier the blocks left; "" when the engine does not say.
	Medium string
	// GroupIdx is the KV-cache group the blocks left, or NoGroup.
	GroupIdx int
	// Locality and Ownership are newer optional vLLM fields, "" when not sent.
	Locality  string
	Ownership string
}

// AllBlocksClearedEvent reports that an engine dropped every block of its KV
// cache.
type AllBlocksClearedEvent struct {
	// Timestamp is the time of the batch that carried the event.
	Timestamp time.Time
}

// GetType reports EventTypeBlockStored.
func (e *BlockStoredEvent) GetType() EventType { return EventTypeBlockStored }

// GetTimestamp reports the time of the batch that carried the event.
func (e *BlockStoredEvent) GetTimestamp() time.Time { return e.Timestamp }

// GetType reports EventTypeBlockRemoved.
func (e *BlockRemovedEvent) GetType() EventType { return EventTypeBlockRemoved }

// GetTimestamp reports the time of the batch that carried the event.
func (e *BlockRemovedEvent) GetTimestamp() time.Time { return e.Timestamp }

// GetType reports EventTypeAllCleared.
func (e *AllBlocksClearedEvent) GetType() EventType { return EventTypeAllCleared }

// GetTimestamp reports the time of the batch that carried the event.
func (e *AllBlocksClearedEvent) GetTimestamp() time.Time { return e.Timestamp }

// EventBatch is the payload of one message of a vLLM KV-event stream: the
// events one scheduler step produced, in the order the engine applied them.
type EventBatch struct {
	// TS is the publish time in seconds since the Unix epoch, as vLLM sends
	// it.
	TS float64
	// Events are *BlockStoredEvent, *BlockRemovedEvent and
	// *AllBlocksClearedEvent values, each stamped with the batch time.
	Events []KVEvent
	// DataParallelRank is the rank of the engine that published the batch,
	// or NoRank.
	DataParallelRank int
}

// Time converts the batch timestamp to a time.Time.
func (b *EventBatch) Time() time.Time { return TimeFromTS(b.TS) }

// TimeFromTS converts vLLM's float seconds since the epoch to a time.Time
// with microsecond precision (the precision of a float64 at today's epoch).
func TimeFromTS(ts float64) time.Time {
	if math.IsNaN(ts) || math.IsInf(ts, 0) {
		return time.Time{}
	}
	sec, frac := math.Modf(ts)
	return time.Unix(int64(sec), int64(math.Round(frac*1e6))*1e3)
}
