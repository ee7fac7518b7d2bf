package kvevent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// This file holds the msgpack primitives the codec is built on: a reader that
// checks every length against the bytes that remain before trusting it, and
// append-style writers that pick the smallest encoding the way msgspec does.

var errTruncated = errors.New("unexpected end of payload")

// reader walks one msgpack payload. Every method either consumes a whole
// element and advances off past it, or returns a *DecodeError whose Offset is
// where the element starts and leaves off unspecified.
type reader struct {
	buf []byte
	off int
}

func (r *reader) remaining() int { return len(r.buf) - r.off }

// failf reports a problem with the element that starts at off.
func (r *reader) failf(off int, format string, args ...any) error {
	return &DecodeError{Offset: off, Event: -1, Err: fmt.Errorf(format, args...)}
}

func (r *reader) truncated(off int) error {
	return &DecodeError{Offset: off, Event: -1, Err: errTruncated}
}

// peek returns the type byte of the next element without consuming it.
func (r *reader) peek() (byte, error) {
	if r.off >= len(r.buf) {
		return 0, r.truncated(r.off)
	}
	return r.buf[r.off], nil
}

// tryNil consumes the next element if it is nil and reports whether it was.
func (r *reader) tryNil() bool {
	if r.off < len(r.buf) && r.buf[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// fixed returns the n bytes that follow the type byte at r.off and moves off
// past them.
func (r *reader) fixed(n int) ([]byte, error) {
	start := r.off
	if r.remaining() < 1+n {
		return nil, r.truncated(start)
	}
	r.off += 1 + n
	return r.buf[start+1 : r.off], nil
}

// length reads a big-endian length of size bytes after the type byte.
func (r *reader) length(size int) (int, error) {
	b, err := r.fixed(size)
	if err != nil {
		return 0, err
	}
	switch size {
	case 1:
		return int(b[0]), nil
	case 2:
		return int(binary.BigEndian.Uint16(b)), nil
	default:
		return int(binary.BigEndian.Uint32(b)), nil
	}
}

// headerFormat describes the header encodings of one msgpack type: a range
// of type bytes that hold the length themselves, and the type bytes followed
// by an 8-, 16- or 32-bit length (0 where the type has no such form).
type headerFormat struct {
	name                  string
	fixLo, fixHi          byte
	code8, code16, code32 byte
}

var (
	arrayHeader = headerFormat{name: "array", fixLo: 0x90, fixHi: 0x9f, code16: 0xdc, code32: 0xdd}
	mapHeader   = headerFormat{name: "map", fixLo: 0x80, fixHi: 0x8f, code16: 0xde, code32: 0xdf}
	strHeader   = headerFormat{name: "str", fixLo: 0xa0, fixHi: 0xbf, code8: 0xd9, code16: 0xda, code32: 0xdb}
	binHeader   = headerFormat{name: "bin", fixLo: 1, fixHi: 0, code8: 0xc4, code16: 0xc5, code32: 0xc6}
)

// is reports whether type byte c starts an element of this type.
func (f *headerFormat) is(c byte) bool {
	return c >= f.fixLo && c <= f.fixHi || c != 0 && (c == f.code8 || c == f.code16 || c == f.code32)
}

// header reads the header of an element of the given type and returns the
// length it holds, unchecked.
func (r *reader) header(f *headerFormat) (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c >= f.fixLo && c <= f.fixHi:
		r.off++
		return int(c - f.fixLo), nil
	case c == f.code8 && c != 0:
		return r.length(1)
	case c == f.code16:
		return r.length(2)
	case c == f.code32:
		return r.length(4)
	}
	return 0, r.failf(r.off, "expected %s, got %s", f.name, typeName(c))
}

// arrayLen reads an array header. The count is checked against the bytes
// that remain (each element takes at least one), so a caller may size an
// allocation from it.
func (r *reader) arrayLen() (int, error) {
	start := r.off
	n, err := r.header(&arrayHeader)
	if err != nil {
		return 0, err
	}
	if n > r.remaining() {
		return 0, r.failf(start, "array of %d elements does not fit in the %d bytes that remain", n, r.remaining())
	}
	return n, nil
}

// mapLen reads a map header, checking the pair count against the bytes that
// remain (each key and each value takes at least one).
func (r *reader) mapLen() (int, error) {
	start := r.off
	n, err := r.header(&mapHeader)
	if err != nil {
		return 0, err
	}
	if 2*n > r.remaining() {
		return 0, r.failf(start, "map of %d pairs does not fit in the %d bytes that remain", n, r.remaining())
	}
	return n, nil
}

// data reads a str or bin element and returns its bytes, which alias the
// payload.
func (r *reader) data(f *headerFormat) ([]byte, error) {
	start := r.off
	n, err := r.header(f)
	if err != nil {
		return nil, err
	}
	return r.payload(start, n)
}

// payload consumes n bytes of string or binary data following a header.
func (r *reader) payload(start, n int) ([]byte, error) {
	if n > r.remaining() {
		return nil, r.failf(start, "%d bytes of data do not fit in the %d bytes that remain", n, r.remaining())
	}
	b := r.buf[r.off : r.off+n : r.off+n]
	r.off += n
	return b, nil
}

// integer reads an integer of any msgpack width. It returns the value's
// 64-bit two's-complement pattern and whether the value is negative.
func (r *reader) integer() (u uint64, neg bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	if c <= 0x7f {
		r.off++
		return uint64(c), false, nil
	}
	if c >= 0xe0 {
		r.off++
		return uint64(int64(int8(c))), true, nil
	}
	var s int64
	switch c {
	case 0xcc, 0xcd, 0xce, 0xcf:
		b, err := r.fixed(1 << (c - 0xcc))
		if err != nil {
			return 0, false, err
		}
		return beUint(b), false, nil
	case 0xd0:
		b, err := r.fixed(1)
		if err != nil {
			return 0, false, err
		}
		s = int64(int8(b[0]))
	case 0xd1:
		b, err := r.fixed(2)
		if err != nil {
			return 0, false, err
		}
		s = int64(int16(binary.BigEndian.Uint16(b)))
	case 0xd2:
		b, err := r.fixed(4)
		if err != nil {
			return 0, false, err
		}
		s = int64(int32(binary.BigEndian.Uint32(b)))
	case 0xd3:
		b, err := r.fixed(8)
		if err != nil {
			return 0, false, err
		}
		s = int64(binary.BigEndian.Uint64(b))
	default:
		return 0, false, r.failf(r.off, "expected int, got %s", typeName(c))
	}
	return uint64(s), s < 0, nil
}

// float reads a float64, a float32 or an integer as a float64.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xcb:
		b, err := r.fixed(8)
		if err != nil {
			return 0, err
		}
		return math.Float64frombits(binary.BigEndian.Uint64(b)), nil
	case 0xca:
		b, err := r.fixed(4)
		if err != nil {
			return 0, err
		}
		return float64(math.Float32frombits(binary.BigEndian.Uint32(b))), nil
	}
	if !isInt(c) {
		return 0, r.failf(r.off, "expected float or int, got %s", typeName(c))
	}
	u, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if neg {
		return float64(int64(u)), nil
	}
	return float64(u), nil
}

