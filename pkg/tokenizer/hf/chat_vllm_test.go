package hf

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
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

// vLLM versions pass an assistant message's reasoning to templates
// differently: earlier ones its reasoning_content, later ones its
// reasoning, as both reasoning and reasoning_content, dropping a
// reasoning_content. A template that reads reasoning (Qwen3's does) would
// render such a chat by one version's rules, so the engine renders it; a
// template that never mentions reasoning (Llama 3's) renders it here.
func TestAssistantReasoningGoesToTheEngineWhenTheTemplateReadsIt(t *testing.T) {
	chat := func(field string) Chat {
		return Chat{AddGenerationPrompt: true, Messages: json.RawMessage(`[{"role":"user","content":"Hi"},` +
			`{"role":"assistant","content":"Hello."` + field + `},{"role":"user","content":"Bye"}]`)}
	}
	qwen, llama := loadModel(t, "qwen3"), loadModel(t, "llama3")
	for _, field := range []string{`,"reasoning":"greet"`, `,"reasoning_content":"greet"`} {
		if got, err := qwen.RenderChat(chat(field)); err == nil {
			t.Errorf("qwen3 with %s rendered %q, want an error", field, got)
		}
		want, err := llama.RenderChat(chat(""))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := llama.RenderChat(chat(field)); err != nil || got != want {
			t.Errorf("llama3 with %s: rendered %q (%v), want %q", field, got, err, want)
		}
	}
	for _, field := range []string{`,"reasoning":null`, `,"reasoning_content":null`} {
		if _, err := qwen.RenderChat(chat(field)); err != nil {
			t.Errorf("qwen3 with %s: %v, want it rendered as without", field, err)
		}
	}
}

// Told how the engine passes reasoning, the template sees it as vLLM's
// versions show it: recent ones a message's reasoning under both names
// (its reasoning_content dropped), earlier ones its reasoning_content
// alone. Qwen3's template writes the reasoning of an assistant message
// after the last user message in a think block.
func TestAssistantReasoningIsPassedAsTheEngineDoes(t *testing.T) {
	chat := func(fields string, p ReasoningPassing) Chat {
		return Chat{Reasoning: p, Messages: json.RawMessage(`[{"role":"user","content":"Hi"},` +
			`{"role":"assistant","content":"Hello."` + fields + `}]`)}
	}
	qwen := loadModel(t, "qwen3")
	render := func(c Chat) string {
		t.Helper()
		got, err := qwen.RenderChat(c)
		if err != nil {
			t.Fatalf("%s: %v", c.Messages, err)
		}
		return got
	}
	const think = "<think>\ngreet\n</think>\n\nHello."
	without := render(chat("", VLLMReasoning))
	if strings.Contains(without, "greet") {
		t.Fatalf("rendered %q without reasoning", without)
	}
	for _, c := range []struct {
		fields  string
		passing ReasoningPassing
		thinks  bool
	}{
		{`,"reasoning":"greet"`, VLLMReasoning, true},
		{`,"reasoning_content":"greet"`, VLLMReasoning, false},
		{`,"reasoning":"greet","reasoning_content":"other"`, VLLMReasoning, true},
		{`,"reasoning_content":"greet"`, VLLMReasoningContent, true},
		{`,"reasoning":"greet"`, VLLMReasoningContent, false},
		{`,"reasoning":"greet"`, ReasoningPassing{Known: true}, false},
		{`,"reasoning":"greet"`, ReasoningPassing{Known: true, Reasoning: KeyReasoningContent}, true},
		{`,"reasoning":"greet"`, ReasoningPassing{Known: true, Reasoning: KeyReasoning}, false},
	} {
		got := render(chat(c.fields, c.passing))
		if c.thinks != strings.Contains(got, think) || !c.thinks && got != without {
			t.Errorf("%s passed as %v: rendered %q, want the reasoning in a think block: %v", c.fields, c.passing, got, c.thinks)
		}
	}
	overlap := ReasoningPassing{Known: true, Reasoning: KeyReasoningContent, ReasoningContent: KeyReasoningContent}
	if got, err := qwen.RenderChat(chat(`,"reasoning":"a","reasoning_content":"b"`, overlap)); !errors.Is(err, ErrEngineRenders) {
		t.Errorf("both members under one name: rendered %q (%v), want ErrEngineRenders", got, err)
	}
	if got, err := qwen.RenderChat(chat(`,"reasoning":7`, VLLMReasoning)); err == nil {
		t.Errorf("a reasoning that is not a string rendered %q, want an error", got)
	}
}

func TestMentionsReasoningTellsTemplatesThatMayReadReasoning(t *testing.T) {
	for template, want := range map[string]bool{
		"":                                    false,
		"{{ messages[0].content }}":           false,
		"{{ messages[0].reasoning_content }}": true,
		"{% if m.reasoning %}{{ m.reasoning }}{% endif %}": true,
	} {
		if got := templateWith(t, template).MentionsReasoning(); got != want {
			t.Errorf("template %q: MentionsReasoning %v, want %v", template, got, want)
		}
	}
	if !loadModel(t, "qwen3").MentionsReasoning() {
		t.Error("Qwen3's template: MentionsReasoning false")
	}
}

// templateWith returns the Qwen3 tokenizer with another chat template.
func templateWith(t *testing.T, template string) *Tokenizer {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(modelsDir(t), "qwen3", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	tk, err := Parse(raw, nil, template)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// Python's str.strip(), which Jinja's trim filter and a template's
// .strip() call, also strips U+001C to U+001F, and its lstrip() and
// rstrip() every Unicode white space; the template engine here strips
// less. A chat holding such a character where the template strips it
// would render unlike vLLM, so the engine renders it.
func TestWhiteSpacePythonStripsUnlikeTheTemplatesGoesToTheEngine(t *testing.T) {
	llama := loadModel(t, "llama3") // content | trim
	sides := templateWith(t, "{% for m in messages %}[{{ m.content.lstrip() }}|{{ m.content.rstrip() }}]{% endfor %}")
	user := func(content string) Chat {
		b, _ := json.Marshal(content)
		return Chat{Messages: json.RawMessage(`[{"role":"user","content":` + string(b) + `}]`)}
	}
	for _, tt := range []struct {
		name    string
		tk      *Tokenizer
		content string
		refused bool
	}{
		{"trim, U+001C", llama, "\x1cHi", true},
		{"trim, U+001F", llama, "Hi\x1f", true},
		{"trim, U+3000", llama, "\u3000Hi\u3000", false},
		{"trim, vertical tab", llama, "\vHi\f", false},
		{"lstrip, U+3000", sides, "\u3000Hi", true},
		{"rstrip, no-break space", sides, "Hi\u00a0", true},
		{"lstrip, vertical tab", sides, "\vHi", true},
		{"lstrip, ASCII white space", sides, " \t\r\nHi \t\r\n", false},
	} {
		got, err := tt.tk.RenderChat(user(tt.content))
		if (err != nil) != tt.refused {
			t.Errorf("%s: rendered %q (%v), want refused %v", tt.name, got, err, tt.refused)
		}
	}
}
