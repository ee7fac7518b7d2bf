package tokenizer

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// digest identifies a tokenization in the cache: a 128-bit XXH3 hash of the
// form, the model and every field that changes the result.
//
// XXH3 is not a cryptographic hash. Each Tokenizer seeds it at random, and
// the worst a collision can do is route a request by another prompt's
// tokens: it never changes what the engine computes.
type digest struct{ hi, lo uint64 }

// keyBuilder accumulates the hashes of a request's fields in a fixed buffer
// on the stack, then hashes the buffer. Hashing each field on its own keeps
// XXH3's vectorised path for the large ones (the messages) and makes the
// encoding unambiguous: every field contributes its 128-bit hash and its
// length, whatever its content.
type keyBuilder struct {
	seed uint64
	n    int
	buf  [keyFields*24 + 8]byte
}

// keyFields is the most fields a key holds besides its flags.
const keyFields = 9

// flags records the form and the request's booleans.
func (k *keyBuilder) flags(form byte, bools ...bool) {
	k.buf[k.n] = form
	for i, b := range bools {
		if b {
			k.buf[k.n+1+i] = 1
		}
	}
	k.n += 8
}

func (k *keyBuilder) str(s string) {
	h := xxh3.HashString128Seed(s, k.seed)
	k.put(h.Hi, h.Lo, len(s))
}

func (k *keyBuilder) raw(b []byte) {
	h := xxh3.Hash128Seed(b, k.seed)
	k.put(h.Hi, h.Lo, len(b))
}

func (k *keyBuilder) put(hi, lo uint64, n int) {
	binary.LittleEndian.PutUint64(k.buf[k.n:], hi)
	binary.LittleEndian.PutUint64(k.buf[k.n+8:], lo)
	binary.LittleEndian.PutUint64(k.buf[k.n+16:], uint64(n))
	k.n += 24
}

// chain returns the digest of d followed by b.
func (d digest) chain(b []byte) digest {
	h := xxh3.Hash128Seed(b, d.lo)
	var buf [40]byte
	binary.LittleEndian.PutUint64(buf[0:], d.hi)
	binary.LittleEndian.PutUint64(buf[8:], d.lo)
	binary.LittleEndian.PutUint64(buf[16:], h.Hi)
	binary.LittleEndian.PutUint64(buf[24:], h.Lo)
	binary.LittleEndian.PutUint64(buf[32:], uint64(len(b)))
	s := xxh3.Hash128Seed(buf[:], d.hi)
	return digest{hi: s.Hi, lo: s.Lo}
}

func (k *keyBuilder) sum() digest {
	h := xxh3.Hash128Seed(k.buf[:k.n], k.seed)
	return digest{hi: h.Hi, lo: h.Lo}
}
