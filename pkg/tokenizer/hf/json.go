package hf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// maxJSONDepth bounds the nesting parseValue accepts.
const maxJSONDepth = 128

// ErrInexactNumber is returned by RenderChat for a chat whose JSON holds a
// number that is not an integer in the int64 range (one written with a
// fraction or an exponent, or a larger integer). Templates print such
// numbers unlike Python, with which vLLM renders them (1.0 as "1", 1e6 as
// "1e+06", not "1.0" and "1000000.0"), so the engine renders such chats.
var ErrInexactNumber = errors.New("a JSON number that is not an int64 integer; the engine renders it")

// templateValue decodes a JSON document as parseValue does, and fails
// with ErrInexactNumber when it holds a number that is not an int64
// integer.
func templateValue(raw []byte) (jinja.Value, error) {
	p := jsonParser{b: raw}
	v, err := p.document()
	if err == nil && p.inexact {
		return v, ErrInexactNumber
	}
	return v, err
}

// parseValue decodes a JSON document into template values, keeping the
// order of object keys. It is a small hand-written parser: chat requests
// are decoded on the request path, and encoding/json's token stream costs
// more than rendering the template.
func parseValue(raw []byte) (jinja.Value, error) {
	p := jsonParser{b: raw}
	return p.document()
}

// document decodes the whole input as one JSON value.
func (p *jsonParser) document() (jinja.Value, error) {
	p.space()
	v, err := p.value(0)
	if err != nil {
		return v, err
	}
	if p.space(); p.i != len(p.b) {
		return v, p.errorf("trailing data after the JSON value")
	}
	return v, nil
}

type jsonParser struct {
	b []byte
	i int
	// inexact records a number that is not an int64 integer.
	inexact bool
}

func (p *jsonParser) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid JSON at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *jsonParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) literal(word string, v jinja.Value) (jinja.Value, error) {
	if len(p.b)-p.i < len(word) || string(p.b[p.i:p.i+len(word)]) != word {
		return v, p.errorf("unexpected %q", p.b[p.i])
	}
	p.i += len(word)
	return v, nil
}

func (p *jsonParser) value(depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Value{}, p.errorf("nested deeper than %d", maxJSONDepth)
	}
	if p.i >= len(p.b) {
		return jinja.Value{}, p.errorf("unexpected end")
	}
	switch c := p.b[p.i]; {
	case c == '"':
		s, err := p.str()
		return jinja.NewString(s), err
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == 't':
		return p.literal("true", jinja.NewBool(true))
	case c == 'f':
		return p.literal("false", jinja.NewBool(false))
	case c == 'n':
		return p.literal("null", jinja.None())
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	default:
		return jinja.Value{}, p.errorf("unexpected %q", c)
	}
}

func (p *jsonParser) object(depth int) (jinja.Value, error) {
	obj := jinja.NewDict()
	d := obj.AsDict()
	p.i++
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return obj, nil
	}
	for {
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return obj, p.errorf("want an object key")
		}
		k, err := p.str()
		if err != nil {
			return obj, err
		}
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return obj, p.errorf("want ':'")
		}
		p.i++
		p.space()
		v, err := p.value(depth + 1)
		if err != nil {
			return obj, err
		}
		d.Set(k, v)
		p.space()
		if p.i >= len(p.b) {
			return obj, p.errorf("unexpected end")
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return obj, nil
		default:
			return obj, p.errorf("want ',' or '}'")
		}
	}
}

func (p *jsonParser) array(depth int) (jinja.Value, error) {
	p.i++
	p.space()
	var items []jinja.Value
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return jinja.NewList(items), nil
	}
	for {
		p.space()
		v, err := p.value(depth + 1)
		if err != nil {
			return v, err
		}
		items = append(items, v)
		p.space()
		if p.i >= len(p.b) {
			return v, p.errorf("unexpected end")
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return jinja.NewList(items), nil
		default:
			return v, p.errorf("want ',' or ']'")
		}
	}
}

