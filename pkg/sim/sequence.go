package sim

import (
	"encoding/binary"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// Sequence is the KV-cache state of one request: its tokens (prompt, then
// sampled output), the digests of its full blocks, and the blocks it holds.
// It is created by KVCache.NewSequence and changed only through the KVCache
// that created it and Append.
type Sequence struct {
	hasher  *blockHasher
	tokens  []uint32
	digests []digest
	// blocks holds the request's blocks in token order; the first
	// numCachedBlocks of them are cached.
	blocks          []int32
	numCachedBlocks int
	lora            *LoRA
	// hashExtra is mixed into every block digest; eventExtra is the msgpack
	// encoding of the same values that BlockStored events carry per block.
	hashExtra  []byte
	eventExtra []byte
}

// Len reports the number of tokens of s.
func (s *Sequence) Len() int { return len(s.tokens) }

// Tokens returns the tokens of s. The slice is shared: the caller must not
// modify it, and it is valid until the next Append.
func (s *Sequence) Tokens() []uint32 { return s.tokens }

// NumBlocks reports how many blocks s holds.
func (s *Sequence) NumBlocks() int { return len(s.blocks) }

// Append adds a sampled token to s, hashing the block it completes.
func (s *Sequence) Append(tok uint32) {
	s.tokens = append(s.tokens, tok)
	s.digests = s.hasher.appendDigests(s.digests, s.tokens, s.hashExtra)
}

// storedEvent describes blocks [from, to) of s as vLLM's BlockPool does: the
// hashes in chain order, the parent of the first one, the tokens they hold.
func (s *Sequence) storedEvent(from, to int) *kvevent.BlockStoredEvent {
	bs := s.hasher.blockSize
	ev := &kvevent.BlockStoredEvent{
		BlockHashes:     make([]kvevent.BlockHash, to-from),
		TokenIDs:        append([]uint32(nil), s.tokens[from*bs:to*bs]...),
		BlockSize:       bs,
		Medium:          kvevent.MediumGPU,
		ExtraKeys:       make([][]byte, to-from),
		GroupIdx:        0,
		KVCacheSpecKind: "full_attention",
	}
	for i := from; i < to; i++ {
		ev.BlockHashes[i-from] = s.digests[i].blockHash()
		ev.ExtraKeys[i-from] = s.eventExtra
	}
	if from > 0 {
		ev.ParentBlockHash, ev.HasParent = s.digests[from-1].blockHash(), true
	}
	if s.lora != nil {
		ev.LoraID, ev.LoraName = s.lora.ID, s.lora.Name
	}
	return ev
}

// msgpackStrArray encodes the one-element array [str] in msgpack, the form
// of a block's extra keys when only a LoRA name was mixed into its hash.
func msgpackStrArray(str string) []byte {
	b := []byte{0x91}
	switch n := len(str); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n < 1<<8:
		b = append(b, 0xd9, byte(n))
	case n < 1<<16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, str...)
}
