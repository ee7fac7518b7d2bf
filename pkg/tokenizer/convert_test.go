package tokenizer

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// wantChat is the chat request a conversion of another API's body
// (ChatFromAnthropic, ChatFromResponses) gives: messages, tools and
// chat_template_kwargs as JSON (compared once compacted), the reasoning
// effort and max_tokens (0 for none).
type wantChat struct {
	messages, tools, kwargs, effort string
	maxTokens                       int
}

// checkConverted checks got, a conversion's result, against want: model
// m, the JSON members, chat_template_kwargs as json.dumps writes it, the
// effort, max_tokens and max_completion_tokens, and a /tokenize body.
func checkConverted(t *testing.T, got *ChatRequest, want wantChat) {
	t.Helper()
	if got.Model != "m" {
		t.Errorf("model %q, want m", got.Model)
	}
	for _, f := range []struct {
		name      string
		got, want string
	}{
		{"messages", string(got.Messages), want.messages},
		{"tools", string(got.Tools), want.tools},
		{"chat_template_kwargs", string(got.ChatTemplateKwargs), want.kwargs},
	} {
		if g, w := compactJSON(t, f.got), compactJSON(t, f.want); g != w {
			t.Errorf("%s:\n got %s\nwant %s", f.name, g, w)
		}
	}
	if want.kwargs != "" && string(got.ChatTemplateKwargs) != want.kwargs {
		t.Errorf("chat_template_kwargs %s, want as json.dumps writes it: %s", got.ChatTemplateKwargs, want.kwargs)
	}
	if got.ReasoningEffort != want.effort {
		t.Errorf("reasoning_effort %q, want %q", got.ReasoningEffort, want.effort)
	}
	for _, m := range []struct {
		name string
		p    *int
	}{{"max_tokens", got.MaxTokens}, {"max_completion_tokens", got.MaxCompletionTokens}} {
		switch {
		case want.maxTokens == 0 && m.p != nil:
			t.Errorf("%s %d, want none", m.name, *m.p)
		case want.maxTokens != 0 && (m.p == nil || *m.p != want.maxTokens):
			t.Errorf("%s %v, want %d", m.name, m.p, want.maxTokens)
		}
	}
	if _, err := got.body(); err != nil {
		t.Errorf("the converted request has no /tokenize body: %v", err)
	}
}

// request is the OpenAI chat request w describes.
func (w wantChat) request() *ChatRequest {
	req := &ChatRequest{Model: "m", Messages: json.RawMessage(w.messages), ReasoningEffort: w.effort}
	if w.tools != "" {
		req.Tools = json.RawMessage(w.tools)
	}
	if w.kwargs != "" {
		req.ChatTemplateKwargs = json.RawMessage(w.kwargs)
	}
	return req
}

// refusal is a body a conversion refuses, and the reason it gives.
type refusal struct {
	name, body string
	reason     Reason
}

// checkRefusals checks that convert refuses each body with its reason, an
// *Error, and returns no request with it.
func checkRefusals(t *testing.T, convert func([]byte) (*ChatRequest, error), refusals []refusal) {
	t.Helper()
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			got, err := convert([]byte(tt.body))
			if err == nil {
				t.Fatalf("converted to %s, want a %s error", got.Messages, tt.reason)
			}
			if got != nil {
				t.Errorf("returned %+v with error %v", got, err)
			}
			var e *Error
			if !errors.As(err, &e) || e.Reason != tt.reason {
				t.Fatalf("error %v, want reason %s", err, tt.reason)
			}
		})
	}
}

// chatPair is a converted request and the OpenAI chat it is equivalent to;
// mustTokenize: both render in process.
type chatPair struct {
	name              string
	converted, openAI *ChatRequest
	mustTokenize      bool
}

// tokenizesAsTheEquivalentChat renders each pair with each of tks, through
// the package's in-process chat path, and checks that the converted
// request gives the ids of the equivalent OpenAI chat, or that both are
// refused alike.
func tokenizesAsTheEquivalentChat(t *testing.T, tks map[string]*hf.Tokenizer, pairs []chatPair) {
	for _, p := range pairs {
		for name, tk := range tks {
			t.Run(p.name+"/"+name, func(t *testing.T) {
				want, wantErr := chatIDs(tk, p.openAI)
				got, err := chatIDs(tk, p.converted)
				switch {
				case (err == nil) != (wantErr == nil):
					t.Fatalf("converted request: %v; equivalent OpenAI chat: %v", err, wantErr)
				case err != nil && p.mustTokenize:
					t.Fatalf("not rendered in process: %v", err)
				case !slices.Equal(got, want):
					t.Fatalf("ids differ from the equivalent OpenAI chat's: %s", firstDifference(got, want))
				}
			})
		}
	}
}

// TestConversionsDoNotShareTheBodysBytes overwrites each body once
// converted and checks that the chat request made of it holds the same
// JSON: the conversions copy texts as written but do not retain the body.
func TestConversionsDoNotShareTheBodysBytes(t *testing.T) {
	type conversion struct {
		name    string
		body    string
		convert func([]byte) (*ChatRequest, error)
	}
	cases := []conversion{
		{"codex_turn", codexTurnResponses, ChatFromResponses},
		{"claude_code_turn", claudeCodeTurnAnthropic, ChatFromAnthropic},
	}
	for _, c := range responsesCases {
		cases = append(cases, conversion{"responses/" + c.name, c.body, ChatFromResponses})
	}
	for _, c := range anthropicCases {
		convert := ChatFromAnthropic
		if c.countTokens {
			convert = ChatFromAnthropicCountTokens
		}
		cases = append(cases, conversion{"anthropic/" + c.name, c.body, convert})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := []byte(c.body)
			req, err := c.convert(body)
			if err != nil {
				t.Fatal(err)
			}
			want := [][]byte{slices.Clone(req.Messages), slices.Clone(req.Tools), slices.Clone(req.ChatTemplateKwargs)}
			for i := range body {
				body[i] = '#'
			}
			for i, got := range [][]byte{req.Messages, req.Tools, req.ChatTemplateKwargs} {
				if string(got) != string(want[i]) {
					t.Errorf("overwriting the body changed the request's JSON from %s to %s", want[i], got)
				}
			}
		})
	}
}
