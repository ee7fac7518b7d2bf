package kvevent

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The readers of event fields. Each reads one value into the event record or
// the decoder's scratch buffers, and checks it against vLLM's types.

// decodeField decodes the value of field f into rec.
func (d *decoder) decodeField(f field, rec *eventRec) error {
	d.field = fieldNames[f]
	var err error
	switch f {
	case fieldBlockHashes:
		rec.hashes, err = d.hashList()
	case fieldParentBlockHash:
		rec.hasParent = !d.r.tryNil()
		if rec.hasParent {
			rec.parent, err = d.hash()
		}
	case fieldTokenIDs:
		rec.tokens, err = d.tokenList()
	case fieldBlockSize:
		rec.blockSize, err = d.integer(false)
	case fieldLoraID:
		rec.loraID, err = d.optInteger(0, true)
	case fieldMedium:
		rec.medium, err = d.optString()
	case fieldLoraName:
		rec.loraName, err = d.optString()
	case fieldExtraKeys:
		rec.extras, rec.hasExtras, err = d.extraKeys()
	case fieldGroupIdx:
		rec.groupIdx, err = d.optInteger(NoGroup, false)
	case fieldSpecKind:
		rec.specKind, err = d.optString()
	case fieldSlidingWindow:
		rec.window, err = d.optInteger(0, false)
	case fieldLocality:
		rec.locality, err = d.optString()
	case fieldOwnership:
		rec.ownership, err = d.optString()
	case fieldSessionID:
		rec.sessionID, err = d.optString()
	}
	if err == nil {
		d.field = ""
	}
	return err
}

// hash reads one block hash: an integer of any width and sign, or a
// non-empty digest.
func (d *decoder) hash() (BlockHash, error) {
	c, err := d.r.peek()
	if err != nil {
		return 0, err
	}
	if isInt(c) {
		u, _, err := d.r.integer()
		return u, err
	}
	if binHeader.is(c) {
		start := d.r.off
		b, err := d.r.data(&binHeader)
		if err != nil {
			return 0, err
		}
		if len(b) == 0 {
			return 0, d.r.failf(start, "block hash is an empty digest")
		}
		return BlockHashFromDigest(b), nil
	}
	return 0, d.r.failf(d.r.off, "expected block hash as int or bin, got %s", typeName(c))
}

// hashList reads an array of block hashes into the scratch buffer.
func (d *decoder) hashList() (span, error) {
	start := d.r.off
	n, err := d.r.arrayLen()
	if err != nil {
		return span{}, err
	}
	if err := d.charge(start, n*hashCost); err != nil {
		return span{}, err
	}
	lo, dst := extend(&d.hashes, n)
	for i := range dst {
		if dst[i], err = d.hash(); err != nil {
			return span{}, err
		}
	}
	return span{lo, lo + n}, nil
}

// extend lengthens *s by n elements and returns where they start and them.
// It grows *s by a quarter of its capacity at a time (at least 16 elements),
// or exactly to what it must hold if that is more, so that filling it list
// by list stays linear and its spare capacity stays within a quarter of
// what it holds, once it holds more than 64 elements.
func extend[T any](s *[]T, n int) (int, []T) {
	lo := len(*s)
	if c := cap(*s); c-lo < n {
		grown := make([]T, lo, max(lo+n, c+max(c/4, 16)))
		copy(grown, *s)
		*s = grown
	}
	*s = (*s)[:lo+n]
	return lo, (*s)[lo:]
}

// tokenList reads an array of token ids into the scratch buffer.
func (d *decoder) tokenList() (span, error) {
	start := d.r.off
	n, err := d.r.arrayLen()
	if err != nil {
		return span{}, err
	}
	if err := d.charge(start, n*tokenCost); err != nil {
		return span{}, err
	}
	lo, dst := extend(&d.tokens, n)
	buf := d.r.buf
	for i := range dst {
		off := d.r.off
		if v, size := unsignedUint32(buf, off); size > 0 {
			dst[i] = v
			d.r.off += size
			continue
		}
		u, neg, err := d.r.integer()
		if err != nil {
			return span{}, err
		}
		if neg || u > math.MaxUint32 {
			return span{}, d.r.failf(off, "token id %s does not fit uint32", formatInt(u, neg))
		}
		dst[i] = uint32(u)
	}
	return span{lo, lo + n}, nil
}

// unsignedUint32 reads a positive fixint, uint8, uint16 or uint32 at off,
// the encodings of token ids, and returns it and its size, or size 0 for
// anything else.
func unsignedUint32(buf []byte, off int) (uint32, int) {
	if off >= len(buf) {
		return 0, 0
	}
	switch c := buf[off]; {
	case c <= 0x7f:
		return uint32(c), 1
	case c == 0xcc && off+2 <= len(buf):
		return uint32(buf[off+1]), 2
	case c == 0xcd && off+3 <= len(buf):
		return uint32(binary.BigEndian.Uint16(buf[off+1:])), 3
	case c == 0xce && off+5 <= len(buf):
		return binary.BigEndian.Uint32(buf[off+1:]), 5
	}
	return 0, 0
}

// extraKeys reads extra_keys: nil, or an array holding per block nil or any
// value, whose bytes are kept.
func (d *decoder) extraKeys() (span, bool, error) {
	if d.r.tryNil() {
		return span{}, false, nil
	}
	start := d.r.off
	n, err := d.r.arrayLen()
	if err != nil {
		return span{}, false, err
	}
	if err := d.charge(start, n*extraCost); err != nil {
		return span{}, false, err
	}
	lo, dst := extend(&d.extras, n)
	for i := range dst {
		if d.r.tryNil() {
			dst[i] = span{-1, -1}
			continue
		}
		off := d.r.off
		if err := d.r.skip(); err != nil {
			return span{}, false, err
		}
		dst[i] = span{off, d.r.off}
	}
	if err := d.charge(start, d.r.off-start); err != nil {
		return span{}, false, err
	}
	return span{lo, lo + n}, true, nil
}

// integer reads an integer that fits an int, and that is not negative
// unless negativeOK.
func (d *decoder) integer(negativeOK bool) (int, error) {
	start := d.r.off
	u, neg, err := d.r.integer()
	if err != nil {
		return 0, err
	}
	switch v := int64(u); {
	case neg && !negativeOK:
		return 0, d.r.failf(start, "%d is negative", v)
	case neg && v >= math.MinInt, !neg && u <= math.MaxInt:
		return int(v), nil
	}
	return 0, d.r.failf(start, "%s does not fit an int", formatInt(u, neg))
}

// optInteger reads nil, as none, or an integer as integer does.
func (d *decoder) optInteger(none int, negativeOK bool) (int, error) {
	if d.r.tryNil() {
		return none, nil
	}
	return d.integer(negativeOK)
}

// optString reads nil (as "") or a string.
func (d *decoder) optString() (string, error) {
	if d.r.tryNil() {
		return "", nil
	}
	start := d.r.off
	b, err := d.r.data(&strHeader)
	if err != nil {
		return "", err
	}
	s, copied := internString(b)
	return s, d.charge(start, copied)
}

// formatInt formats an integer read by reader.integer, for errors.
func formatInt(u uint64, neg bool) string {
	if neg {
		return fmt.Sprint(int64(u))
	}
	return fmt.Sprint(u)
}
