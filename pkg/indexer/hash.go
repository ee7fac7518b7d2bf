package indexer

import (
	"encoding/binary"
	"math/bits"
)

// Keys are kvgate's own names for prefixes of token blocks. A model (and
// adapter) gets a root key; block i of a prompt gets
//
//	key(i) = mum(key(i-1), digest of block i's tokens, its length and extra keys)
//
// so a key names the whole prefix that ends with its block, as an engine's
// block hash does. Keys are 64-bit, never 0 (0 marks an empty table slot),
// and salted by a per-table random secret, so a prompt cannot be crafted to
// collide with another one's key. A block's digest does not depend on its
// parent: the CPU digests the blocks of a prompt in parallel, and only one
// multiply per block chains them.

// Odd mixing constants: the golden ratio and the multipliers of splitmix64.
const (
	mixA = 0x9e3779b97f4a7c15
	mixB = 0xbf58476d1ce4e5b9
	mixC = 0x94d049bb133111eb
	mixD = 0xd6e8feb86659fd93
)

// mum folds the 128-bit product of a and b into 64 bits.
func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// keyer keys prefixes with one table's secret: seed roots the models, and
// every product of a block digest has a secret word in each operand, so no
// choice of tokens zeroes one.
type keyer struct {
	seed uint64
	s    [4]uint64
	// lane places engine hashes in lane maps (see laneMap).
	lane laneSalt
}

func newKeyer(seed uint64) keyer {
	k := keyer{seed: seed}
	x := seed
	for i := range k.s {
		x += mixA
		k.s[i] = mum(x^mixB, mixC)
	}
	for i := range k.lane {
		x += mixA
		k.lane[i] = mum(x^mixD, mixB)
	}
	return k
}

// block is the key of a block of toks that extends the prefix named
// parent; extra is the digest of the block's extra keys, 0 for none.
func (k *keyer) block(parent uint64, toks []uint32, extra uint64) uint64 {
	n := len(toks)
	h := k.s[0]
	for len(toks) >= 8 {
		a := uint64(toks[0]) | uint64(toks[1])<<32
		b := uint64(toks[2]) | uint64(toks[3])<<32
		c := uint64(toks[4]) | uint64(toks[5])<<32
		d := uint64(toks[6]) | uint64(toks[7])<<32
		// The second product does not depend on h, so the two run in
		// parallel: one multiply of latency per 8 tokens.
		h = mum(a^h^k.s[1], b^k.s[2]) ^ mum(c^k.s[3], d^k.s[0])
		toks = toks[8:]
	}
	for _, v := range toks {
		h = mum(h^uint64(v)^k.s[1], k.s[2])
	}
	return usable(mum(parent^mixC, h^extra^uint64(n)^mixD))
}

// usable maps the two hash values that mark empty slots and tombstones to
// other values.
func usable(h uint64) uint64 {
	if h <= deadKey {
		return mixA + h
	}
	return h
}

// root is the key of the empty prefix of a model served with a LoRA
// adapter: lora is the adapter name, "" for the base model.
func (k *keyer) root(model, lora string) uint64 {
	h := hashString(k.seed^mixA, model)
	if lora != "" {
		h = hashString(mum(h^mixB, 1), lora)
	}
	return usable(mum(h^mixC, mixD))
}

// hashString mixes s into h, length included.
func hashString[S ~string | ~[]byte](h uint64, s S) uint64 {
	h = mum(h^mixA, uint64(len(s))^mixB)
	for len(s) >= 8 {
		v := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
		h = mum(h^v, mixC)
		s = s[8:]
	}
	var t uint64
	for i := 0; i < len(s); i++ {
		t |= uint64(s[i]) << (8 * i)
	}
	return mum(h^t^mixD, mixB)
}

// extraDigest digests the msgpack extra keys vLLM mixed into one block's hash
// (an array of LoRA name, multimodal items, cache_salt, prompt-embedding
// digests), leaving out a leading element equal to the adapter name, which
// the root key already carries. It returns 0 when nothing else remains, so
// a plain-text block of an adapter matches the adapter's plain prompts, and
// a nonzero digest otherwise, so that blocks carrying images, salts or
// embeddings never match a prompt of plain tokens. Bytes that are not a
// well-formed array are digested whole: such blocks match no prompt.
func extraDigest(raw []byte, lora string) uint64 {
	if len(raw) == 0 || raw[0] == 0xc0 {
		return 0
	}
	count, rest, ok := msgpackArrayHeader(raw)
	if !ok {
		return digestBytes(raw)
	}
	if count > 0 && lora != "" {
		if s, after, ok := msgpackString(rest); ok && string(s) == lora {
			count, rest = count-1, after
		}
	}
	if count == 0 {
		return 0
	}
	h := digestBytes(rest) ^ uint64(count)*mixC
	if h == 0 {
		return mixD
	}
	return h
}

// digestBytes is a nonzero digest of b.
func digestBytes(b []byte) uint64 {
	h := hashString(mixB, b)
	if h == 0 {
		return mixC
	}
	return h
}

// msgpackArrayHeader reads the header of a msgpack array: the element count
// and the bytes after the header.
func msgpackArrayHeader(b []byte) (count int, rest []byte, ok bool) {
	switch c := b[0]; {
	case c&0xf0 == 0x90:
		return int(c & 0x0f), b[1:], true
	case c == 0xdc && len(b) >= 3:
		return int(binary.BigEndian.Uint16(b[1:3])), b[3:], true
	case c == 0xdd && len(b) >= 5:
		return int(binary.BigEndian.Uint32(b[1:5])), b[5:], true
	}
	return 0, nil, false
}

// msgpackString reads one msgpack string from the start of b, checking its
// length against the bytes that remain.
func msgpackString(b []byte) (s, rest []byte, ok bool) {
	if len(b) == 0 {
		return nil, nil, false
	}
	var n, hdr int
	switch c := b[0]; {
	case c&0xe0 == 0xa0:
		n, hdr = int(c&0x1f), 1
	case c == 0xd9 && len(b) >= 2:
		n, hdr = int(b[1]), 2
	case c == 0xda && len(b) >= 3:
		n, hdr = int(binary.BigEndian.Uint16(b[1:3])), 3
	case c == 0xdb && len(b) >= 5:
		n, hdr = int(binary.BigEndian.Uint32(b[1:5])), 5
	default:
		return nil, nil, false
	}
	if n > len(b)-hdr {
		return nil, nil, false
	}
	return b[hdr : hdr+n], b[hdr+n:], true
}
