// Package jsonscan reads JSON on kvgate's request path by hand: it finds
// the members and elements of a document where they are, checks them as
// strictly as encoding/json does, and decodes only the few values the
// caller asks for, without reflection and without allocating for the
// values it skips. A request body of kilobytes of prompt costs a few
// microseconds to read this way.
//
// Int, Bool and String decode a value as encoding/json does; LaxInt and
// LaxBool as vLLM's request validation (pydantic's lax mode) does, which
// also takes, say, 1e3 or "100" for an integer and "true" or 1 for a
// boolean.
//
// Indexes are byte offsets into the document. Every function checks what
// it reads against the bytes that remain and fails with an *Error rather
// than reading past them; nesting deeper than MaxDepth is refused.
package jsonscan

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxDepth bounds the nesting of arrays and objects SkipValue follows.
const MaxDepth = 512

// Error reports JSON that does not read, and where.
type Error struct {
	// Offset is the byte the problem was found at.
	Offset int
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("%s at byte %d", e.Msg, e.Offset) }

func errAt(i int, format string, args ...any) error {
	return &Error{Offset: i, Msg: fmt.Sprintf(format, args...)}
}

// SkipSpace returns the index of the first byte at or after i that is not
// JSON white space, len(b) when there is none.
func SkipSpace(b []byte, i int) int {
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

// Trailing fails unless b holds nothing but white space from i on.
func Trailing(b []byte, i int) error {
	if j := SkipSpace(b, i); j != len(b) {
		return errAt(j, "unexpected %q after the value", b[j])
	}
	return nil
}

// Word masks of the string scanner.
const (
	lsb      = 0x0101010101010101
	msb      = 0x8080808080808080
	quotes   = '"' * lsb
	slashes  = '\\' * lsb
	controls = 0x20 * lsb
)

// special returns the index of the first byte of b that is a quote, a
// backslash or a control character, -1 when there is none. It tests eight
// bytes at a time.
func special(b []byte) int {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		q, s := w^quotes, w^slashes
		// A byte of t has its top bit set where a byte of w is '"', '\\'
		// or below 0x20 (bytes at or above 0x80 are never flagged).
		t := ((q - lsb) &^ q) | ((s - lsb) &^ s) | ((w - controls) &^ w)
		if t &= msb; t != 0 {
			return i + bits.TrailingZeros64(t)/8
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
			return i
		}
	}
	return -1
}

// SkipString returns the index after the string that starts at b[i], a
// quote, checking its escapes and that it holds no control character.
func SkipString(b []byte, i int) (int, error) {
	start := i
	i++
	for {
		j := special(b[i:])
		if j < 0 {
			return 0, errAt(start, "unterminated string")
		}
		i += j
		switch c := b[i]; {
		case c == '"':
			return i + 1, nil
		case c == '\\':
			n, err := escapeLen(b, i)
			if err != nil {
				return 0, err
			}
			i += n
		default:
			return 0, errAt(i, "control character %#x in a string", c)
		}
	}
}

// escapeLen returns the length of the escape sequence at b[i], a
// backslash.
func escapeLen(b []byte, i int) (int, error) {
	if i+1 >= len(b) {
		return 0, errAt(i, "unterminated string")
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
		if i+6 > len(b) {
			return 0, errAt(i, "unterminated string")
		}
		for _, h := range b[i+2 : i+6] {
			if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
				return 0, errAt(i, "invalid escape %q", b[i:i+6])
			}
		}
		return 6, nil
	}
	return 0, errAt(i, "invalid escape %q", b[i:i+2])
}

// SkipValue returns the index after the JSON value that starts at b[i],
// which is not white space, checking it as encoding/json does.
func SkipValue(b []byte, i int) (int, error) {
	return skipValue(b, i, 0)
}

func skipValue(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return 0, errAt(i, "unexpected end of JSON input")
	}
	switch c := b[i]; {
	case c == '"':
		return SkipString(b, i)
	case c == '{' || c == '[':
		if depth >= MaxDepth {
			return 0, errAt(i, "nesting deeper than %d", MaxDepth)
		}
		return skipContainer(b, i, depth+1)
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return skipNumber(b, i)
	default:
		return 0, errAt(i, "unexpected %q", c)
	}
}

