package jsonscan

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// valid reports whether b holds one JSON value, as SkipValue reads it.
func valid(b []byte) bool {
	i := SkipSpace(b, 0)
	end, err := SkipValue(b, i)
	return err == nil && Trailing(b, end) == nil
}

func TestSkipValueAcceptsWhatEncodingJSONAccepts(t *testing.T) {
	for _, doc := range []string{
		`{}`, `[]`, ` {"a" : [1, -2.5e+3, true, false, null, "x\"\\\/\b\f\n\r\t\u00e9"]} `, `"plain"`, `0`, `-0.0E-1`,
		`{"a":{"b":{"c":[[[]]]}}}`, `"` + strings.Repeat("abcdefgh", 9) + `é"`,
	} {
		if !json.Valid([]byte(doc)) || !valid([]byte(doc)) {
			t.Errorf("%s: encoding/json valid %v, SkipValue valid %v", doc, json.Valid([]byte(doc)), valid([]byte(doc)))
		}
	}
	for _, doc := range []string{
		``, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[1 2]`, `{"a":1 "b":2}`, `01`, `1.`, `1e`, `-`, `+1`, `.5`,
		`tru`, `nul`, `"\x"`, `"\u12"`, "\"a\x01b\"", `"unterminated`, `"` + strings.Repeat("x", 20) + "\n" + `"`,
		`{"a":1}}`, `[1]x`, `{1:2}`, `'a'`,
	} {
		if json.Valid([]byte(doc)) || valid([]byte(doc)) {
			t.Errorf("%q: encoding/json valid %v, SkipValue valid %v; want both invalid", doc, json.Valid([]byte(doc)), valid([]byte(doc)))
		}
	}
}

func TestSkipValueRefusesNestingBeyondMaxDepth(t *testing.T) {
	ok := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	deep := "[" + ok + "]"
	if !valid([]byte(ok)) || valid([]byte(deep)) {
		t.Errorf("depth %d valid %v, depth %d valid %v", MaxDepth, valid([]byte(ok)), MaxDepth+1, valid([]byte(deep)))
	}
}

func TestSpecialFindsTheFirstQuoteBackslashOrControlCharacter(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want int
	}{
		{"", -1}, {"abcdefghijklmnop", -1}, {`abcdefgh"`, 8}, {`abc\defgh"`, 3}, {"abcdefghijk\tl", 11},
		{"\x7f\x80\xff\xfe\x21\x22", 5}, {"é\"", 2}, {"aaaaaaaa\x00", 8}, {"\x1f", 0},
	} {
		if got := special([]byte(tc.s)); got != tc.want {
			t.Errorf("special(%q) = %d, want %d", tc.s, got, tc.want)
		}
	}
}

func TestMembersReadsEveryMemberAsWritten(t *testing.T) {
	doc := ` { "model" : "m", "n":[1, {"x":2}], "mo\u0064el":null , "e":{} } `
	var names, values []string
	err := Members([]byte(doc), func(name, value []byte) error {
		names, values = append(names, string(Name(name))), append(values, string(value))
		return nil
	})
	if err != nil || !slices.Equal(names, []string{"model", "n", "model", "e"}) ||
		!slices.Equal(values, []string{`"m"`, `[1, {"x":2}]`, `null`, `{}`}) {
		t.Fatalf("Members = %v: names %q values %q", err, names, values)
	}
	for _, bad := range []string{`[1]`, `{"a":1`, `{"a":1}x`, `{"a" 1}`} {
		if err := Members([]byte(bad), func(_, _ []byte) error { return nil }); err == nil {
			t.Errorf("Members(%s) = nil, want an error", bad)
		}
	}
}

func TestScalars(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{{"0", 0, true}, {"-7", -7, true}, {"123456", 123456, true}, {"1.5", 0, false}, {"1e3", 0, false},
		{"99999999999999999999", 0, false}, {`"1"`, 0, false}} {
		n, err := Int([]byte(tc.in))
		if (err == nil) != tc.ok || n != tc.want {
			t.Errorf("Int(%s) = %d, %v", tc.in, n, err)
		}
	}
	for _, tc := range []struct {
		in        string
		v, null   bool
		wantError bool
	}{{"true", true, false, false}, {"false", false, false, false}, {"null", false, true, false}, {"1", false, false, true}} {
		v, null, err := Bool([]byte(tc.in))
		if v != tc.v || null != tc.null || (err != nil) != tc.wantError {
			t.Errorf("Bool(%s) = %v, %v, %v", tc.in, v, null, err)
		}
	}
	for _, tc := range []struct{ in, want string }{{`"a b"`, "a b"}, {`"a\nb\u00e9"`, "a\nbé"}, {`null`, ""}} {
		if s, err := String([]byte(tc.in)); err != nil || s != tc.want {
			t.Errorf("String(%s) = %q, %v", tc.in, s, err)
		}
	}
	if _, err := String([]byte(`7`)); err == nil {
		t.Error("String(7) = nil error")
	}
}

