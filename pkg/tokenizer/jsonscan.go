package tokenizer

import (
	"bytes"
	"errors"
	"fmt"
	"math"
)

// This file holds the small JSON scanners of the request path: the
// /tokenize reply's token array and the boundaries of a chat's messages are
// read by hand, without reflection or an intermediate value per element.

// maxScanDepth bounds the nesting skipValue follows.
const maxScanDepth = 512

// errScan reports JSON the scanners cannot read.
var errScan = errors.New("invalid JSON")

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString returns the index after the string that starts at b[i] ('"').
func skipString(b []byte, i int) (int, error) {
	i++
	for {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return 0, errScan
		}
		end := i + j
		// The quote ends the string unless an odd number of backslashes
		// escapes it.
		n := 0
		for k := end - 1; k >= i && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return end + 1, nil
		}
		i = end + 1
	}
}

// skipValue returns the index after the JSON value at b[i:], which starts
// with no white space. It checks the structure, not the literals' and
// numbers' spelling.
func skipValue(b []byte, i int) (int, error) {
	depth := 0
	for {
		if i >= len(b) {
			return 0, errScan
		}
		switch c := b[i]; c {
		case '"':
			var err error
			if i, err = skipString(b, i); err != nil {
				return 0, err
			}
		case '{', '[':
			depth++
			if depth > maxScanDepth {
				return 0, errScan
			}
			i++
		case '}', ']':
			depth--
			if depth < 0 {
				return 0, errScan
			}
			i++
		case ',', ':', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return 0, errScan
			}
			i++
		default:
			if !(c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == '.' || c == '+' || c == 'E') {
				return 0, errScan
			}
			for i < len(b) && (b[i] == '-' || b[i] >= '0' && b[i] <= '9' || b[i] >= 'a' && b[i] <= 'z' ||
				b[i] == '.' || b[i] == '+' || b[i] == 'E') {
				i++
			}
		}
		if depth == 0 {
			return i, nil
		}
	}
}

// arrayElements calls fn with each element of the JSON array raw, exactly
// as written. It fails when raw is not an array.
func arrayElements(raw []byte, fn func(elem []byte)) error {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return errScan
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return trailing(raw, i+1)
	}
	for {
		end, err := skipValue(raw, i)
		if err != nil {
			return err
		}
		fn(raw[i:end])
		i = skipSpace(raw, end)
		if i >= len(raw) {
			return errScan
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case ']':
			return trailing(raw, i+1)
		default:
			return errScan
		}
	}
}

func trailing(b []byte, i int) error {
	if skipSpace(b, i) != len(b) {
		return errScan
	}
	return nil
}

// parseUint reads the non-negative integer at b[i:], at most max.
func parseUint(b []byte, i int, max uint64) (uint64, int, error) {
	start := i
	var n uint64
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		if n > (max-uint64(b[i]-'0'))/10 {
			return 0, i, fmt.Errorf("number at byte %d exceeds %d", start, max)
		}
		n = n*10 + uint64(b[i]-'0')
		i++
	}
	if i == start {
		return 0, i, fmt.Errorf("want a non-negative integer at byte %d", start)
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		return 0, i, fmt.Errorf("want an integer at byte %d", start)
	}
	if b[start] == '0' && i-start > 1 {
		return 0, i, fmt.Errorf("number at byte %d has a leading zero", start)
	}
	return n, i, nil
}

// parseTokenIDs reads the JSON array of token ids at b[i:], returning the
// ids and the index after the array; a null gives nil ids.
func parseTokenIDs(b []byte, i int, dst []uint32) ([]uint32, int, error) {
	if bytes.HasPrefix(b[i:], jsonNull) {
		return nil, i + len(jsonNull), nil
	}
	if i >= len(b) || b[i] != '[' {
		return nil, i, fmt.Errorf("want an array of token ids at byte %d", i)
	}
	ids := dst[:0]
	if ids == nil {
		ids = []uint32{}
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return ids, i + 1, nil
	}
	for {
		n, j, err := parseUint(b, i, math.MaxUint32)
		if err != nil {
			return nil, j, fmt.Errorf("token id: %w", err)
		}
		ids = append(ids, uint32(n))
		i = skipSpace(b, j)
		if i >= len(b) {
			return nil, i, errors.New("unterminated array of token ids")
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case ']':
			return ids, i + 1, nil
		default:
			return nil, i, fmt.Errorf("want ',' or ']' at byte %d", i)
		}
	}
}
