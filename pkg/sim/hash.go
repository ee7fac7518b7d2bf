package sim

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// digest identifies one full block of a token sequence together with every
// token before it: the SHA-256 digest chained over the parent block's full
// digest.
type digest [sha256.Size]byte

// blockHash returns the block hash an engine sends on the wire for d: its low
// 64 bits, as vLLM derives its default integer form from a digest.
func (d digest) blockHash() kvevent.BlockHash {
	return kvevent.BlockHashFromDigest(d[:])
}

// blockHasher computes the chained block digests of token sequences for one
// engine:
//
//	root      = sha256(seed)
//	digest(i) = sha256(digest(i-1) or root || token ids of block i as
//	            4-byte big-endian integers || extra)
//
// The shape is vLLM's (a SHA-256 chain over the full parent digest, salted by
// a per-engine NONE_HASH), not its bytes: vLLM pickles a Python tuple. Two
// engines with different seeds name the same tokens differently, as two vLLM
// processes do unless PYTHONHASHSEED is pinned.
//
// A blockHasher is immutable and safe for concurrent use.
type blockHasher struct {
	root      digest
	blockSize int
}

// newBlockHasher returns a hasher for blocks of blockSize (> 0) tokens whose
// chains start from sha256(seed).
func newBlockHasher(seed string, blockSize int) *blockHasher {
	return &blockHasher{root: sha256.Sum256([]byte(seed)), blockSize: blockSize}
}

// appendDigests extends digests, which must hold the digests of the first
// len(digests) blocks of tokens, with the digests of the remaining full
// blocks of tokens, and returns the extended slice. A trailing partial block
// is not hashed. extra is mixed into every block (vLLM mixes in the LoRA
// adapter's name); nil for none.
func (h *blockHasher) appendDigests(digests []digest, tokens []uint32, extra []byte) []digest {
	parent := h.root
	if len(digests) > 0 {
		parent = digests[len(digests)-1]
	}
	h.chain(parent, len(digests), tokens, extra, func(d digest) bool {
		digests = append(digests, d)
		return true
	})
	return digests
}

// chain passes yield the digests of the full blocks of tokens from block
// from on, in order, until yield returns false; parent is the digest of
// block from-1 (the root for block 0). extra is as for appendDigests.
func (h *blockHasher) chain(parent digest, from int, tokens []uint32, extra []byte, yield func(digest) bool) {
	bs := h.blockSize
	full := len(tokens) / bs
	if from >= full {
		return
	}
	buf := make([]byte, sha256.Size+4*bs+len(extra))
	for i := from; i < full; i++ {
		copy(buf, parent[:])
		b := buf[sha256.Size:]
		for _, t := range tokens[i*bs : (i+1)*bs] {
			binary.BigEndian.PutUint32(b, t)
			b = b[4:]
		}
		copy(b, extra)
		parent = sha256.Sum256(buf)
		if !yield(parent) {
			return
		}
	}
}