func TestParseTokenIDs(t *testing.T) {
	ids, end, err := ParseTokenIDs([]byte(`[1, 2 ,4294967295] `), 0, nil)
	if err != nil || !slices.Equal(ids, []uint32{1, 2, 4294967295}) || end != 18 {
		t.Fatalf("ParseTokenIDs = %v, %d, %v", ids, end, err)
	}
	for _, bad := range []string{`[1,`, `[-1]`, `[4294967296]`, `[1.5]`, `["a"]`, `{}`} {
		if _, _, err := ParseTokenIDs([]byte(bad), 0, nil); err == nil {
			t.Errorf("ParseTokenIDs(%s) = nil error", bad)
		}
	}
}

// FuzzParseTokenIDsAgreesWithEncodingJSON checks ParseTokenIDs against
// encoding/json decoding into []uint32: the same verdict on any bytes, and
// the same ids.
func FuzzParseTokenIDsAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{`[1, 2 ,4294967295] `, `[4294967296]`, `[0,01]`, `[12345678901]`, `[1e3]`, `[1.0]`,
		`[-1]`, `null`, `[]`, `[ 0 ]`, `[9999999999]`, `[00]`, `[1,]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		i := SkipSpace(b, 0)
		if i >= len(b) {
			return
		}
		got, end, err := ParseTokenIDs(b, i, nil)
		if err == nil {
			err = Trailing(b, end)
		}
		var want []uint32
		wantErr := json.Unmarshal(b, &want)
		if (err == nil) != (wantErr == nil) || err == nil && !slices.Equal(got, want) {
			t.Fatalf("ParseTokenIDs(%q) = %v, %v; encoding/json: %v, %v", b, got, err, want, wantErr)
		}
	})
}

// BenchmarkParseTokenIDs reads the 8,192 ids of a /tokenize reply, of a
// vocabulary of 151,936 (Qwen's).
func BenchmarkParseTokenIDs(b *testing.B) {
	ids := make([]uint32, 8192)
	for i := range ids {
		ids[i] = uint32(i*7919) % 151936
	}
	body, err := json.Marshal(ids)
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]uint32, 0, len(ids))
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, _, err := ParseTokenIDs(body, 0, dst); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzSkipValueAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":"c\u00e9"}],"d":-1.5e3}`, `[`, `"\u`, `{"a":tru}`, `[01]`, "\"\x7f\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if bytes.Count(b, []byte("["))+bytes.Count(b, []byte("{")) > MaxDepth {
			return
		}
		if got, want := valid(b), json.Valid(b); got != want {
			t.Fatalf("SkipValue valid %v, encoding/json %v for %q", got, want, b)
		}
		if !valid(b) || SkipSpace(b, 0) >= len(b) || b[SkipSpace(b, 0)] != '"' {
			return
		}
		var want string
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		if got, err := String(bytes.TrimSpace(b)); err != nil || got != want {
			t.Fatalf("String(%q) = %q, %v; want %q", b, got, err, want)
		}
	})
}

// TestLaxIntReadsWhatPydanticReadsAsAnInt pins LaxInt to pydantic's lax
// reading of an int field, which vLLM validates requests with.
func TestLaxIntReadsWhatPydanticReadsAsAnInt(t *testing.T) {
	const maxInt = int(^uint(0) >> 1)
	for _, tc := range []struct {
		in   string
		want int
	}{
		{`100`, 100}, {`-7`, -7}, {`-0`, 0}, {`100.0`, 100}, {`1e3`, 1000}, {`1E+2`, 100}, {`-2.50e1`, -25}, {`0.0`, 0},
		{`1e-400`, 0}, {`9223372036854774784.0`, 9223372036854774784}, {`99999999999999999999`, maxInt},
		{`-99999999999999999999`, -maxInt - 1}, {`true`, 1}, {`false`, 0},
		{`"100"`, 100}, {`"-7"`, -7}, {`" 100 "`, 100}, {"\"\\t42\\n\"", 42}, {"\"\u00a042\"", 42}, {`"+5"`, 5},
		{`"007"`, 7}, {`"-007"`, -7}, {`"1_000"`, 1000}, {`"1_000.00"`, 1000}, {`"100.0"`, 100}, {`"0_0_1"`, 1},
		{`"0.0"`, 0}, {`"-0.0"`, 0}, {`"0-1"`, -1}, {`"\u0031\u0030"`, 10}, {`"99999999999999999999"`, maxInt},
	} {
		n, null, err := LaxInt([]byte(tc.in))
		if err != nil || null || n != tc.want {
			t.Errorf("LaxInt(%s) = %d, %v, %v; want %d", tc.in, n, null, err, tc.want)
		}
	}
	if _, null, err := LaxInt([]byte(`null`)); !null || err != nil {
		t.Errorf("LaxInt(null) = null %v, %v", null, err)
	}
	for _, in := range []string{
		`1.5`, `1e400`, `-1e400`, `9223372036854775808.0`, `-9223372036854775808.0`, `1e-1`, `"1.5"`, `"1e3"`, `"abc"`,
		`""`, `" "`, `"+-1"`, `"--1"`, `"-+1"`, `"1_"`, `"_1"`, `"1__0"`, `"1."`, `"0x10"`, `"1 0"`, `"١"`, `[1]`, `{}`,
		`"` + strings.Repeat("1", MaxIntDigits+1) + `"`, strings.Repeat("1", MaxIntDigits+1), `01`, `1.`, ``, `nul`,
	} {
		if n, null, err := LaxInt([]byte(in)); err == nil {
			t.Errorf("LaxInt(%.40s) = %d, %v; want an error", in, n, null)
		}
	}
}

