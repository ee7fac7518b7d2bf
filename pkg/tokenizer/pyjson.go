package tokenizer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
)

// maxPyDepth bounds the nesting of the free-form JSON values of an
// Anthropic request that are re-encoded as Python would (tool inputs, input
// schemas, chat_template_kwargs): deeper values are refused, well before
// Python's own recursion limits would make vLLM fail on them.
const maxPyDepth = 100

// errNotReproducible marks a JSON value Python reads into something this
// package does not reproduce: see appendPyDumps.
var errNotReproducible = errors.New("not reproducible")

func notReproducible(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errNotReproducible, fmt.Sprintf(format, args...))
}

// appendPyDumps appends to dst the text Python's json.dumps, with its
// default arguments, writes for the value Python's json.loads reads from
// raw, a valid JSON value: separators ", " and ": ", object members in the
// order received, strings with every character outside printable ASCII
// escaped as \uXXXX (lowercase hex, surrogate pairs beyond the BMP),
// integers as their digits and other numbers as Python's repr of the
// float they read as. It fails, with an error wrapping
// errNotReproducible, on what Python reads otherwise or refuses: a string
// holding a lone UTF-16 surrogate, an object naming a member twice, a
// number that overflows a float (Infinity to Python), an integer of more
// than jsonscan.MaxIntDigits digits, nesting deeper than maxPyDepth.
func appendPyDumps(dst, raw []byte) ([]byte, error) {
	dst, i, err := pyValue(dst, raw, jsonscan.SkipSpace(raw, 0), 0)
	if err != nil {
		return nil, err
	}
	if err := jsonscan.Trailing(raw, i); err != nil {
		return nil, err
	}
	return dst, nil
}

// pyValue transcodes the value at b[i:], returning the index after it.
func pyValue(dst, b []byte, i, depth int) ([]byte, int, error) {
	if i >= len(b) {
		return nil, i, errors.New("unexpected end of JSON value")
	}
	switch c := b[i]; {
	case c == '{' || c == '[':
		if depth >= maxPyDepth {
			return nil, i, notReproducible("JSON nested deeper than %d", maxPyDepth)
		}
		if c == '{' {
			return pyObject(dst, b, i, depth+1)
		}
		return pyArray(dst, b, i, depth+1)
	case c == '"':
		if n := pyPlainString(b, i); n > 0 {
			return append(dst, b[i:i+n]...), i + n, nil
		}
		s, end, err := decodeString(b, i)
		if err != nil {
			return nil, i, err
		}
		return appendPyString(dst, s), end, nil
	case c == 't' || c == 'f' || c == 'n':
		for _, lit := range []string{"true", "false", "null"} {
			if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
				return append(dst, lit...), i + len(lit), nil
			}
		}
	case c == '-' || c >= '0' && c <= '9':
		return pyNumber(dst, b, i)
	}
	return nil, i, fmt.Errorf("invalid JSON at byte %d", i)
}

func pyObject(dst, b []byte, i, depth int) ([]byte, int, error) {
	dst = append(dst, '{')
	i = jsonscan.SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return append(dst, '}'), i + 1, nil
	}
	seen := map[string]struct{}{}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, i, fmt.Errorf("want a member name at byte %d", i)
		}
		name, end, err := decodeString(b, i)
		if err != nil {
			return nil, i, err
		}
		if _, dup := seen[name]; dup {
			return nil, i, notReproducible("member %q named twice", name)
		}
		seen[name] = struct{}{}
		dst = append(appendPyString(dst, name), ':', ' ')
		i = jsonscan.SkipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil, i, fmt.Errorf("want ':' at byte %d", i)
		}
		if dst, i, err = pyValue(dst, b, jsonscan.SkipSpace(b, i+1), depth); err != nil {
			return nil, i, err
		}
		i = jsonscan.SkipSpace(b, i)
		if i >= len(b) {
			return nil, i, errors.New("unexpected end of JSON object")
		}
		switch b[i] {
		case ',':
			dst = append(dst, ',', ' ')
			i = jsonscan.SkipSpace(b, i+1)
		case '}':
			return append(dst, '}'), i + 1, nil
		default:
			return nil, i, fmt.Errorf("want ',' or '}' at byte %d", i)
		}
	}
}