// skipContainer skips the object or array at b[i].
func skipContainer(b []byte, i, depth int) (int, error) {
	object := b[i] == '{'
	end := byte(']')
	if object {
		end = '}'
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == end {
		return i + 1, nil
	}
	for {
		var err error
		if object {
			if i, err = skipName(b, i); err != nil {
				return 0, err
			}
		}
		if i, err = skipValue(b, i, depth); err != nil {
			return 0, err
		}
		i = SkipSpace(b, i)
		if i >= len(b) {
			return 0, errAt(i, "unexpected end of JSON input")
		}
		switch b[i] {
		case ',':
			i = SkipSpace(b, i+1)
		case end:
			return i + 1, nil
		default:
			return 0, errAt(i, "want ',' or %q, not %q", end, b[i])
		}
	}
}

// skipName skips a member name and its colon at b[i], returning the index
// of the value.
func skipName(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return 0, errAt(i, "want a member name")
	}
	i, err := SkipString(b, i)
	if err != nil {
		return 0, err
	}
	i = SkipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return 0, errAt(i, "want ':' after a member name")
	}
	return SkipSpace(b, i+1), nil
}

func literal(b []byte, i int, lit string) (int, error) {
	if !bytes.HasPrefix(b[i:], []byte(lit)) {
		return 0, errAt(i, "invalid literal")
	}
	return i + len(lit), nil
}

// skipNumber skips the number at b[i], checking its grammar.
func skipNumber(b []byte, i int) (int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return 0, errAt(start, "invalid number")
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return 0, errAt(start, "invalid number")
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return 0, errAt(start, "invalid number")
		}
		i = j
	}
	return i, nil
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// Members calls fn with the name (as written between its quotes, escapes
// included) and the value (exactly as written) of each member of the JSON
// object raw, in order, checking the whole object. It fails when raw is
// not an object, and stops with fn's error.
func Members(raw []byte, fn func(name, value []byte) error) error {
	i := SkipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return errAt(i, "not a JSON object")
	}
	i = SkipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return Trailing(raw, i+1)
	}
	for {
		if i >= len(raw) || raw[i] != '"' {
			return errAt(i, "want a member name")
		}
		nameEnd, err := SkipString(raw, i)
		if err != nil {
			return err
		}
		name := raw[i+1 : nameEnd-1]
		v, err := skipName(raw, i)
		if err != nil {
			return err
		}
		end, err := skipValue(raw, v, 1)
		if err != nil {
			return err
		}
		if err := fn(name, raw[v:end]); err != nil {
			return err
		}
		i = SkipSpace(raw, end)
		if i >= len(raw) {
			return errAt(i, "unexpected end of JSON input")
		}
		switch raw[i] {
		case ',':
			i = SkipSpace(raw, i+1)
		case '}':
			return Trailing(raw, i+1)
		default:
			return errAt(i, "want ',' or '}', not %q", raw[i])
		}
	}
}

// TypeAnd returns the values, exactly as written, of the members named
// type and member of the JSON object raw (the last of each when one is
// named twice, nil when absent), checking the whole object as Members does.
// Objects of tagged unions (a content part, an event, a tool) are read
// with it.
func TypeAnd(raw []byte, member string) (typ, value []byte, err error) {
	err = Members(raw, func(name, v []byte) error {
		switch n := Name(name); {
		case string(n) == "type":
			typ = v
		case string(n) == member:
			value = v
		}
		return nil
	})
	return typ, value, err
}

// ArrayElements calls fn with each element of the JSON array raw, exactly
// as written, checking the whole array. It fails when raw is not an array.
func ArrayElements(raw []byte, fn func(elem []byte)) error {
	i := SkipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return errAt(i, "not a JSON array")
	}
	i = SkipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return Trailing(raw, i+1)
	}
	for {
		end, err := skipValue(raw, i, 1)
		if err != nil {
			return err
		}
		fn(raw[i:end])
		i = SkipSpace(raw, end)
		if i >= len(raw) {
			return errAt(i, "unexpected end of JSON input")
		}
		switch raw[i] {
		case ',':
			i = SkipSpace(raw, i+1)
		case ']':
			return Trailing(raw, i+1)
		default:
			return errAt(i, "want ',' or ']', not %q", raw[i])
		}
	}
}

