package hf

import (
	"encoding/json"
	"errors"
	"testing"
)

// toolCallChat is a Qwen3 chat whose assistant turn makes one tool call,
// call, given as JSON.
func toolCallChat(call string) Chat {
	return Chat{AddGenerationPrompt: true, Messages: json.RawMessage(`[{"role":"user","content":"What time is it?"},` +
		`{"role":"assistant","content":"","tool_calls":[` + call + `]},` +
		`{"role":"tool","tool_call_id":"call_1","content":"12:00"}]`)}
}

func TestToolCallsWithoutArgumentsRenderAnEmptyObject(t *testing.T) {
	tk := loadModel(t, "qwen3")
	want, err := tk.RenderChat(toolCallChat(`{"type":"function","function":{"name":"get_time","arguments":"{}"}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range []string{
		`{"name":"get_time"}`,
		`{"name":"get_time","arguments":null}`,
		`{"name":"get_time","arguments":""}`,
		`{"name":"get_time","arguments":{}}`,
		`{"name":"get_time","arguments":[]}`,
		`{"name":"get_time","arguments":0}`,
		`{"name":"get_time","arguments":false}`,
		`{"name":"get_time","arguments":" {} "}`,
	} {
		got, err := tk.RenderChat(toolCallChat(`{"function":` + fn + `}`))
		if err != nil || got != want {
			t.Errorf("function %s: rendered %q (%v), want %q", fn, got, err, want)
		}
	}
}

func TestToolCallsVLLMVersionsRenderDifferentlyAreRefused(t *testing.T) {
	tk := loadModel(t, "qwen3")
	for _, call := range []string{
		`{"function":{"name":"f","arguments":"{\"a\":"}}`,
		`{"function":{"name":"f","arguments":"not json"}}`,
		`{"function":{"name":"f","arguments":"[1,2]"}}`,
		`{"function":{"name":"f","arguments":"42"}}`,
		`{"function":{"name":"f","arguments":"\"s\""}}`,
		`{"function":{"name":"f","arguments":[1]}}`,
		`{"function":{"name":"f","arguments":7}}`,
		`{"function":{"name":"f","arguments":true}}`,
		`{"type":"custom","function":{"name":"f","arguments":"{}"}}`,
		`{"type":null,"function":{"name":"f","arguments":"{}"}}`,
		`{"function":"f"}`,
		`{"function":null}`,
		`{"id":"call_1"}`,
		`"f"`,
		`null`,
	} {
		if got, err := tk.RenderChat(toolCallChat(call)); err == nil {
			t.Errorf("tool call %s rendered %q, want an error", call, got)
		}
	}
}

// TestContinueFinalMessageCutsWhereTransformersDoes checks the cut of a
// prefill with white space at its ends. want is the end of what
// transformers' apply_chat_template renders with Qwen3's template, which
// strips only leading newlines from the message: the trailing white
// space stays only when the message has no leading white space and
// appears whole in the rendered chat; Python's strip also removes U+001C.
func TestContinueFinalMessageCutsWhereTransformersDoes(t *testing.T) {
	tk := loadModel(t, "qwen3")
	const head = "<|im_start|>user\nCount to three.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
	for _, tt := range []struct{ final, want string }{
		{" One, two, ", " One, two,"},
		{"One, two, ", "One, two, "},
		{" One, two,", " One, two,"},
		{"\n One, two,\n", " One, two,"},
		{"One, two,\n\n", "One, two,\n\n"},
		{"\u3000One, two,\u3000", "\u3000One, two,"},
		{"\x1cOne, two,\x1c", "\x1cOne, two,"},
		{"\tOne, two,", "\tOne, two,"},
	} {
		final, err := json.Marshal(tt.final)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tk.RenderChat(Chat{
			Messages:             json.RawMessage(`[{"role":"user","content":"Count to three."},{"role":"assistant","content":` + string(final) + `}]`),
			ContinueFinalMessage: true,
		})
		if err != nil || got != head+tt.want {
			t.Errorf("final message %q: rendered %q (%v), want %q", tt.final, got, err, head+tt.want)
		}
	}
}

func TestChatsHoldingNumbersOtherThanInt64IntegersAreRefused(t *testing.T) {
	tk := loadModel(t, "qwen3")
	chat := func(n string) []Chat {
		msgs := json.RawMessage(`[{"role":"user","content":"hi"}]`)
		return []Chat{
			{Messages: msgs, Tools: json.RawMessage(`[{"type":"function","function":{"name":"f","parameters":{"default":` + n + `}}}]`)},
			{Messages: msgs, Documents: json.RawMessage(`[{"text":"d","score":` + n + `}]`)},
			{Messages: msgs, TemplateKwargs: json.RawMessage(`{"n":` + n + `}`)},
			toolCallChat(`{"function":{"name":"f","arguments":{"t":` + n + `}}}`),
			toolCallChat(`{"function":{"name":"f","arguments":"{\"t\":` + n + `}"}}`),
		}
	}
	for _, n := range []string{"1.0", "0.5", "-0.0", "1e6", "1E2", "2e-5", "9223372036854775808", "-9223372036854775809"} {
		for i, c := range chat(n) {
			if got, err := tk.RenderChat(c); !errors.Is(err, ErrInexactNumber) {
				t.Errorf("number %s in chat %d: rendered %q (%v), want ErrInexactNumber", n, i, got, err)
			}
		}
	}
	for _, n := range []string{"0", "-0", "42", "9223372036854775807", "-9223372036854775808"} {
		for i, c := range chat(n) {
			if _, err := tk.RenderChat(c); err != nil {
				t.Errorf("integer %s in chat %d: %v", n, i, err)
			}
		}
	}
}
