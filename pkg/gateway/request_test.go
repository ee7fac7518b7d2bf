package gateway

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// memberNames lists the members of the bodies decode reads.
var memberNames = func() []string {
	var names []string
	for _, t := range []reflect.Type{reflect.TypeFor[completionBody](), reflect.TypeFor[chatBody]()} {
		for f := range allFields(t) {
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
				names = append(names, name)
			}
		}
	}
	return names
}()

// allFields yields the fields of struct type t, those of embedded structs
// included.
func allFields(t reflect.Type) func(func(reflect.StructField) bool) {
	return func(yield func(reflect.StructField) bool) {
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous {
				for g := range allFields(f.Type) {
					if !yield(g) {
						return
					}
				}
				continue
			}
			if !yield(f) {
				return
			}
		}
	}
}

// caseVariant reports whether body has a top-level member whose name
// matches one decode reads only when case is ignored, which encoding/json
// accepts and vLLM does not.
func caseVariant(body []byte) bool {
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil {
		return false
	}
	for name := range members {
		for _, known := range memberNames {
			if name != known && strings.EqualFold(name, known) {
				return true
			}
		}
	}
	return false
}

func TestDecodeReadsTheMembersThatRouteAndTokenize(t *testing.T) {
	body := `{"model":"m\u00e9","prompt":["a"],"stream":true,"stream_options":{"include_usage":false},` +
		`"max_tokens":7,"truncate_prompt_tokens":null,"add_special_tokens":false,"n":{"deep":[1,2,"x"]},"model":"llama"}`
	var in inference
	if err := in.decode(kindCompletion, []byte(body)); err != nil {
		t.Fatal(err)
	}
	c := in.comp
	if c.Model != "llama" || string(c.Prompt) != `["a"]` || !c.Stream || string(c.StreamOptions) != `{"include_usage":false}` ||
		*c.MaxTokens != 7 || c.TruncatePromptTokens != nil || *c.AddSpecialTokens || in.maxTokens() != 7 || c.clientWantsUsage() {
		t.Errorf("decoded %+v", c)
	}
	for _, tc := range []struct{ body, msg string }{
		{`{"model":7}`, `"model" must be a string, not number`},
		{`{"model":"m","stream":"yes"}`, `"stream" must be a boolean, not string`},
		{`{"model":"m","max_tokens":1.5}`, `"max_tokens" must be an integer, not number`},
		{`{"model":"m",}`, `not valid JSON`},
		{`[{"model":"m"}]`, `must be a JSON object`},
		{`{"model":"m"} x`, `not valid JSON`},
	} {
		err := in.decode(kindChat, []byte(tc.body))
		if err == nil || !strings.Contains(jsonError(err), tc.msg) {
			t.Errorf("decode(%s) = %v (%q), want %q", tc.body, err, jsonError(err), tc.msg)
		}
	}
}

func FuzzDecodeAgreesWithEncodingJSON(f *testing.F) {
	f.Add(`{"model":"m","prompt":"hi","stream":true,"max_tokens":3}`, false)
	f.Add(`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":null,"add_generation_prompt":false,`+
		`"max_completion_tokens":null,"chat_template_kwargs":{"a":1},"reasoning_effort":"low"}`, true)
	f.Add(`{"model":null,"stream":null,"stream_options":null,"truncation_side":"left","truncate_prompt_tokens":-1}`, false)
	f.Add(`{"model":"a\u0000\"b","prompt":[[1,2],[3]],"n":1e400}`, true)
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		if caseVariant([]byte(body)) {
			return
		}
		k, want := kindCompletion, any(&completionBody{})
		if chat {
			k, want = kindChat, &chatBody{}
		}
		jerr := json.Unmarshal([]byte(body), want)
		var in inference
		err := in.decode(k, []byte(body))
		if strings.Trim(body, " \t\r\n") == "null" {
			// encoding/json reads null as nothing to set; decode refuses
			// it, as it refuses every body that is not an object.
			if err == nil {
				t.Fatalf("decode(%q) accepted a body that is not an object", body)
			}
			return
		}
		if (err == nil) != (jerr == nil) {
			// encoding/json refuses a body that is not an object, as decode does, with a different error.
			t.Fatalf("decode(%q) = %v, encoding/json %v", body, err, jerr)
		}
		if err != nil {
			return
		}
		var got any = &in.comp
		if chat {
			got = &in.chat
		}
		if !reflect.DeepEqual(normalize(got), normalize(want)) {
			t.Fatalf("decode(%q) = %+v, encoding/json %+v", body, got, want)
		}
	})
}

// normalize returns v with its JSON values compared as bytes, a nil value
// and an empty one alike.
func normalize(v any) any {
	data, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	return m
}

// BenchmarkDecode reads a short completion body and one with a prompt of
// some 2,000 words, by hand (decode) and, for comparison, with
// encoding/json into the same struct.
func BenchmarkDecode(b *testing.B) {
	long := strings.Repeat("the quick brown fox jumps over the lazy dog ", 220)
	for _, bc := range []struct{ name, body string }{
		{"short", completion("Say hello to the proxy in a few words", `,"max_tokens":1,"temperature":0`)},
		{"2k-words", completion(long, `,"max_tokens":1,"temperature":0`)},
	} {
		body := []byte(bc.body)
		b.Run(bc.name+"/jsonscan", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			var in inference
			for b.Loop() {
				if err := in.decode(kindCompletion, body); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/encoding-json", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				var c completionBody
				if err := json.Unmarshal(body, &c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