// ParseUint reads the non-negative integer at b[i:], at most max, and
// returns it with the index after it.
func ParseUint(b []byte, i int, max uint64) (uint64, int, error) {
	start := i
	var n uint64
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		if n > (max-uint64(b[i]-'0'))/10 {
			return 0, i, errAt(start, "number exceeds %d", max)
		}
		n = n*10 + uint64(b[i]-'0')
		i++
	}
	if i == start {
		return 0, i, errAt(start, "want a non-negative integer")
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		return 0, i, errAt(start, "want an integer")
	}
	if b[start] == '0' && i-start > 1 {
		return 0, i, errAt(start, "number has a leading zero")
	}
	return n, i, nil
}

// parseTokenID is ParseUint(b, i, math.MaxUint32) in one loop over the
// digits: a token id has at most 10 of them, so its value is checked once,
// after them. Anything but a well-formed id within range is left to
// ParseUint, whose verdict and error it returns.
func parseTokenID(b []byte, i int) (uint32, int, error) {
	start := i
	var n uint64
	for end := min(len(b), i+10); i < end && b[i]-'0' <= 9; i++ {
		n = n*10 + uint64(b[i]-'0')
	}
	if i == start || n > math.MaxUint32 || b[start] == '0' && i-start > 1 ||
		i < len(b) && (b[i]-'0' <= 9 || b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		v, j, err := ParseUint(b, start, math.MaxUint32)
		return uint32(v), j, err
	}
	return uint32(n), i, nil
}

// Int decodes value, a whole JSON value, as an int, as encoding/json
// decodes into one: an integer within int's range.
func Int(value []byte) (int, error) {
	neg := len(value) > 0 && value[0] == '-'
	i := 0
	if neg {
		i = 1
	}
	n, end, err := ParseUint(value, i, math.MaxInt)
	if err == nil && end != len(value) {
		err = errAt(end, "want an integer")
	}
	if err != nil {
		return 0, err
	}
	if neg {
		return -int(n), nil
	}
	return int(n), nil
}

// Bool decodes value, a whole JSON value: true or false, or null, which
// reports null.
func Bool(value []byte) (v, null bool, err error) {
	switch string(value) {
	case "true":
		return true, false, nil
	case "false":
		return false, false, nil
	case "null":
		return false, true, nil
	}
	return false, false, errAt(0, "want true or false")
}

// MaxIntDigits bounds the digits of an integer LaxInt reads, as Python
// bounds the digits of an int it converts from or to a string.
const MaxIntDigits = 4300

// LaxInt decodes value, a whole JSON value, as pydantic's lax mode (the
// default, which vLLM validates requests in) reads an int field, or null,
// which reports null:
//   - an integer; one beyond int's range reads as the nearest int (Python's
//     are unbounded), one of more than MaxIntDigits digits is refused;
//   - a number whose value is a whole number in (-2⁶³, 2⁶³) once rounded
//     to a float64, such as 100.0 or 1e3;
//   - true (1) and false (0);
//   - a string that holds an integer, with surrounding white space, a
//     leading + or -, leading zeros, underscores between digits and a
//     fraction of zeros allowed: " +1_000.00 " reads 1000.
//
// Anything else fails. An integer that encoding/json reads into an int is
// read without allocating; the other forms may allocate.
func LaxInt(value []byte) (n int, null bool, err error) {
	if n, err := Int(value); err == nil {
		return n, false, nil
	}
	if len(value) == 0 {
		return 0, false, errAt(0, "want an integer")
	}
	switch c := value[0]; {
	case c == 'n' || c == 't' || c == 'f':
		switch string(value) {
		case "null":
			return 0, true, nil
		case "true":
			return 1, false, nil
		case "false":
			return 0, false, nil
		}
	case c == '"':
		s, err := String(value)
		if err != nil {
			return 0, false, err
		}
		n, err := laxIntString(s)
		return n, false, err
	case c == '-' || c >= '0' && c <= '9':
		n, err := laxIntNumber(value)
		return n, false, err
	}
	return 0, false, errAt(0, "want an integer")
}

