package tokenizer

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// anthropicCase is an Anthropic Messages body and the OpenAI chat request
// vLLM converts it into, written by hand from vLLM's conversion
// (AnthropicServingMessages in vllm/entrypoints/anthropic/serving.py).
type anthropicCase struct {
	name        string
	countTokens bool
	body        string
	// The expected ChatRequest: messages, tools and chat_template_kwargs
	// as JSON (compared once compacted), reasoning effort and max_tokens
	// (0 for none).
	messages, tools, kwargs string
	effort                  string
	maxTokens               int
}

func (c anthropicCase) chat() wantChat {
	return wantChat{c.messages, c.tools, c.kwargs, c.effort, c.maxTokens}
}

var anthropicCases = []anthropicCase{
	{
		// _convert_system_message: a string system prompt leads; a
		// string content is kept as it is.
		name:      "system_string",
		body:      `{"model":"m","max_tokens":64,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}`,
		messages:  `[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]`,
		maxTokens: 64,
	},
	{
		// _convert_system_message: text blocks joined with nothing
		// between them, empty ones and the billing header left out,
		// cache_control ignored.
		name: "system_blocks",
		body: `{"model":"m","max_tokens":8,"system":[` +
			`{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1; cch=abc;"},` +
			`{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}},` +
			`{"type":"text","text":""},{"type":"text","text":null},{"type":"text","text":"\nBe careful."}],` +
			`"messages":[{"role":"user","content":"hi"}]}`,
		messages:  `[{"role":"system","content":"You are Claude Code.\nBe careful."},{"role":"user","content":"hi"}]`,
		maxTokens: 8,
	},
	{
		// _convert_system_message: an empty system prompt, or one of
		// nothing but the billing header, adds no message.
		name: "system_empty",
		body: `{"model":"m","max_tokens":8,"system":[{"type":"text","text":"x-anthropic-billing-header: a"}],` +
			`"messages":[{"role":"user","content":""}]}`,
		messages:  `[{"role":"user","content":""}]`,
		maxTokens: 8,
	},
	{
		// _convert_message_content: one text block is the content as a
		// string, several a list of text parts; empty ones are dropped.
		name: "text_blocks",
		body: `{"model":"m","max_tokens":8,"messages":[` +
			`{"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":""}]},` +
			`{"role":"assistant","content":[{"type":"text","text":"two"},{"type":"text","text":"three"}]},` +
			`{"role":"user","content":[{"type":"text","text":"caf\u00e9 日本"}]}]}`,
		messages: `[{"role":"user","content":"one"},` +
			`{"role":"assistant","content":[{"type":"text","text":"two"},{"type":"text","text":"three"}]},` +
			`{"role":"user","content":"café 日本"}]`,
		maxTokens: 8,
	},
	{
		// _convert_tool_use_block: tool_use becomes a tool call whose
		// arguments are json.dumps(input), placed before the content.
		name: "tool_use",
		body: `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"Weather?"},` +
			`{"role":"assistant","content":[{"type":"text","text":"Let me check."},` +
			`{"type":"tool_use","id":"toolu_01","name":"get_weather",` +
			`"input":{"city":"Zürich","days":3,"unit":null,"opts":{"ok":true,"r":0.5,"big":1e16,"list":[1,-0,2.50,"\ud83d\ude00"]}}},` +
			`{"type":"tool_use","id":"toolu_02","name":"noop"}]}]}`,
		messages: `[{"role":"user","content":"Weather?"},{"role":"assistant","tool_calls":[` +
			`{"id":"toolu_01","type":"function","function":{"name":"get_weather","arguments":` +
			`"{\"city\": \"Z\\u00fcrich\", \"days\": 3, \"unit\": null, \"opts\": {\"ok\": true, \"r\": 0.5, \"big\": 1e+16, \"list\": [1, 0, 2.5, \"\\ud83d\\ude00\"]}}"}},` +
			`{"id":"toolu_02","type":"function","function":{"name":"noop","arguments":"{}"}}],` +
			`"content":"Let me check."}]`,
		maxTokens: 8,
	},
	{
		// _convert_messages: an assistant message of nothing but tool
		// calls has no content; one of nothing at all is still a turn.
		name: "assistant_without_content",
		body: `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"go"},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"run","input":{}}]},` +
			`{"role":"user","content":"again"},{"role":"assistant","content":[]}]}`,
		messages: `[{"role":"user","content":"go"},` +
			`{"role":"assistant","tool_calls":[{"id":"t1","type":"function","function":{"name":"run","arguments":"{}"}}]},` +
			`{"role":"user","content":"again"},{"role":"assistant"}]`,
		maxTokens: 8,
	},
	{
		// _convert_user_tool_result: each tool_result becomes a tool
		// message ahead of the user's own text, its text items joined
		// with "\n"; a user message of nothing but results is dropped.
		name: "tool_results",
		body: `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"go"},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"a","input":{"x":1}},{"type":"tool_use","id":"t2","name":"b","input":{}}]},` +
			`{"role":"user","content":[{"type":"text","text":"Here:"},` +
			`{"type":"tool_result","tool_use_id":"t1","content":"18C","is_error":false},` +
			`{"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"a"},{"type":"text","text":"b"},{"type":"text"}]}]},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t3","name":"c","input":{}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t3"}]}]}`,
		messages: `[{"role":"user","content":"go"},` +
			`{"role":"assistant","tool_calls":[{"id":"t1","type":"function","function":{"name":"a","arguments":"{\"x\": 1}"}},` +
			`{"id":"t2","type":"function","function":{"name":"b","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"t1","content":"18C"},` +
			`{"role":"tool","tool_call_id":"t2","content":"a\nb\n"},` +
			`{"role":"user","content":"Here:"},` +
			`{"role":"assistant","tool_calls":[{"id":"t3","type":"function","function":{"name":"c","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"t3","content":""}]`,
		maxTokens: 8,
	},
	{
		// _convert_block: thinking blocks become the reasoning, joined
		// with nothing between them, an empty one included;
		// redacted_thinking and tool_reference blocks are left out.
		name: "thinking",
		body: `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"q"},` +
			`{"role":"assistant","content":[{"type":"thinking","thinking":"Hmm. ","signature":"s"},` +
			`{"type":"redacted_thinking","data":"xyz"},{"type":"thinking","thinking":"Yes."},{"type":"text","text":"A."}]},` +
			`{"role":"assistant","content":[{"type":"thinking","thinking":""},{"type":"tool_reference","tool_name":"x"}]},` +
			`{"role":"user","content":[{"type":"thinking","thinking":"dropped with its message"}]}]}`,
		messages: `[{"role":"user","content":"q"},{"role":"assistant","reasoning":"Hmm. Yes.","content":"A."},` +
			`{"role":"assistant","reasoning":""}]`,
		maxTokens: 8,
	},
	{
		// _convert_tool_result_block: an assistant's tool_result is a
		// text part "Tool result: " and str() of its content.
		name: "assistant_tool_result",
		body: `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"q"},` +
			`{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"t","content":"42"},` +
			`{"type":"tool_result","tool_use_id":"u","content":[]}]}]}`,
		messages: `[{"role":"user","content":"q"},` +
			`{"role":"assistant","content":[{"type":"text","text":"Tool result: 42"},{"type":"text","text":"Tool result: "}]}]`,
		maxTokens: 8,
	},
	{
		// protocol.py's AnthropicMessage.normalize_role: Claude Code's
		// ctx and msg roles are user messages.
		name:      "ctx_and_msg_roles",
		body:      `{"model":"m","max_tokens":8,"messages":[{"role":"ctx","content":"c"},{"role":"msg","content":"m"}]}`,
		messages:  `[{"role":"user","content":"c"},{"role":"user","content":"m"}]`,
		maxTokens: 8,
	},
	{
		// _convert_tools with AnthropicTool.validate_input_schema:
		// name, description (null when absent), parameters given a type
		// when they name none, defer_loading (null when absent).
		name: "tools",
		body: `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"any"},"tools":[` +
			`{"name":"get_weather","description":"Weather for a city.","input_schema":{"type":"object","properties":{"city":{"type":"string","description":"Zürich?"}},"required":["city"]}},` +
			`{"name":"noop","input_schema":{},"cache_control":{"type":"ephemeral"}},` +
			`{"name":"later","input_schema":{"properties":{"n":{"type":"integer","minimum":1.0}}},"defer_loading":true,"strict":true}]}`,
		messages: `[{"role":"user","content":"hi"}]`,
		tools: `[{"type":"function","function":{"name":"get_weather","description":"Weather for a city.",` +
			`"parameters":{"type": "object", "properties": {"city": {"type": "string", "description": "Z\u00fcrich?"}}, "required": ["city"]},"defer_loading":null}},` +
			`{"type":"function","function":{"name":"noop","description":null,"parameters":{"type": "object"},"defer_loading":null}},` +
			`{"type":"function","function":{"name":"later","description":null,` +
			`"parameters":{"properties": {"n": {"type": "integer", "minimum": 1.0}}, "type": "object"},"defer_loading":true}}]`,
		maxTokens: 8,
	},
	{
		// _convert_tools: an empty list of tools is still a list.
		name:      "no_tools",
		body:      `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}],"tools":[]}`,
		messages:  `[{"role":"user","content":"hi"}]`,
		tools:     `[]`,
		maxTokens: 8,
	},
	{
		// _build_base_request and _handle_output_config: max_tokens
		// (which pydantic also reads from 1e3 or "100"),
		// chat_template_kwargs and output_config.effort; sampling and
		// streaming fields change nothing.
		name: "effort_and_kwargs",
		body: `{"model":"m","max_tokens":"100","messages":[{"role":"user","content":"hi"}],` +
			`"output_config":{"effort":"xhigh","format":{"type":"json_schema","schema":{"type":"object"}}},` +
			`"chat_template_kwargs":{"enable_thinking":false,"note":"ü"},"stream":true,"temperature":0.2,` +
			`"thinking":{"type":"enabled","budget_tokens":1024},"metadata":{"user_id":"u"},"stop_sequences":["x"]}`,
		messages:  `[{"role":"user","content":"hi"}]`,
		kwargs:    `{"enable_thinking": false, "note": "\u00fc"}`,
		effort:    "xhigh",
		maxTokens: 100,
	},
	{
		// _build_base_request and _handle_output_config for a token
		// count: neither max_tokens nor output_config is read.
		name:        "count_tokens",
		countTokens: true,
		body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":-1,` +
			`"output_config":{"effort":"bogus"},"chat_template_kwargs":{"enable_thinking":true}}`,
		messages: `[{"role":"user","content":"hi"}]`,
		kwargs:   `{"enable_thinking": true}`,
	},
	{
		// A member named twice takes its last value, as Python's
		// json.loads reads it.
		name:      "last_member_wins",
		body:      `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"a","content":"b"}],"max_tokens":9}`,
		messages:  `[{"role":"user","content":"b"}]`,
		maxTokens: 9,
	},
}

