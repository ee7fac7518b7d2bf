package tokenizer

import (
	"errors"
	"strings"
	"testing"
)

// TestAppendPyDumpsWritesWhatPythonWrites checks values against the text
// Python 3's json.dumps(json.loads(raw)) writes for them.
func TestAppendPyDumpsWritesWhatPythonWrites(t *testing.T) {
	for _, tt := range []struct{ raw, want string }{
		{`{}`, `{}`},
		{`[]`, `[]`},
		{` { "b" : [ 1 , 2 ] , "a" : { } } `, `{"b": [1, 2], "a": {}}`},
		{`[true,false,null]`, `[true, false, null]`},
		{`[0,-0,7,-12,123456789012345678901234567890]`, `[0, 0, 7, -12, 123456789012345678901234567890]`},
		{`[0.0,-0.0,1.0,1E2,1e-7,2.50,0.1,100.0]`, `[0.0, -0.0, 1.0, 100.0, 1e-07, 2.5, 0.1, 100.0]`},
		{`[1e15,1e16,123456789012345678,0.0001,0.00001,1.5e300,5e-324,1e-400,-1e-400]`,
			`[1000000000000000.0, 1e+16, 123456789012345678, 0.0001, 1e-05, 1.5e+300, 5e-324, 0.0, -0.0]`},
		{`[1234567890123456.7,12345678901234567.0,0.000123,3.141592653589793,1.7976931348623157e308,2.2250738585072014E-308]`,
			`[1234567890123456.8, 1.2345678901234568e+16, 0.000123, 3.141592653589793, 1.7976931348623157e+308, 2.2250738585072014e-308]`},
		{`"plain / text"`, `"plain / text"`},
		{`"q\"b\\s\/n\nr\rt\tb\bf\f"`, `"q\"b\\s/n\nr\rt\tb\bf\f"`},
		{`"\u0000\u001f\u007f é€😀"`, `"\u0000\u001f\u007f \u00e9\u20ac\ud83d\ude00"`},
		{`"\uD83D\uDE00\u00E9"`, `"\ud83d\ude00\u00e9"`},
		{`{"日本":"語"}`, `{"\u65e5\u672c": "\u8a9e"}`},
	} {
		got, err := appendPyDumps(nil, []byte(tt.raw))
		if err != nil || string(got) != tt.want {
			t.Errorf("appendPyDumps(%s) = %s, %v; want %s", tt.raw, got, err, tt.want)
		}
	}
}

// TestAppendPyDumpsRefusesWhatPythonReadsUnlikeGo checks the values whose
// Python reading is not reproduced, and the bounds' edges, which are.
func TestAppendPyDumpsRefusesWhatPythonReadsUnlikeGo(t *testing.T) {
	nested := func(depth int) string { return strings.Repeat("[", depth) + strings.Repeat("]", depth) }
	for _, tt := range []struct {
		raw    string
		refuse bool
	}{
		{`"\ud800"`, true},
		{`"\udc00\ud800"`, true},
		{`"\ud800\u0041"`, true},
		{`"\ud83d\ude00"`, false},
		{`{"a":1,"a":1}`, true},
		{`{"a":{"b":1},"b":{"b":1}}`, false},
		{`1e309`, true},
		{`-1e309`, true},
		{`1.7976931348623157e308`, false},
		{strings.Repeat("9", 4301), true},
		{strings.Repeat("9", 4300), false},
		{nested(maxPyDepth + 1), true},
		{nested(maxPyDepth), false},
	} {
		got, err := appendPyDumps(nil, []byte(tt.raw))
		switch {
		case tt.refuse && !errors.Is(err, errNotReproducible):
			t.Errorf("appendPyDumps(%.60s) = %.60s, %v; want it refused", tt.raw, got, err)
		case !tt.refuse && err != nil:
			t.Errorf("appendPyDumps(%.60s): %v", tt.raw, err)
		}
	}
}
