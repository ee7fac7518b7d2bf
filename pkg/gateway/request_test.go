package gateway

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
)

// laxReference reads body as decode must, another way: the members as
// encoding/json reads a JSON object into a map (names matched exactly, the
// last of a repeated name winning), then each member decode reads by the
// type of its field: a string or null for a string, the value as written
// for a JSON value, and the lax reading of jsonscan.LaxInt and
// jsonscan.LaxBool for an integer or a boolean.
func laxReference(body []byte, chat bool) (any, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return nil, err
	}
	if members == nil {
		return nil, errNotObject
	}
	var out any = &completionBody{}
	if chat {
		out = &chatBody{}
	}
	v := reflect.ValueOf(out).Elem()
	var fail error
	setFields(v, func(name string, f reflect.Value) {
		raw, ok := members[name]
		if !ok || fail != nil {
			return
		}
		switch f.Interface().(type) {
		case string:
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				fail = err
			}
			f.SetString(s)
		case json.RawMessage:
			f.SetBytes(raw)
		case *int:
			n, null, err := jsonscan.LaxInt(raw)
			if err != nil {
				fail = err
			} else if !null {
				f.Set(reflect.ValueOf(&n))
			}
		case *bool, bool:
			b, null, err := jsonscan.LaxBool(raw)
			switch {
			case err != nil:
				fail = err
			case f.Kind() == reflect.Bool:
				f.SetBool(b)
			case !null:
				f.Set(reflect.ValueOf(&b))
			}
		default:
			panic("a field of type " + f.Type().String())
		}
	})
	return out, fail
}

