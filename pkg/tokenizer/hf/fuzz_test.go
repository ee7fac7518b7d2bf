package hf

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzParseValue checks the chat JSON parser against encoding/json: it
// accepts exactly the valid documents, and what it reads of a string is
// what encoding/json reads.
func FuzzParseValue(f *testing.F) {
	for _, seed := range []string{
		`[{"role":"user","content":"hi"}]`, `{"a":[1,2.5,-3e2,true,false,null],"b":{"c":"\u00e9\n\"x\""}}`,
		`"\ud83d\ude00"`, `"\ud800"`, `[1,]`, `{"a" 1}`, `  "x"  `, `nul`, `[[[[]]]]`, `"\u0000"`, "\"\xff\"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		v, err := parseValue(raw)
		if valid := json.Valid(raw); valid != (err == nil) {
			t.Fatalf("parseValue(%q): err %v, json.Valid %v", raw, err, valid)
		}
		// encoding/json leaves a string untouched on null, so only a
		// document that is a JSON string is compared.
		var s string
		if err == nil && bytes.HasPrefix(bytes.TrimLeft(raw, " \t\r\n"), []byte(`"`)) && json.Unmarshal(raw, &s) == nil {
			if !v.IsString() || v.AsString() != s {
				t.Fatalf("parseValue(%q) = %v, encoding/json reads %q", raw, v, s)
			}
		}
	})
}

// TestPlainRunStopsAtTheFirstByteAStringCannotHold checks the eight-bytes-
// at-a-time scan against a byte-by-byte one, with each kind of stop byte
// at every position of a word, behind bytes that are just above, below or
// far from the stop bytes.
func TestPlainRunStopsAtTheFirstByteAStringCannotHold(t *testing.T) {
	want := func(b []byte, i int) int {
		for ; i < len(b); i++ {
			if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
				return i
			}
		}
		return len(b)
	}
	fills := []byte{'a', 0x20, '!', '#', '[', ']', 0x7f, 0x80, 0xa2, 0xdc, 0xff}
	stops := []byte{'"', '\\', 0x00, 0x1f, '\n'}
	for _, fill := range fills {
		for n := range 24 {
			b := bytes.Repeat([]byte{fill}, n)
			if got := plainRun(b, 0); got != n {
				t.Fatalf("plainRun(%q, 0) = %d, want %d", b, got, n)
			}
			for at := range n {
				for _, stop := range stops {
					c := bytes.Clone(b)
					c[at] = stop
					if at+1 < n {
						c[n-1] = '"' // a later stop must not win
					}
					for from := range at + 1 {
						if got, w := plainRun(c, from), want(c, from); got != w {
							t.Fatalf("plainRun(%q, %d) = %d, want %d", c, from, got, w)
						}
					}
				}
			}
		}
	}
}