// laxIntNumber reads the JSON number value, which Int refused, as LaxInt
// does.
func laxIntNumber(value []byte) (int, error) {
	if end, err := skipNumber(value, 0); err != nil || end != len(value) {
		return 0, errAt(0, "want an integer")
	}
	if bytes.IndexAny(value, ".eE") < 0 {
		// An integer Int refused is beyond int's range.
		neg := value[0] == '-'
		if digits := len(value) - btoi(neg); digits > MaxIntDigits {
			return 0, errAt(0, "integer of more than %d digits", MaxIntDigits)
		}
		if neg {
			return math.MinInt, nil
		}
		return math.MaxInt, nil
	}
	f, err := strconv.ParseFloat(string(value), 64)
	if err != nil && !math.IsInf(f, 0) {
		return 0, errAt(0, "want an integer")
	}
	return floatInt(f)
}

// floatInt returns f as an int when it is a whole number in (-2⁶³, 2⁶³),
// as pydantic converts a float to an int.
func floatInt(f float64) (int, error) {
	switch {
	case math.IsInf(f, 0) || math.IsNaN(f):
		return 0, errAt(0, "want a finite number")
	case f != math.Trunc(f):
		return 0, errAt(0, "want an integer, not a number with a fraction")
	case !(f > math.MinInt64 && f < math.MaxInt64):
		return 0, errAt(0, "integer out of range")
	}
	return clampInt(int64(f)), nil
}

func clampInt(n int64) int {
	switch {
	case n > math.MaxInt:
		return math.MaxInt
	case n < math.MinInt:
		return math.MinInt
	}
	return int(n)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// laxIntString reads the integer a string holds, as pydantic does: first
// as a JSON integer, then once cleaned of white space, sign, leading
// zeros, a fraction of zeros and underscores (see cleanIntString).
func laxIntString(s string) (int, error) {
	n, ok, err := jsonInt(s)
	if ok || err != nil {
		return n, err
	}
	if c, cleaned := cleanIntString(s); cleaned {
		if n, ok, err := jsonInt(c); ok || err != nil {
			return n, err
		}
	}
	return 0, errAt(0, "want a string holding an integer")
}

// jsonInt reads s when it is a JSON integer, as LaxInt reads one: ok
// reports that it is, err one of more than MaxIntDigits digits.
func jsonInt(s string) (n int, ok bool, err error) {
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || digits[0] == '0' && len(digits) > 1 {
		return 0, false, nil
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false, nil
		}
	}
	if len(digits) > MaxIntDigits {
		return 0, false, errAt(0, "integer of more than %d digits", MaxIntDigits)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// Only a range error: the digits are checked.
		if s[0] == '-' {
			return math.MinInt, true, nil
		}
		return math.MaxInt, true, nil
	}
	return clampInt(v), true, nil
}

// cleanIntString returns s cleaned as pydantic cleans a string it reads
// as an int, reporting whether cleaning applies: white space (Unicode's)
// trimmed, a leading + dropped, leading zeros dropped (underscores among
// them too), a fraction of zeros dropped, then underscores between digits
// dropped, the sign kept. A string cleaning leaves as it was does not
// apply.
func cleanIntString(orig string) (string, bool) {
	s := strings.TrimFunc(orig, unicode.IsSpace)
	if rest, ok := strings.CutPrefix(s, "+"); ok {
		if strings.HasPrefix(rest, "-") {
			return "", false
		}
		s = rest
	}
	neg := false
	if rest, ok := strings.CutPrefix(s, "-"); ok {
		if strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "+") {
			return "", false
		}
		neg, s = true, rest
	}
	s, ok := stripLeadingZeros(s)
	if !ok {
		return "", false
	}
	if i := strings.IndexByte(s, '.'); i >= 0 {
		if frac := s[i+1:]; frac != "" && strings.Trim(frac, "0") == "" {
			s = s[:i]
		}
	}
	switch {
	case s != "" && s[0] != '_' && s[len(s)-1] != '_' && strings.Contains(s, "_") && !strings.Contains(s, "__"):
		s = strings.ReplaceAll(s, "_", "")
	case len(s) == len(orig):
		return "", false
	}
	if neg {
		s = "-" + s
	}
	return s, true
}