// skip consumes one element of any type, however deeply nested, without
// recursion.
func (r *reader) skip() error {
	for pending := 1; pending > 0; pending-- {
		if pending > r.remaining() {
			return r.truncated(r.off)
		}
		start := r.off
		c := r.buf[start]
		var err error
		var n int
		switch {
		case c == 0xc1:
			return r.failf(start, "invalid type byte 0xc1")
		case c <= 0x7f || c >= 0xe0 || (c >= 0xc0 && c <= 0xc3):
			r.off++
		case c <= 0x8f:
			r.off++
			pending += 2 * int(c&0x0f)
		case c <= 0x9f:
			r.off++
			pending += int(c & 0x0f)
		case c <= 0xbf:
			r.off++
			_, err = r.payload(start, int(c&0x1f))
		case c == 0xc4 || c == 0xd9:
			if n, err = r.length(1); err == nil {
				_, err = r.payload(start, n)
			}
		case c == 0xc5 || c == 0xda:
			if n, err = r.length(2); err == nil {
				_, err = r.payload(start, n)
			}
		case c == 0xc6 || c == 0xdb:
			if n, err = r.length(4); err == nil {
				_, err = r.payload(start, n)
			}
		case c >= 0xc7 && c <= 0xc9: // ext 8/16/32: length, type, data
			if n, err = r.length(1 << (c - 0xc7)); err == nil {
				_, err = r.payload(start, n+1)
			}
		case c >= 0xca && c <= 0xd3:
			_, err = r.fixed(scalarSize[c-0xca])
		case c >= 0xd4 && c <= 0xd8: // fixext 1..16: type, data
			_, err = r.fixed(1 + 1<<(c-0xd4))
		case c == 0xdc || c == 0xdd:
			if n, err = r.length(2 << (c - 0xdc)); err == nil {
				pending += n
			}
		default: // 0xde, 0xdf
			if n, err = r.length(2 << (c - 0xde)); err == nil {
				pending += 2 * n
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// scalarSize is the number of data bytes after type bytes 0xca..0xd3
// (float32, float64, uint8..uint64, int8..int64).
var scalarSize = [...]int{4, 8, 1, 2, 4, 8, 1, 2, 4, 8}

// beUint reads a big-endian unsigned integer of 1, 2, 4 or 8 bytes.
func beUint(b []byte) uint64 {
	switch len(b) {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.BigEndian.Uint16(b))
	case 4:
		return uint64(binary.BigEndian.Uint32(b))
	default:
		return binary.BigEndian.Uint64(b)
	}
}

// isInt reports whether type byte c starts an integer.
func isInt(c byte) bool { return c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3) }

// typeName names the msgpack type that starts with type byte c, for errors.
func typeName(c byte) string {
	switch {
	case isInt(c):
		return "int"
	case c <= 0x8f || c == 0xde || c == 0xdf:
		return "map"
	case c <= 0x9f || c == 0xdc || c == 0xdd:
		return "array"
	case c <= 0xbf || (c >= 0xd9 && c <= 0xdb):
		return "str"
	case c == 0xc0:
		return "nil"
	case c == 0xc2 || c == 0xc3:
		return "bool"
	case c >= 0xc4 && c <= 0xc6:
		return "bin"
	case c == 0xca || c == 0xcb:
		return "float"
	case c == 0xc1:
		return "invalid type byte 0xc1"
	default:
		return "ext"
	}
}

// appendNil appends msgpack nil.
func appendNil(dst []byte) []byte { return append(dst, 0xc0) }

// appendUint appends v in the smallest unsigned encoding.
func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 0xcf), v)
	}
}

// appendInt appends v in the smallest encoding: unsigned forms for
// non-negative values, as msgspec writes Python ints.
func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(dst, uint64(v))
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, 0xd1), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
	}
}

// appendFloat64 appends v as a msgpack float64, the only float width vLLM
// sends.
func appendFloat64(dst []byte, v float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(v))
}

// appendStr appends s as a msgpack str in the smallest header.
func appendStr(dst []byte, s string) []byte {
	return append(appendHeader(dst, &strHeader, len(s)), s...)
}

// appendArrayLen appends an array header for n elements.
func appendArrayLen(dst []byte, n int) []byte { return appendHeader(dst, &arrayHeader, n) }

// appendMapLen appends a map header for n pairs.
func appendMapLen(dst []byte, n int) []byte { return appendHeader(dst, &mapHeader, n) }

// appendHeader appends the smallest header of type f for length n.
func appendHeader(dst []byte, f *headerFormat, n int) []byte {
	switch {
	case n <= int(f.fixHi-f.fixLo):
		return append(dst, f.fixLo+byte(n))
	case n <= math.MaxUint8 && f.code8 != 0:
		return append(dst, f.code8, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, f.code16), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(dst, f.code32), uint32(n))
	}
}