func (p *jsonParser) number() (jinja.Value, error) {
	start := p.i
	digits := func() int {
		n := 0
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.b[p.i] == '-' {
		p.i++
	}
	first := p.i
	if n := digits(); n == 0 || n > 1 && p.b[first] == '0' {
		return jinja.Value{}, p.errorf("invalid number")
	}
	float := false
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		float = true
		if digits() == 0 {
			return jinja.Value{}, p.errorf("invalid number")
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		float = true
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return jinja.Value{}, p.errorf("invalid number")
		}
	}
	text := string(p.b[start:p.i])
	if !float {
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return jinja.NewInt(n), nil
		}
	}
	p.inexact = true
	f, err := strconv.ParseFloat(text, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return jinja.Value{}, fmt.Errorf("invalid JSON number %q", text)
	}
	return jinja.NewFloat(f), nil
}

// str decodes the string at p.i.
func (p *jsonParser) str() (string, error) {
	p.i++
	start := p.i
	p.i = plainRun(p.b, p.i)
	switch {
	case p.i == len(p.b):
		return "", p.errorf("unterminated string")
	case p.b[p.i] == '"':
		s := string(p.b[start:p.i])
		p.i++
		if !utf8.ValidString(s) {
			s = string([]rune(s))
		}
		return s, nil
	case p.b[p.i] == '\\':
		return p.escaped(start)
	}
	return "", p.errorf("control character in string")
}

// escaped decodes the rest of a string that holds escapes, from start.
func (p *jsonParser) escaped(start int) (string, error) {
	end := p.i
	for end < len(p.b) {
		if end = plainRun(p.b, end); end == len(p.b) || p.b[end] == '"' {
			break
		}
		if p.b[end] == '\\' {
			end++
		}
		end++
	}
	out := make([]byte, 0, end-start)
	out = append(out, p.b[start:p.i]...)
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			if !utf8.Valid(out) {
				return string([]rune(string(out))), nil
			}
			return string(out), nil
		case c < 0x20:
			return "", p.errorf("control character in string")
		case c != '\\':
			run := p.i
			p.i = plainRun(p.b, p.i)
			out = append(out, p.b[run:p.i]...)
			continue
		}
		if p.i+1 >= len(p.b) {
			break
		}
		e := p.b[p.i+1]
		p.i += 2
		switch e {
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
			r, ok := p.hex4()
			if !ok {
				return "", p.errorf("invalid \\u escape")
			}
			if utf16.IsSurrogate(r) {
				// A pair makes one character; a lone surrogate is U+FFFD,
				// and the escape after it is read on its own.
				save := p.i
				d := utf8.RuneError
				if p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
					p.i += 2
					if r2, ok2 := p.hex4(); ok2 {
						d = utf16.DecodeRune(r, r2)
					}
				}
				if d == utf8.RuneError {
					p.i = save
				}
				r = d
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", p.errorf("invalid escape \\%c", e)
		}
	}
	return "", errors.New("invalid JSON: unterminated string")
}

// plainRun returns the index of the first byte of b from i on that a
// string cannot hold as it is: a quote, a backslash or a control
// character; len(b) if there is none. It tests eight bytes v at a time:
// (x - c*lo) &^ x & hi flags the bytes of x below c (c <= 0x80), and the
// lowest byte flagged is the first of them, since a borrow only flags bytes
// above one that is below c. With c = 1 and x = v ^ q*lo it finds the bytes
// equal to q; with c = 0x20 and x = v, the control characters.
func plainRun(b []byte, i int) int {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	for ; i+8 <= len(b); i += 8 {
		v := binary.LittleEndian.Uint64(b[i:])
		q, s := v^('"'*lo), v^('\\'*lo)
		if t := (q-lo)&^q&hi | (s-lo)&^s&hi | (v-0x20*lo)&^v&hi; t != 0 {
			return i + bits.TrailingZeros64(t)/8
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
			return i
		}
	}
	return len(b)
}

func (p *jsonParser) hex4() (rune, bool) {
	if len(p.b)-p.i < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(p.b[p.i:p.i+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	p.i += 4
	return rune(n), true
}