// stripLeadingZeros drops the zeros s starts with, and the underscores
// among them, keeping a zero before a '.' or ending s. It fails for s not
// starting with a digit or '-'.
func stripLeadingZeros(s string) (string, bool) {
	if s == "" {
		return "", false
	}
	switch c := s[0]; {
	case c == '0':
	case c >= '1' && c <= '9' || c == '-':
		return s, true
	default:
		return "", false
	}
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '0' || c == '_':
		case c >= '1' && c <= '9' || c == '-':
			return s[i:], true
		case c == '.':
			return s[i-1:], true
		default:
			return "", false
		}
	}
	return s[len(s)-1:], true
}

// LaxBool decodes value, a whole JSON value, as pydantic's lax mode reads
// a bool field, or null, which reports null: true and false; the numbers
// 0 and 1 in any form (0, 1, 1.0, 1e0, -0.0); and the strings "0" and "1"
// and, in any case of ASCII letters, "f", "n", "no", "off", "false", "t",
// "y", "on", "yes" and "true", without surrounding white space. Anything
// else fails. true, false and null are read without allocating.
func LaxBool(value []byte) (v, null bool, err error) {
	if v, null, err := Bool(value); err == nil {
		return v, null, nil
	}
	fail := errAt(0, "want a boolean")
	if len(value) == 0 {
		return false, false, fail
	}
	switch c := value[0]; {
	case c == '"':
		s, err := String(value)
		if err != nil {
			return false, false, err
		}
		switch f := asciiFold(s); {
		case f == "0" || slices.Contains(falseWords, f):
			return false, false, nil
		case f == "1" || slices.Contains(trueWords, f):
			return true, false, nil
		}
	case c == '-' || c >= '0' && c <= '9':
		if n, err := laxIntNumber(value); err == nil && (n == 0 || n == 1) && bytes.IndexAny(value, ".eE") >= 0 {
			return n == 1, false, nil
		}
		switch string(value) {
		case "0", "-0":
			return false, false, nil
		case "1":
			return true, false, nil
		}
	}
	return false, false, fail
}

// falseWords and trueWords are the strings LaxBool reads as false and
// true, in lower case.
var (
	falseWords = []string{"f", "n", "no", "off", "false"}
	trueWords  = []string{"t", "y", "on", "yes", "true"}
)

// asciiFold returns s with its ASCII upper-case letters lowered; other
// bytes are kept.
func asciiFold(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// String decodes value, a whole JSON string, as encoding/json does; null
// gives "".
func String(value []byte) (string, error) {
	if string(value) == "null" {
		return "", nil
	}
	if len(value) < 2 || value[0] != '"' {
		return "", errAt(0, "want a string")
	}
	inner := value[1 : len(value)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), nil
	}
	var s string
	if err := json.Unmarshal(value, &s); err != nil {
		return "", errAt(0, "invalid string")
	}
	return s, nil
}

// Name returns the member name Members passed, unescaped (invalid UTF-8
// replaced, as encoding/json does); names without either are returned as
// they are, without allocating.
func Name(raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return raw
	}
	var s string
	if json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &s) != nil {
		return raw
	}
	return []byte(s)
}

// ParseTokenIDs reads the JSON array of token ids at b[i:] into dst's
// storage, returning the ids and the index after the array; null gives nil
// ids, an empty array an empty, non-nil slice.
func ParseTokenIDs(b []byte, i int, dst []uint32) ([]uint32, int, error) {
	if bytes.HasPrefix(b[i:], []byte("null")) {
		return nil, i + 4, nil
	}
	if i >= len(b) || b[i] != '[' {
		return nil, i, errAt(i, "want an array of token ids")
	}
	ids := dst[:0]
	if ids == nil {
		ids = []uint32{}
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return ids, i + 1, nil
	}
	for {
		n, j, err := parseTokenID(b, i)
		if err != nil {
			return nil, j, fmt.Errorf("token id: %w", err)
		}
		ids = append(ids, n)
		i = SkipSpace(b, j)
		if i >= len(b) {
			return nil, i, errAt(i, "unterminated array of token ids")
		}
		switch b[i] {
		case ',':
			i = SkipSpace(b, i+1)
		case ']':
			return ids, i + 1, nil
		default:
			return nil, i, errAt(i, "want ',' or ']', not %q", b[i])
		}
	}
}
