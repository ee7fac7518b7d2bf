package hf

import (
	"encoding/json"
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
