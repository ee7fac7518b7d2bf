package simserver

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// postRaw sends body, as written, and returns the status and response body.
func (ts *testServer) postRaw(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	return ts.send(t, http.MethodPost, path, body, nil)
}

// send sends a request of method to path, with body as JSON (a POST's
// even when empty) and header's fields, and returns the status and
// response body.
func (ts *testServer) send(t *testing.T, method, path, body string, header map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, ts.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" || method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// answer is what a test reads of a served completions or chat request.
type answer struct {
	stream  bool
	choices int
	tokens  int // completion tokens, from usage
	prompt  int // prompt tokens, from usage
	usage   bool
	text    string
}

// readAnswer reads a 200 response body, whole or streamed.
func readAnswer(t *testing.T, body []byte) answer {
	t.Helper()
	if !bytes.HasPrefix(body, []byte("data: ")) {
		r := decode[completionResp](t, body)
		a := answer{choices: len(r.Choices), usage: r.Usage != nil}
		if r.Usage != nil {
			a.tokens, a.prompt = r.Usage.CompletionTokens, r.Usage.PromptTokens
		}
		for _, c := range r.Choices {
			a.text += c.Text
		}
		return a
	}
	a := answer{stream: true}
	seen := map[int]bool{}
	for _, ev := range sseEvents(t, body) {
		if ev == "[DONE]" {
			continue
		}
		r := decode[completionResp](t, []byte(ev))
		for _, c := range r.Choices {
			seen[c.Index] = true
			a.text += c.Text
		}
		if r.Usage != nil {
			a.usage, a.tokens, a.prompt = true, r.Usage.CompletionTokens, r.Usage.PromptTokens
		}
	}
	a.choices = len(seen)
	return a
}

func TestRequestMembersAreReadAsVLLMsLaxValidationReadsThem(t *testing.T) {
	ts := startServer(t, 1, nil)
	const chat = `"messages":[{"role":"user","content":"hi there"}]`
	// Prompt tokens of chat with and without the generation prompt and
	// special tokens, and of "lax prompt" with and without BOS.
	base := func(path, members string) answer {
		status, body := ts.postRaw(t, path, "{"+members+"}")
		if status != http.StatusOK {
			t.Fatalf("%s %s: status %d: %s", path, members, status, body)
		}
		return readAnswer(t, body)
	}
	withBOS := base("/v1/completions", `"prompt":"lax prompt","max_tokens":1`).prompt
	noBOS := base("/v1/completions", `"prompt":"lax prompt","max_tokens":1,"add_special_tokens":false`).prompt
	chatGen := base("/v1/chat/completions", chat+`,"max_tokens":1`).prompt
	chatNoGen := base("/v1/chat/completions", chat+`,"max_tokens":1,"add_generation_prompt":false`).prompt
	seeded := base("/v1/completions", `"prompt":"lax prompt","max_tokens":4,"seed":7`).text
	if withBOS == noBOS || chatGen == chatNoGen {
		t.Fatalf("prompt tokens do not tell the options apart: %d %d %d %d", withBOS, noBOS, chatGen, chatNoGen)
	}

	for _, tc := range []struct {
		name    string
		path    string // default /v1/completions
		members string // besides the prompt (or messages)
		want    func(answer) bool
	}{
		{"stream as a string", "", `"stream":"true","max_tokens":2`, func(a answer) bool { return a.stream }},
		{"stream as 1", "", `"stream":1,"max_tokens":2`, func(a answer) bool { return a.stream }},
		{"stream as 1.0", "", `"stream":1.0,"max_tokens":2`, func(a answer) bool { return a.stream }},
		{"stream off", "", `"stream":"off","max_tokens":2`, func(a answer) bool { return !a.stream }},
		{"stream null", "", `"stream":null,"max_tokens":2`, func(a answer) bool { return !a.stream }},
		{"max_tokens as a string", "", `"max_tokens":"3"`, func(a answer) bool { return a.tokens == 3 }},
		{"max_tokens as a float", "", `"max_tokens":3.0`, func(a answer) bool { return a.tokens == 3 }},
		{"max_tokens in exponent form", "", `"max_tokens":3e0`, func(a answer) bool { return a.tokens == 3 }},
		{"max_tokens as a padded string", "", `"max_tokens":" +0_3.00 "`, func(a answer) bool { return a.tokens == 3 }},
		{"max_tokens true", "", `"max_tokens":true`, func(a answer) bool { return a.tokens == 1 }},
		{"max_tokens null", "", `"max_tokens":null`, func(a answer) bool { return a.tokens > 0 }},
		{"n as a float", "", `"n":1.0,"max_tokens":1`, func(a answer) bool { return a.choices == 1 }},
		{"n as a string", "", `"n":"2","max_tokens":1`, func(a answer) bool { return a.choices == 2 }},
		{"chat n null", "/v1/chat/completions", `"n":null,"max_tokens":1`, func(a answer) bool { return a.choices == 1 }},
		{"include_usage yes", "", `"stream":true,"stream_options":{"include_usage":"yes"},"max_tokens":2`,
			func(a answer) bool { return a.stream && a.usage }},
		{"include_usage 0", "", `"stream":true,"stream_options":{"include_usage":0},"max_tokens":2`,
			func(a answer) bool { return a.stream && !a.usage }},
		{"continuous_usage_stats as a string", "", `"stream":true,"stream_options":{"continuous_usage_stats":"false"},"max_tokens":2`,
			func(a answer) bool { return a.stream && a.usage }},
		{"seed as a string", "", `"seed":"7","max_tokens":4`, func(a answer) bool { return a.text == seeded }},
		{"seed as a float", "", `"seed":7.0,"max_tokens":4`, func(a answer) bool { return a.text == seeded }},
		{"seed at int64's bound", "", `"seed":"9223372036854775807","max_tokens":1`, func(a answer) bool { return a.tokens == 1 }},
		{"add_special_tokens as a string", "", `"add_special_tokens":"no","max_tokens":1`, func(a answer) bool { return a.prompt == noBOS }},
		{"add_special_tokens as 0", "", `"add_special_tokens":0,"max_tokens":1`, func(a answer) bool { return a.prompt == noBOS }},
		{"add_generation_prompt as a string", "/v1/chat/completions", `"add_generation_prompt":"False","max_tokens":1`,
			func(a answer) bool { return a.prompt == chatNoGen }},
		{"max_completion_tokens as a string", "/v1/chat/completions", `"max_completion_tokens":"2"`,
			func(a answer) bool { return a.tokens == 2 }},
		{"chat stream as a string", "/v1/chat/completions", `"stream":"TRUE","max_tokens":1`, func(a answer) bool { return a.stream }},
		{"a repeated member, the last valid", "", `"max_tokens":"three","max_tokens":"2"`, func(a answer) bool { return a.tokens == 2 }},
		{"unread sampling members", "", `"ignore_eos":"true","temperature":"0.5","min_tokens":"1","max_tokens":1`,
			func(a answer) bool { return a.tokens == 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, prompt := tc.path, `"prompt":"lax prompt"`
			if path == "" {
				path = "/v1/completions"
			}
			if path == "/v1/chat/completions" {
				prompt = chat
			}
			status, body := ts.postRaw(t, path, "{"+prompt+","+tc.members+"}")
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			if a := readAnswer(t, body); !tc.want(a) {
				t.Errorf("answer %+v", a)
			}
		})
	}

	for _, tc := range []struct {
		name    string
		path    string
		members string
	}{
		{"stream maybe", "", `"stream":"maybe"`},
		{"stream 2", "", `"stream":2`},
		{"stream with surrounding space", "", `"stream":" true"`},
		{"stream an array", "", `"stream":[true]`},
		{"max_tokens with a fraction", "", `"max_tokens":1.5`},
		{"max_tokens as a string with a fraction", "", `"max_tokens":"1.5"`},
		{"max_tokens as words", "", `"max_tokens":"three"`},
		{"max_tokens beyond any context", "", `"max_tokens":"99999999999999999999999"`},
		{"n with a fraction", "", `"n":1.5`},
		{"completions n null", "", `"n":null`},
		{"include_usage maybe", "", `"stream":true,"stream_options":{"include_usage":"maybe"}`},
		{"continuous_usage_stats maybe", "", `"stream":true,"stream_options":{"continuous_usage_stats":"maybe"}`},
		{"seed beyond int64", "", `"seed":9223372036854775808`},
		{"seed as a string beyond int64", "", `"seed":"9_223_372_036_854_775_808"`},
		{"seed below int64", "", `"seed":"-9223372036854775809"`},
		{"seed with a fraction", "", `"seed":7.5`},
		{"add_special_tokens null", "", `"add_special_tokens":null`},
		{"add_special_tokens yes please", "", `"add_special_tokens":"yes please"`},
		{"add_generation_prompt null", "/v1/chat/completions", `"add_generation_prompt":null`},
		{"continue_final_message 2", "/v1/chat/completions", `"continue_final_message":2`},
		{"max_completion_tokens with a fraction", "/v1/chat/completions", `"max_completion_tokens":2.5`},
		{"tokenize add_special_tokens maybe", "/tokenize", `"add_special_tokens":"maybe"`},
	} {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			path, prompt := tc.path, `"prompt":"lax prompt"`
			if path == "" {
				path = "/v1/completions"
			}
			if path == "/v1/chat/completions" {
				prompt = chat
			}
			status, body := ts.postRaw(t, path, "{"+prompt+","+tc.members+"}")
			if status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", status, body)
			}
			var e apiError
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" {
				t.Errorf("error body %s", body)
			}
		})
	}
	if q := ts.queue(0); q.Waiting+q.Running != 0 {
		t.Errorf("refused requests left work behind: %+v", q)
	}
}