// TestLaxBoolReadsWhatPydanticReadsAsABool pins LaxBool to pydantic's lax
// reading of a bool field.
func TestLaxBoolReadsWhatPydanticReadsAsABool(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{`true`, true}, {`false`, false}, {`1`, true}, {`0`, false}, {`-0`, false}, {`1.0`, true}, {`1e0`, true},
		{`-0.0`, false}, {`0e5`, false}, {`"1"`, true}, {`"0"`, false}, {`"true"`, true}, {`"FALSE"`, false},
		{`"True"`, true}, {`"yes"`, true}, {`"No"`, false}, {`"on"`, true}, {`"OFF"`, false}, {`"t"`, true},
		{`"F"`, false}, {`"y"`, true}, {`"n"`, false}, {`"tRuE"`, true}, {`"\u0079es"`, true},
	} {
		v, null, err := LaxBool([]byte(tc.in))
		if err != nil || null || v != tc.want {
			t.Errorf("LaxBool(%s) = %v, %v, %v; want %v", tc.in, v, null, err, tc.want)
		}
	}
	if _, null, err := LaxBool([]byte(`null`)); !null || err != nil {
		t.Errorf("LaxBool(null) = null %v, %v", null, err)
	}
	for _, in := range []string{`2`, `-1`, `0.5`, `1e400`, `"2"`, `"01"`, `" true"`, `"true "`, `"yeſ"`, `"maybe"`,
		`""`, `"1.0"`, `[]`, `{}`, `tru`, ``} {
		if v, null, err := LaxBool([]byte(in)); err == nil {
			t.Errorf("LaxBool(%s) = %v, %v; want an error", in, v, null)
		}
	}
}

// FuzzLaxIntAgreesWithEncodingJSONAndStrconv checks LaxInt where another
// reader gives the answer: an integer encoding/json reads into an int, a
// number it reads into a float64 (a whole one within range reads as
// that), and a string strconv.Atoi reads.
func FuzzLaxIntAgreesWithEncodingJSONAndStrconv(f *testing.F) {
	for _, s := range []string{`7`, `-0`, `1e3`, `1.5`, `"+007"`, `" 12 "`, `"1_0"`, `1e400`, `true`, `null`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, null, err := LaxInt(b)
		var i int
		if json.Unmarshal(b, &i) == nil && !bytes.Equal(bytes.TrimSpace(b), []byte("null")) && bytes.Equal(bytes.TrimSpace(b), b) {
			if err != nil || null || got != i {
				t.Fatalf("LaxInt(%s) = %d, %v, %v; encoding/json reads %d", b, got, null, err, i)
			}
			return
		}
		var fl float64
		if json.Unmarshal(b, &fl) == nil && bytes.Equal(bytes.TrimSpace(b), b) && bytes.ContainsAny(b, ".eE") {
			whole := fl == math.Trunc(fl) && fl > math.MinInt64 && fl < math.MaxInt64
			if (err == nil) != whole || whole && got != int(fl) {
				t.Fatalf("LaxInt(%s) = %d, %v; encoding/json reads %v", b, got, err, fl)
			}
			return
		}
		var s string
		if json.Unmarshal(b, &s) == nil && bytes.Equal(bytes.TrimSpace(b), b) && b[0] == '"' {
			if n, aerr := strconv.Atoi(s); aerr == nil && len(s) <= MaxIntDigits {
				if err != nil || got != n {
					t.Fatalf("LaxInt(%s) = %d, %v; strconv.Atoi reads %d", b, got, err, n)
				}
			}
		}
	})
}

func TestTypeAndReadsTheTagAndOneMember(t *testing.T) {
	for _, c := range []struct {
		raw, typ, value string
		fails           bool
	}{
		{raw: `{"type":"text","text":"hi","x":1}`, typ: `"text"`, value: `"hi"`},
		{raw: `{"text":{"a":[1]} , "type" : "text"}`, typ: `"text"`, value: `{"a":[1]}`},
		{raw: `{"\u0074ype":"a","type":"b"}`, typ: `"b"`},
		{raw: `{"other":1}`},
		{raw: `[1]`, fails: true},
		{raw: `{"type":"text",}`, fails: true},
	} {
		typ, value, err := TypeAnd([]byte(c.raw), "text")
		if (err != nil) != c.fails || !c.fails && (string(typ) != c.typ || string(value) != c.value) {
			t.Errorf("TypeAnd(%s) = %s, %s, %v; want %s, %s, failing %v", c.raw, typ, value, err, c.typ, c.value, c.fails)
		}
	}
}
