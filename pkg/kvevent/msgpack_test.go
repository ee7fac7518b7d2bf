package kvevent

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// compact encodes v with the reference encoder in the smallest integer
// widths, the way msgspec writes Python values.
func compact(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

var intBoundaries = []int64{
	0, 1, 31, 32, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64,
	-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64,
}

func TestIntegersUseTheSmallestEncoding(t *testing.T) {
	for _, v := range intBoundaries {
		if got, want := appendInt(nil, v), compact(t, v); !bytes.Equal(got, want) {
			t.Errorf("appendInt(%d) = %x, want %x", v, got, want)
		}
		r := reader{buf: appendInt(nil, v)}
		u, neg, err := r.integer()
		if err != nil || int64(u) != v || neg != (v < 0) || r.remaining() != 0 {
			t.Errorf("integer() of %d = %d, %v, %v", v, int64(u), neg, err)
		}
	}
	for _, v := range []uint64{0, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxUint64} {
		if got, want := appendUint(nil, v), compact(t, v); !bytes.Equal(got, want) {
			t.Errorf("appendUint(%d) = %x, want %x", v, got, want)
		}
	}
}

func TestReaderAcceptsEveryIntegerWidth(t *testing.T) {
	tests := []struct {
		in   raw
		want int64
	}{
		{raw{0x05}, 5}, {raw{0xfb}, -5},
		{raw{0xcc, 0xff}, 255}, {raw{0xcd, 0x01, 0x00}, 256}, {raw{0xce, 0, 1, 0, 0}, 65536},
		{raw{0xcf, 0, 0, 0, 1, 0, 0, 0, 0}, 1 << 32},
		{raw{0xd0, 0x05}, 5}, {raw{0xd0, 0x80}, -128}, {raw{0xd1, 0x7f, 0xff}, 32767},
		{raw{0xd2, 0xff, 0xff, 0xff, 0xfe}, -2}, {raw{0xd3, 0, 0, 0, 0, 0, 0, 0, 9}, 9},
	}
	for _, tt := range tests {
		r := reader{buf: tt.in}
		u, neg, err := r.integer()
		if err != nil || int64(u) != tt.want || neg != (tt.want < 0) || r.remaining() != 0 {
			t.Errorf("integer() of %x = %d, %v, %v; want %d", []byte(tt.in), int64(u), neg, err, tt.want)
		}
	}
}

func TestHeadersUseTheSmallestEncoding(t *testing.T) {
	for _, n := range []int{0, 15, 16, 31, 32, 255, 256, 65535, 65536} {
		s := strings.Repeat("s", n)
		if got, want := appendStr(nil, s), compact(t, s); !bytes.Equal(got, want) {
			t.Errorf("appendStr of %d bytes starts %x, want %x", n, got[:min(5, len(got))], want[:min(5, len(want))])
		}
		a := make([]any, n)
		if got, want := appendArrayLen(nil, n), compact(t, a); !bytes.HasPrefix(want, got) || len(want) != len(got)+n {
			t.Errorf("appendArrayLen(%d) = %x, want %x", n, got, want[:len(want)-n])
		}
	}
	for _, n := range []int{0, 15, 16, 65535, 65536} {
		got := appendMapLen(nil, n)
		r := reader{buf: append(got, make([]byte, 2*n)...)}
		if m, err := r.mapLen(); err != nil || m != n || r.off != len(got) {
			t.Errorf("mapLen of appendMapLen(%d) = %d, %v", n, m, err)
		}
	}
}

func TestFloatAcceptsFloatsAndIntegers(t *testing.T) {
	for _, tt := range []struct {
		in   []byte
		want float64
	}{
		{appendFloat64(nil, 1757500000.25), 1757500000.25},
		{mp(float32(0.5)), 0.5},
		{mp(-7), -7},
		{mp(uint64(1 << 40)), 1 << 40},
	} {
		r := reader{buf: tt.in}
		if f, err := r.float(); err != nil || f != tt.want {
			t.Errorf("float() of %x = %v, %v; want %v", tt.in, f, err, tt.want)
		}
	}
}

func TestSkipConsumesExactlyOneValueOfAnyType(t *testing.T) {
	values := []any{
		nil, true, false, 1, -1, 300, -300, int64(math.MinInt64), uint64(math.MaxUint64), 1.5, float32(2.5),
		"", "short", strings.Repeat("m", 300), strings.Repeat("l", 70000),
		[]byte{}, []byte{1, 2}, bytes.Repeat([]byte{3}, 300), bytes.Repeat([]byte{4}, 70000),
		[]any{}, []any{1, "a", []any{nil}}, make([]any, 20), make([]any, 70000),
		map[string]any{}, map[string]any{"k": []any{1, map[string]any{"n": nil}}},
		&msgpack.RawMessage{0xd4, 1, 2}, &msgpack.RawMessage{0xd5, 1, 2, 3},
		&msgpack.RawMessage{0xd6, 1, 2, 3, 4, 5}, &msgpack.RawMessage{0xd7, 1, 0, 0, 0, 0, 0, 0, 0, 0},
		&msgpack.RawMessage{0xd8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		&msgpack.RawMessage{0xc7, 2, 1, 7, 7}, &msgpack.RawMessage{0xc8, 0, 1, 1, 7},
		&msgpack.RawMessage{0xc9, 0, 0, 0, 1, 1, 7},
	}
	for _, v := range values {
		enc := compact(t, v)
		r := reader{buf: append(enc, 0xc0)}
		if err := r.skip(); err != nil || r.off != len(enc) {
			t.Errorf("skip of %x stopped at %d of %d: %v", enc[:min(8, len(enc))], r.off, len(enc), err)
		}
		for n := range len(enc) {
			r := reader{buf: enc[:n]}
			if err := r.skip(); !errors.Is(err, errTruncated) && (err == nil || !strings.Contains(err.Error(), "do not fit")) {
				t.Fatalf("skip of %d of %d bytes of %x: %v, want an error about the missing bytes", n, len(enc), enc[:min(8, len(enc))], err)
			}
		}
	}
}

func TestSkipHandlesDeepNestingWithoutRecursion(t *testing.T) {
	const depth = 1 << 20
	deep := append(bytes.Repeat([]byte{0x91}, depth), 0xc0)
	r := reader{buf: deep}
	if err := r.skip(); err != nil || r.off != len(deep) {
		t.Errorf("skip of %d nested arrays: off %d, %v", depth, r.off, err)
	}
	r = reader{buf: deep[:depth]}
	if err := r.skip(); err == nil {
		t.Error("skip of nested arrays missing their innermost value succeeded")
	}
}
