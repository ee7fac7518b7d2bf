package hf

import (
	"encoding/json"
	"testing"
)

// toolsChat is a one-message chat offering tools, given as JSON.
func toolsChat(tools string) Chat {
	return Chat{AddGenerationPrompt: true, Messages: json.RawMessage(`[{"role":"user","content":"What time is it?"}]`),
		Tools: json.RawMessage(tools)}
}

// vLLM validates each tool as ChatCompletionToolsParam and hands the
// template tool.model_dump(): type first, then function with name,
// description and parameters, absent ones as null, then the keys it does
// not know, in the client's order. Qwen3's template prints each tool with
// tojson, so key order and nulls reach the prompt.
func TestToolsReachTheTemplateAsVLLMDumpsThem(t *testing.T) {
	tk := loadModel(t, "qwen3")
	for _, tt := range []struct{ client, dumped string }{
		{`{"function":{"parameters":{"type":"object"},"name":"f","description":"d"},"type":"function"}`,
			`{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"}}}`},
		{`{"type":"function","function":{"name":"f"}}`,
			`{"type":"function","function":{"name":"f","description":null,"parameters":null}}`},
		{`{"function":{"name":"f","description":null}}`,
			`{"type":"function","function":{"name":"f","description":null,"parameters":null}}`},
		{`{"x":1,"function":{"strict":true,"name":"f"},"type":"function"}`,
			`{"type":"function","function":{"name":"f","description":null,"parameters":null,"strict":true},"x":1}`},
	} {
		want, err := tk.RenderChat(toolsChat(`[` + tt.dumped + `]`))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := tk.RenderChat(toolsChat(`[` + tt.client + `]`)); err != nil || got != want {
			t.Errorf("tool %s: rendered %q (%v), want %q", tt.client, got, err, want)
		}
	}
}

// Tools vLLM refuses (400) are not rendered here either.
func TestToolsVLLMRefusesAreRefused(t *testing.T) {
	tk := loadModel(t, "qwen3")
	for _, tools := range []string{
		`{"type":"function","function":{"name":"f"}}`,
		`["f"]`,
		`[{"type":"custom","function":{"name":"f"}}]`,
		`[{"type":null,"function":{"name":"f"}}]`,
		`[{"type":"function"}]`,
		`[{"type":"function","function":null}]`,
		`[{"type":"function","function":{"description":"d"}}]`,
		`[{"type":"function","function":{"name":7}}]`,
		`[{"type":"function","function":{"name":"f","description":7}}]`,
		`[{"type":"function","function":{"name":"f","parameters":[]}}]`,
		`[{"type":"function","function":{"name":"f","parameters":"{}"}}]`,
	} {
		if got, err := tk.RenderChat(toolsChat(tools)); err == nil {
			t.Errorf("tools %s rendered %q, want an error", tools, got)
		}
	}
}