func convertAnthropic(c anthropicCase) (*ChatRequest, error) {
	if c.countTokens {
		return ChatFromAnthropicCountTokens([]byte(c.body))
	}
	return ChatFromAnthropic([]byte(c.body))
}

func compactJSON(t testing.TB, s string) string {
	t.Helper()
	if s == "" {
		return ""
	}
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("compact %s: %v", s, err)
	}
	return b.String()
}

func TestChatFromAnthropicConvertsAsVLLM(t *testing.T) {
	for _, tt := range anthropicCases {
		t.Run(tt.name, func(t *testing.T) {
			got, err := convertAnthropic(tt)
			if err != nil {
				t.Fatal(err)
			}
			checkConverted(t, got, tt.chat())
		})
	}
}

func TestChatFromAnthropicRefusesWhatItCannotReproduce(t *testing.T) {
	user := func(content string) string {
		return `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":` + content + `}]}`
	}
	assistant := func(content string) string {
		return `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":` + content + `}]}`
	}
	toolUse := func(input string) string {
		return assistant(`[{"type":"tool_use","id":"t","name":"f","input":` + input + `}]`)
	}
	tool := func(schema string) string {
		return `{"model":"m","max_tokens":8,"messages":[],"tools":[{"name":"f","input_schema":` + schema + `}]}`
	}
	checkRefusals(t, ChatFromAnthropic, []refusal{
		// Accepted by vLLM, rendered unlike anything reproducible here.
		{"image", user(`[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]`), ReasonUnsupported},
		{"image_without_source", user(`[{"type":"image"}]`), ReasonUnsupported},
		{"image_in_system", `{"model":"m","max_tokens":8,"system":[{"type":"image"}],"messages":[]}`, ReasonUnsupported},
		{"image_in_tool_result", user(`[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"url","url":"http://x"}}]}]`), ReasonUnsupported},
		{"tool_reference_in_tool_result", user(`[{"type":"tool_result","tool_use_id":"t","content":[{"type":"tool_reference","tool_name":"x"}]}]`), ReasonUnsupported},
		{"unknown_item_in_tool_result", user(`[{"type":"tool_result","tool_use_id":"t","content":[{"type":"document"}]}]`), ReasonUnsupported},
		{"tool_use_without_id", assistant(`[{"type":"tool_use","name":"f","input":{}}]`), ReasonUnsupported},
		{"tool_use_with_empty_id", assistant(`[{"type":"tool_use","id":"","name":"f"}]`), ReasonUnsupported},
		{"system_message_inside_messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"q"},{"role":"system","content":"s"}]}`, ReasonUnsupported},
		{"assistant_tool_result_list", assistant(`[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}]}]`), ReasonUnsupported},
		{"lone_surrogate_in_text", user(`"a\ud800b"`), ReasonUnsupported},
		{"lone_low_surrogate_in_text", user(`"a\udc00"`), ReasonUnsupported},
		{"lone_surrogate_in_input", toolUse(`{"k":"\udbff"}`), ReasonUnsupported},
		{"member_named_twice_in_input", toolUse(`{"k":1,"k":2}`), ReasonUnsupported},
		{"escaped_member_named_twice_in_input", toolUse(`{"k":1,"\u006b":2}`), ReasonUnsupported},
		{"float_overflow_in_input", toolUse(`{"k":1e400}`), ReasonUnsupported},
		{"integer_beyond_python_digits", toolUse(`{"k":` + strings.Repeat("9", 4301) + `}`), ReasonUnsupported},
		{"input_nested_too_deep", toolUse(strings.Repeat(`{"k":`, 101) + "1" + strings.Repeat("}", 101)), ReasonUnsupported},
		{"member_named_twice_in_schema", tool(`{"type":"object","type":"object"}`), ReasonUnsupported},
		{"member_named_twice_in_kwargs", `{"model":"m","max_tokens":8,"messages":[],"chat_template_kwargs":{"a":1,"a":2}}`, ReasonUnsupported},

		// Refused by vLLM itself.
		{"not_json", `{"model":`, ReasonInput},
		{"not_an_object", `[]`, ReasonInput},
		{"invalid_utf8", "{\"model\":\"m\xff\",\"max_tokens\":8,\"messages\":[]}", ReasonInput},
		{"no_model", `{"max_tokens":8,"messages":[]}`, ReasonInput},
		{"empty_model", `{"model":"","max_tokens":8,"messages":[]}`, ReasonInput},
		{"model_not_a_string", `{"model":7,"max_tokens":8,"messages":[]}`, ReasonInput},
		{"no_max_tokens", `{"model":"m","messages":[]}`, ReasonInput},
		{"null_max_tokens", `{"model":"m","max_tokens":null,"messages":[]}`, ReasonInput},
		{"zero_max_tokens", `{"model":"m","max_tokens":0,"messages":[]}`, ReasonInput},
		{"fractional_max_tokens", `{"model":"m","max_tokens":1.5,"messages":[]}`, ReasonInput},
		{"no_messages", `{"model":"m","max_tokens":8}`, ReasonInput},
		{"messages_not_a_list", `{"model":"m","max_tokens":8,"messages":{}}`, ReasonInput},
		{"message_not_an_object", `{"model":"m","max_tokens":8,"messages":["hi"]}`, ReasonInput},
		{"unknown_role", `{"model":"m","max_tokens":8,"messages":[{"role":"bot","content":"x"}]}`, ReasonInput},
		{"no_role", `{"model":"m","max_tokens":8,"messages":[{"content":"x"}]}`, ReasonInput},
		{"no_content", `{"model":"m","max_tokens":8,"messages":[{"role":"user"}]}`, ReasonInput},
		{"null_content", user(`null`), ReasonInput},
		{"content_a_number", user(`7`), ReasonInput},
		{"unknown_block_type", user(`[{"type":"document","source":{}}]`), ReasonInput},
		{"block_without_type", user(`[{"text":"x"}]`), ReasonInput},
		{"text_not_a_string", user(`[{"type":"text","text":5}]`), ReasonInput},
		{"input_a_list", toolUse(`[1]`), ReasonInput},
		{"tool_result_text_null", user(`[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":null}]}]`), ReasonInput},
		{"tool_result_content_a_number", user(`[{"type":"tool_result","tool_use_id":"t","content":1}]`), ReasonInput},
		{"unknown_effort", `{"model":"m","max_tokens":8,"messages":[],"output_config":{"effort":"extreme"}}`, ReasonInput},
		{"system_a_number", `{"model":"m","max_tokens":8,"system":1,"messages":[]}`, ReasonInput},
		{"tool_without_schema", `{"model":"m","max_tokens":8,"messages":[],"tools":[{"name":"f"}]}`, ReasonInput},
		{"tool_without_name", `{"model":"m","max_tokens":8,"messages":[],"tools":[{"input_schema":{}}]}`, ReasonInput},
		{"schema_a_list", tool(`[]`), ReasonInput},
		{"tools_not_a_list", `{"model":"m","max_tokens":8,"messages":[],"tools":{}}`, ReasonInput},
		{"kwargs_a_list", `{"model":"m","max_tokens":8,"messages":[],"chat_template_kwargs":[]}`, ReasonInput},
	})
}

var anthropicModels struct {
	once sync.Once
	tks  map[string]*hf.Tokenizer
	err  error
}

// anthropicTokenizers loads the real models' tokenizer files that hold a
// chat template, once.
func anthropicTokenizers(t testing.TB) map[string]*hf.Tokenizer {
	t.Helper()
	dir := testsupport.TokenizerModels(t)
	anthropicModels.once.Do(func() {
		anthropicModels.tks = map[string]*hf.Tokenizer{}
		for _, m := range []string{"qwen3", "llama3"} {
			tk, err := hf.Load(filepath.Join(dir, m))
			if err != nil {
				anthropicModels.err = err
				return
			}
			anthropicModels.tks[m] = tk
		}
	})
	if anthropicModels.err != nil {
		t.Fatal(anthropicModels.err)
	}
	return anthropicModels.tks
}

// chatIDs renders and tokenizes req in process as TokenizeChat does.
func chatIDs(tk *hf.Tokenizer, req *ChatRequest) ([]uint32, error) {
	chat, err := req.localChat(hf.ReasoningPassing{})
	if err != nil {
		return nil, err
	}
	return tk.EncodeChat(chat, boolOr(req.AddSpecialTokens, false))
}

// The OpenAI chat body equivalent to a Claude Code turn, written as an
// OpenAI client would write it, with the tools as vLLM builds them.
const claudeCodeTurn = `{
  "model": "m",
  "max_tokens": 32000,
  "max_completion_tokens": 32000,
  "messages": [
    {"role": "system", "content": "You are Claude Code, an agent.\nUse the tools."},
    {"role": "user", "content": "List the Go files, then count them."},
    {"role": "assistant", "content": "I'll list them.", "tool_calls": [
      {"id": "toolu_01", "type": "function",
       "function": {"name": "Bash", "arguments": "{\"command\": \"ls *.go\", \"timeout\": 120000, \"description\": \"Liste les fichiers \\u00e0 compter\"}"}}
    ]},
    {"role": "tool", "tool_call_id": "toolu_01", "content": "a.go\nb.go"},
    {"role": "user", "content": "Now count them."}
  ],
  "tools": [
    {"type": "function", "function": {
      "name": "Bash", "description": "Runs a shell command.",
      "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}, "description": {"type": "string"}}, "required": ["command"]},
      "defer_loading": null}}
  ]
}`

const claudeCodeTurnAnthropic = `{
  "model": "m", "max_tokens": 32000, "stream": true,
  "system": [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=9f2e;"},
    {"type": "text", "text": "You are Claude Code, an agent.\n", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "Use the tools."}
  ],
  "messages": [
    {"role": "user", "content": [{"type": "text", "text": "List the Go files, then count them."}]},
    {"role": "assistant", "content": [
      {"type": "text", "text": "I'll list them."},
      {"type": "tool_use", "id": "toolu_01", "name": "Bash",
       "input": {"command": "ls *.go", "timeout": 120000, "description": "Liste les fichiers à compter"}}
    ]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "a.go"}, {"type": "text", "text": "b.go"}]},
      {"type": "text", "text": "Now count them.", "cache_control": {"type": "ephemeral"}}
    ]}
  ],
  "tools": [
    {"name": "Bash", "description": "Runs a shell command.",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}, "description": {"type": "string"}}, "required": ["command"]}}
  ]
}`

// TestChatFromAnthropicTokenizesAsTheEquivalentOpenAIChat renders the
// converted requests with real models' chat templates and tokenizers,
// through the package's in-process chat path, and checks that each gives
// the ids of the equivalent OpenAI chat body, or that both are refused
// alike (a template that reads an assistant's reasoning, for one).
func TestChatFromAnthropicTokenizesAsTheEquivalentOpenAIChat(t *testing.T) {
	tks := anthropicTokenizers(t)
	ccTurn, err := ChatFromAnthropic([]byte(claudeCodeTurnAnthropic))
	if err != nil {
		t.Fatal(err)
	}
	pairs := []chatPair{{name: "claude_code_turn", converted: ccTurn, openAI: chatRequest(t, claudeCodeTurn), mustTokenize: true}}
	for _, c := range anthropicCases {
		got, err := convertAnthropic(c)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		pairs = append(pairs, chatPair{name: c.name, converted: got, openAI: c.chat().request()})
	}
	tokenizesAsTheEquivalentChat(t, tks, pairs)
}
