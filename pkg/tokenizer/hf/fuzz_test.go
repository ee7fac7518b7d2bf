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