// setFields calls set with the JSON name and the value of each field of
// struct v, those of embedded structs included.
func setFields(v reflect.Value, set func(name string, f reflect.Value)) {
	for i := range v.NumField() {
		sf := v.Type().Field(i)
		if sf.Anonymous {
			setFields(v.Field(i), set)
			continue
		}
		if name, _, _ := strings.Cut(sf.Tag.Get("json"), ","); name != "" {
			set(name, v.Field(i))
		}
	}
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
		*c.MaxTokens != 7 || c.TruncatePromptTokens != nil || *c.AddSpecialTokens || in.maxTokens() != 7 {
		t.Errorf("decoded %+v", c)
	}
	for _, tc := range []struct{ body, msg string }{
		{`{"model":7}`, `"model" must be a string, not number`},
		{`{"model":"m","stream":"maybe"}`, `"stream" must be a boolean, not string`},
		{`{"model":"m","stream":2}`, `"stream" must be a boolean, not number`},
		{`{"model":"m","max_tokens":1.5}`, `"max_tokens" must be an integer, not number`},
		{`{"model":"m","max_tokens":"many"}`, `"max_tokens" must be an integer, not string`},
		{`{"model":"m","max_tokens":[1]}`, `"max_tokens" must be an integer, not array`},
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

// TestStreamOptionsAreReadAsVLLMReadsThem pins whether a streamed request
// asks for the usage chunk itself to vLLM's reading of stream_options,
// whose include_usage defaults to true.
func TestStreamOptionsAreReadAsVLLMReadsThem(t *testing.T) {
	for _, tc := range []struct {
		opts       string
		wants, bad bool
	}{
		{opts: ``}, {opts: `null`}, {opts: `{}`, wants: true}, {opts: `{"continuous_usage_stats":true}`, wants: true},
		{opts: `{"include_usage":true}`, wants: true}, {opts: `{"include_usage":"Yes"}`, wants: true},
		{opts: `{"include_usage":1}`, wants: true}, {opts: `{"include_usage":false}`}, {opts: `{"include_usage":null}`},
		{opts: `{"include_usage":"off","continuous_usage_stats":"1"}`},
		{opts: `{"include_usage":"maybe"}`, bad: true}, {opts: `{"include_usage":true,"continuous_usage_stats":[]}`, bad: true},
	} {
		s := streamFields{Stream: true, StreamOptions: json.RawMessage(tc.opts)}
		wants, err := s.clientWantsUsage()
		if wants != tc.wants || (err != nil) != tc.bad {
			t.Errorf("stream_options %s: wants usage %v, %v; want %v, error %v", tc.opts, wants, err, tc.wants, tc.bad)
		}
	}
}

// TestDecodeReadsMembersAsVLLMValidatesThem pins decode to vLLM's
// reading of a request (pydantic's lax mode): values encoding/json refuses
// for an integer or a boolean that vLLM accepts, read as vLLM reads them.
func TestDecodeReadsMembersAsVLLMValidatesThem(t *testing.T) {
	for _, tc := range []struct {
		name       string
		chat       bool
		members    string
		stream     bool
		maxTokens  int
		addSpecial *bool
	}{
		{name: "stream as a string", members: `"stream":"true"`, stream: true},
		{name: "stream as a capitalised word", members: `"stream":"Yes"`, stream: true},
		{name: "stream as one", members: `"stream":1`, stream: true},
		{name: "stream as one point zero", members: `"stream":1.0`, stream: true},
		{name: "stream as the string zero", members: `"stream":"0","max_tokens":3`, maxTokens: 3},
		{name: "stream off", members: `"stream":"off","max_tokens":3`, maxTokens: 3},
		{name: "max_tokens as a whole float", members: `"max_tokens":100.0`, maxTokens: 100},
		{name: "max_tokens in exponent form", members: `"max_tokens":1e3`, maxTokens: 1000},
		{name: "max_tokens as a string", members: `"max_tokens":"100"`, maxTokens: 100},
		{name: "max_tokens as a padded string", members: `"max_tokens":" 1_000 "`, maxTokens: 1000},
		{name: "max_tokens beyond int64", members: `"max_tokens":99999999999999999999`, maxTokens: int(^uint(0) >> 1)},
		{name: "max_completion_tokens as a string", chat: true, members: `"max_completion_tokens":"64","max_tokens":8`, maxTokens: 64},
		{name: "add_special_tokens as a string", chat: true, members: `"add_special_tokens":"true"`, addSpecial: new(true)},
		{name: "add_special_tokens as zero", members: `"add_special_tokens":0`, addSpecial: new(false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, body := kindCompletion, `{"model":"m","prompt":"hi",`+tc.members+`}`
			if tc.chat {
				k, body = kindChat, `{"model":"m","messages":[],`+tc.members+`}`
			}
			var in inference
			if err := in.decode(k, []byte(body)); err != nil {
				t.Fatalf("decode(%s): %s", body, jsonError(err))
			}
			add := in.comp.AddSpecialTokens
			if tc.chat {
				add = in.chat.AddSpecialTokens
			}
			if in.stream().Stream != tc.stream || in.maxTokens() != tc.maxTokens || !reflect.DeepEqual(add, tc.addSpecial) {
				t.Errorf("decode(%s): stream %v, max tokens %d, add_special_tokens %v; want %v, %d, %v", body,
					in.stream().Stream, in.maxTokens(), add, tc.stream, tc.maxTokens, tc.addSpecial)
			}
		})
	}
}

// TestARepeatedMemberReadsAsItsLastValueNullIncluded pins decode to
// vLLM's reading of a repeated member, the last one, when that one is
// null: the member reads as absent.
func TestARepeatedMemberReadsAsItsLastValueNullIncluded(t *testing.T) {
	body := `{"model":"m","messages":[],"chat_template":"t","stream":true,"max_tokens":5,` +
		`"model":null,"chat_template":null,"stream":null,"max_tokens":null}`
	var in inference
	if err := in.decode(kindChat, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if in.model() != "" || in.chat.ChatTemplate != "" || in.stream().Stream || in.chat.MaxTokens != nil {
		t.Errorf("decode(%s): model %q, chat_template %q, stream %v, max_tokens %v; want all absent",
			body, in.model(), in.chat.ChatTemplate, in.stream().Stream, in.chat.MaxTokens)
	}
}

// FuzzDecodeAgreesWithTheLaxReading checks decode against laxReference:
// the same verdict on any body, and the same members read.
func FuzzDecodeAgreesWithTheLaxReading(f *testing.F) {
	f.Add(`{"model":"m","prompt":"hi","stream":true,"max_tokens":3}`, false)
	f.Add(`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":null,"add_generation_prompt":false,`+
		`"max_completion_tokens":null,"chat_template_kwargs":{"a":1},"reasoning_effort":"low"}`, true)
	f.Add(`{"model":null,"stream":null,"stream_options":null,"truncation_side":"left","truncate_prompt_tokens":-1}`, false)
	f.Add(`{"model":"a\u0000\"b","prompt":[[1,2],[3]],"n":1e400}`, true)
	f.Add(`{"model":"m","stream":"TRUE","max_tokens":"1_000","max_completion_tokens":1e3,"add_special_tokens":0}`, true)
	f.Add(`{"model":"m","stream":1.0,"max_tokens":" +7 ","truncate_prompt_tokens":true,"add_special_tokens":"off"}`, false)
	f.Add(`{"Model":"m","max_tokens":99999999999999999999,"stream":"1"}`, false)
	f.Add(`{"model":"m","model":null,"stream":true,"stream":null,"max_tokens":5,"max_tokens":null}`, false)
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		k := kindCompletion
		if chat {
			k = kindChat
		}
		want, werr := laxReference([]byte(body), chat)
		var in inference
		err := in.decode(k, []byte(body))
		if (err == nil) != (werr == nil) {
			t.Fatalf("decode(%q) = %v, the lax reading %v", body, err, werr)
		}
		if err != nil {
			return
		}
		var got any = &in.comp
		if chat {
			got = &in.chat
		}
		if !reflect.DeepEqual(normalize(got), normalize(want)) {
			t.Fatalf("decode(%q) = %+v, the lax reading %+v", body, got, want)
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
