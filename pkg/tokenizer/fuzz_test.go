package tokenizer

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeResponse checks that no body makes the response decoder panic,
// and that whatever it accepts is consistent and survives a round trip.
func FuzzDecodeResponse(f *testing.F) {
	for _, seed := range []string{
		`{"count":3,"max_model_len":4096,"tokens":[1,2,3],"token_strs":null}`,
		`{"count":0,"max_model_len":1,"tokens":[]}`,
		`{"count":2,"max_model_len":4096,"tokens":[1,2,3]}`,
		`{"count":1,"max_model_len":4096,"tokens":[-1]}`,
		`{"count":1,"max_model_len":4096,"tokens":[4294967296]}`,
		`{"count":1,"max_model_len":0,"tokens":[7]}`,
		`{"tokens":null}`,
		`[1,2,3]`,
		`null`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		res, err := decodeResponse(body)
		if err != nil {
			return
		}
		if res.maxModelLen <= 0 || res.tokens == nil {
			t.Fatalf("accepted %q as %+v", body, res)
		}
		again, err := json.Marshal(map[string]any{"count": len(res.tokens), "max_model_len": res.maxModelLen, "tokens": res.tokens})
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeResponse(again)
		if err != nil || back.maxModelLen != res.maxModelLen || !slices.Equal(back.tokens, res.tokens) {
			t.Fatalf("round trip of %q: %+v, %v; want %+v", body, back, err, res)
		}
	})
}

// FuzzCompletionPrompt checks that every valid JSON prompt is either
// refused or resolved to exactly one of a JSON string and token ids.
func FuzzCompletionPrompt(f *testing.F) {
	for _, seed := range []string{
		`"hello"`, `["hello"]`, `["a","b"]`, `[1,2,3]`, `[[1,2,3]]`, `[[1],[2]]`, `[]`, `[[]]`,
		`null`, `5`, `{"a":1}`, `[-1]`, `[1.5]`, `[1,"a"]`, `[["a"]]`, ` "x" `,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		r := CompletionRequest{Model: "m", Prompt: raw}
		text, ids, err := r.prompt()
		if err != nil {
			if text != nil || ids != nil {
				t.Fatalf("prompt(%q) returned a result with error %v", raw, err)
			}
			return
		}
		if (text == nil) == (ids == nil) {
			t.Fatalf("prompt(%q) = text %q, ids %v; want exactly one", raw, text, ids)
		}
		if ids != nil && len(ids) == 0 {
			t.Fatalf("prompt(%q) accepted an empty list of token ids", raw)
		}
		var s string
		if text != nil && json.Valid(raw) && json.Unmarshal(text, &s) != nil {
			t.Fatalf("prompt(%q) = text %q, not a JSON string", raw, text)
		}
	})
}

// FuzzErrorMessage checks that whatever an error response holds, the
// message quoted from it is valid UTF-8, bounded and not empty.
func FuzzErrorMessage(f *testing.F) {
	for _, seed := range []string{
		`{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}}`,
		`{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}`,
		`{"error":"plain"}`, `upstream connect error`, "\xff\xfe", ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		msg := errorMessage(body)
		if msg == "" || !utf8.ValidString(msg) || len(msg) > maxErrorMessage+len("…") {
			t.Fatalf("errorMessage(%q) = %q", body, msg)
		}
	})
}

// FuzzChatFromAnthropic checks that no body makes the conversion panic,
// that it returns either a chat request or an *Error, never both, and
// that what it returns is a chat request with a /tokenize body, whose JSON
// values are valid and at most five times larger than the body.
func FuzzChatFromAnthropic(f *testing.F) {
	for _, c := range anthropicCases {
		f.Add([]byte(c.body), c.countTokens)
	}
	f.Add([]byte(claudeCodeTurnAnthropic), false)
	for _, seed := range []string{
		`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","input":{"a":[1e308,-0.0,"\ud800"]}}]}]}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"},{"type":"image"}]}]}]}`,
		`{"model":"m","max_tokens":1,"messages":[],"tools":[{"name":"f","input_schema":{"a":{"b":{}}}}]}`,
		`{"model":"m","max_tokens":1,"system":[{"type":"text","text":"a"}],"messages":[{"role":"system","content":"s"}]}`,
		`null`, `{}`, `[]`, `"x"`,
	} {
		f.Add([]byte(seed), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, countTokens bool) {
		convert := ChatFromAnthropic
		if countTokens {
			convert = ChatFromAnthropicCountTokens
		}
		req, err := convert(body)
		checkConversionResult(t, "convert", body, req, err)
	})
}

// checkConversionResult checks what a conversion, name, made of body: an
// *Error of ReasonInput or ReasonUnsupported and no request, or else a
// request with a model and a /tokenize body, whose JSON values are valid
// and at most five times larger than body.
func checkConversionResult(t *testing.T, name string, body []byte, req *ChatRequest, err error) {
	t.Helper()
	if err != nil {
		var e *Error
		if req != nil || !errors.As(err, &e) || (e.Reason != ReasonInput && e.Reason != ReasonUnsupported) {
			t.Fatalf("%s(%q) = %+v, %v", name, body, req, err)
		}
		return
	}
	if req == nil || req.Model == "" {
		t.Fatalf("%s(%q) = %+v, no error", name, body, req)
	}
	for _, v := range [][]byte{req.Messages, req.Tools, req.ChatTemplateKwargs} {
		if v != nil && !json.Valid(v) {
			t.Fatalf("%s(%q) wrote invalid JSON %q", name, body, v)
		}
	}
	if n := len(req.Messages) + len(req.Tools) + len(req.ChatTemplateKwargs); n > 5*len(body) {
		t.Fatalf("%s(%q) wrote %d bytes of JSON, more than five times the body's %d", name, body, n, len(body))
	}
	if _, err := req.body(); err != nil {
		t.Fatalf("%s(%q) gave a request without a /tokenize body: %v", name, body, err)
	}
}

// FuzzChatFromResponses checks that no body makes the conversion panic,
// that it returns either a chat request or an *Error, never both, and
// that what it returns is a chat request with a /tokenize body, whose JSON
// values are valid and at most five times larger than the body.
func FuzzChatFromResponses(f *testing.F) {
	for _, c := range responsesCases {
		f.Add([]byte(c.body))
	}
	f.Add([]byte(codexTurnResponses))
	for _, seed := range []string{
		`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","namespace":"n","arguments":"{\"a\":[1e308,-0.0]}"}]}`,
		`{"model":"m","input":[{"type":"reasoning","id":"r","summary":[],"encrypted_content":"x"}]}`,
		`{"model":"m","input":"q","tools":[{"type":"namespace","name":"n","description":"","tools":[{"type":"function","name":"f","parameters":{"a":{"b":"\ud800"}}}]}]}`,
		`{"model":"m","input":[{"type":"message","id":"m","role":"assistant","status":"in_progress","content":[{"type":"refusal","refusal":"no"}]}]}`,
		`null`, `{}`, `[]`, `"x"`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ChatFromResponses(body)
		checkConversionResult(t, "ChatFromResponses", body, req, err)
	})
}