func pyArray(dst, b []byte, i, depth int) ([]byte, int, error) {
	dst = append(dst, '[')
	i = jsonscan.SkipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return append(dst, ']'), i + 1, nil
	}
	for {
		var err error
		if dst, i, err = pyValue(dst, b, i, depth); err != nil {
			return nil, i, err
		}
		i = jsonscan.SkipSpace(b, i)
		if i >= len(b) {
			return nil, i, errors.New("unexpected end of JSON array")
		}
		switch b[i] {
		case ',':
			dst = append(dst, ',', ' ')
			i = jsonscan.SkipSpace(b, i+1)
		case ']':
			return append(dst, ']'), i + 1, nil
		default:
			return nil, i, fmt.Errorf("want ',' or ']' at byte %d", i)
		}
	}
}

// pyNumber transcodes the JSON number at b[i:]. Python reads one without
// a fraction or an exponent as an int, printed back as its digits ("-0"
// as "0"), and any other as a float, printed as its repr.
func pyNumber(dst, b []byte, i int) ([]byte, int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	intStart := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	intDigits := i - intStart
	if intDigits == 0 || intDigits > 1 && b[intStart] == '0' {
		return nil, i, fmt.Errorf("invalid number at byte %d", start)
	}
	isFloat := false
	if i < len(b) && b[i] == '.' {
		isFloat = true
		i++
		n := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == n {
			return nil, i, fmt.Errorf("invalid number at byte %d", start)
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		isFloat = true
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		n := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == n {
			return nil, i, fmt.Errorf("invalid number at byte %d", start)
		}
	}
	if !isFloat {
		if intDigits > jsonscan.MaxIntDigits {
			return nil, i, notReproducible("integer of %d digits, beyond Python's %d", intDigits, jsonscan.MaxIntDigits)
		}
		if intDigits == 1 && b[intStart] == '0' {
			return append(dst, '0'), i, nil
		}
		return append(dst, b[start:i]...), i, nil
	}
	f, err := strconv.ParseFloat(string(b[start:i]), 64)
	if err != nil {
		return nil, i, notReproducible("number %.40s overflows a float", b[start:i])
	}
	return appendPyFloat(dst, f), i, nil
}

// appendPyFloat appends Python's repr of the finite float f: the shortest
// digits that read back as f, in positional notation when the decimal
// exponent is in [-5, 15] (with ".0" when they make an integer) and in
// scientific notation otherwise, its exponent signed and of at least two
// digits.
func appendPyFloat(dst []byte, f float64) []byte {
	if f == 0 {
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	var buf [32]byte
	sci := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
	if sci[0] == '-' {
		dst = append(dst, '-')
		sci = sci[1:]
	}
	e := 0
	for e < len(sci) && sci[e] != 'e' {
		e++
	}
	exp, _ := strconv.Atoi(string(sci[e+1:]))
	var digits [24]byte
	nd := 0
	for _, c := range sci[:e] {
		if c != '.' {
			digits[nd] = c
			nd++
		}
	}
	d := digits[:nd]
	decpt := exp + 1 // the value is 0.d × 10^decpt
	switch {
	case decpt > -4 && decpt <= 16 && decpt <= 0:
		dst = append(dst, '0', '.')
		for range -decpt {
			dst = append(dst, '0')
		}
		return append(dst, d...)
	case decpt > -4 && decpt <= 16 && decpt >= len(d):
		dst = append(dst, d...)
		for range decpt - len(d) {
			dst = append(dst, '0')
		}
		return append(dst, '.', '0')
	case decpt > -4 && decpt <= 16:
		dst = append(dst, d[:decpt]...)
		dst = append(dst, '.')
		return append(dst, d[decpt:]...)
	}
	dst = append(dst, d[0])
	if len(d) > 1 {
		dst = append(dst, '.')
		dst = append(dst, d[1:]...)
	}
	dst = append(dst, 'e')
	if exp < 0 {
		dst = append(dst, '-')
		exp = -exp
	} else {
		dst = append(dst, '+')
	}
	if exp < 10 {
		dst = append(dst, '0')
	}
	return strconv.AppendInt(dst, int64(exp), 10)
}

const lowerHex = "0123456789abcdef"

// appendPyString appends s as Python's json.dumps writes it with
// ensure_ascii: quotes and backslashes escaped, \n, \r, \t, \b and \f by
// name, and every other character outside space to tilde as \uXXXX.
func appendPyString(dst []byte, s string) []byte {
	dst = slices.Grow(dst, len(s)+2)
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= ' ' && c <= '~' && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		i++
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		default:
			r := rune(c)
			if c >= utf8.RuneSelf {
				var n int
				r, n = utf8.DecodeRuneInString(s[i-1:])
				i += n - 1
			}
			if r > 0xffff {
				hi, lo := utf16.EncodeRune(r)
				dst = appendU4(appendU4(dst, hi), lo)
			} else {
				dst = appendU4(dst, r)
			}
		}
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// pyPlainString returns the length of the JSON string at b[i] when it
// holds only printable ASCII and no escapes, which appendPyString writes
// as it is; 0 otherwise.
func pyPlainString(b []byte, i int) int {
	for k := i + 1; k < len(b); k++ {
		switch c := b[k]; {
		case c == '"':
			return k + 1 - i
		case c < ' ' || c > '~' || c == '\\':
			return 0
		}
	}
	return 0
}

func appendU4(dst []byte, r rune) []byte {
	return append(dst, '\\', 'u', lowerHex[r>>12&15], lowerHex[r>>8&15], lowerHex[r>>4&15], lowerHex[r&15])
}

// appendJSONString appends s as a JSON string, escaping only what JSON
// requires, so that text keeps its UTF-8 bytes.
func appendJSONString(dst []byte, s string) []byte {
	dst = slices.Grow(dst, len(s)+2)
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= ' ' && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		start = i + 1
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = appendU4(dst, rune(c))
		}
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// decodeString decodes the JSON string starting at b[i] as Python reads
// it, returning the index after it. The string must be valid UTF-8; one
// escaping a lone UTF-16 surrogate, which Python keeps and Go cannot hold,
// is refused with errNotReproducible.
func decodeString(b []byte, i int) (string, int, error) {
	end, err := jsonscan.SkipString(b, i)
	if err != nil {
		return "", i, err
	}
	inner := b[i+1 : end-1]
	if !utf8.Valid(inner) {
		return "", i, fmt.Errorf("string at byte %d is not valid UTF-8", i)
	}
	k := 0
	for k < len(inner) && inner[k] != '\\' {
		k++
	}
	if k == len(inner) {
		if len(inner) <= maxCommonString {
			if s, ok := commonStrings[string(inner)]; ok {
				return s, end, nil
			}
		}
		return string(inner), end, nil
	}
	out := make([]byte, 0, len(inner))
	out = append(out, inner[:k]...)
	for k < len(inner) {
		c := inner[k]
		if c != '\\' {
			out = append(out, c)
			k++
			continue
		}
		if k+1 >= len(inner) {
			return "", i, fmt.Errorf("invalid escape in string at byte %d", i)
		}
		k += 2
		switch e := inner[k-1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(inner, k)
			if !ok {
				return "", i, fmt.Errorf("invalid \\u escape in string at byte %d", i)
			}
			k += 4
			if utf16.IsSurrogate(r) {
				lo, ok := rune(0), false
				if r < 0xdc00 && k+1 < len(inner) && inner[k] == '\\' && inner[k+1] == 'u' {
					lo, ok = hex4(inner, k+2)
					ok = ok && lo >= 0xdc00 && lo <= 0xdfff
				}
				if !ok {
					return "", i, notReproducible("string at byte %d holds a lone UTF-16 surrogate", i)
				}
				k += 6
				r = utf16.DecodeRune(r, lo)
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", i, fmt.Errorf("invalid escape in string at byte %d", i)
		}
	}
	return string(out), end, nil
}

// commonStrings are the strings request bodies repeat (types, roles,
// statuses, schema keywords), which decodeString returns without copying.
var commonStrings = func() map[string]string {
	m := map[string]string{}
	for _, s := range []string{
		"", "message", "function_call", "function_call_output", "reasoning", "summary_text", "reasoning_text",
		"user", "assistant", "system", "developer", "tool", "input_text", "output_text", "refusal",
		"text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image",
		"completed", "in_progress", "incomplete", "function", "namespace", "custom", "auto", "disabled",
		"none", "minimal", "low", "medium", "high", "xhigh", "max",
		"type", "object", "string", "integer", "number", "boolean", "array", "null",
		"description", "properties", "required", "items", "enum", "default", "additionalProperties",
		"minimum", "maximum", "format", "title", "anyOf", "oneOf", "allOf", "$schema",
	} {
		m[s] = s
	}
	return m
}()

// maxCommonString is the length of the longest of commonStrings that
// decodeString looks for.
const maxCommonString = 24

func hex4(b []byte, k int) (rune, bool) {
	if k+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[k : k+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
