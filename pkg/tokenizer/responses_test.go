package tokenizer

import (
	"fmt"
	"strings"
	"testing"
)

// responsesCase is a Responses body and the OpenAI chat request vLLM
// converts it into, written by hand from vLLM's conversion
// (construct_input_messages and construct_tool_dicts in
// vllm/entrypoints/openai/responses/utils.py).
type responsesCase struct {
	name string
	body string
	// The expected ChatRequest: messages, tools and chat_template_kwargs
	// as JSON (compared once compacted), max_tokens (0 for none), whether
	// the prompt is truncated and whether the last message is continued.
	messages, tools, kwargs string
	effort                  string
	maxTokens               int
	truncated, continued    bool
}

func (c responsesCase) chat() wantChat {
	return wantChat{c.messages, c.tools, c.kwargs, c.effort, c.maxTokens}
}

var responsesCases = []responsesCase{
	{
		// A string input is one user message.
		name:     "string_input",
		body:     `{"model":"m","input":"hi"}`,
		messages: `[{"role":"user","content":"hi"}]`,
	},
	{
		// instructions lead as a system message; empty ones add none.
		name:     "instructions",
		body:     `{"model":"m","instructions":"Be brief.","input":"caf\u00e9 日本"}`,
		messages: `[{"role":"system","content":"Be brief."},{"role":"user","content":"café 日本"}]`,
	},
	{
		name:     "empty_instructions",
		body:     `{"model":"m","instructions":"","input":[]}`,
		messages: `[]`,
	},
	{
		// Input messages keep their role and content; input_text parts
		// become text parts; members vLLM's models do not know are
		// dropped.
		name: "input_messages",
		body: `{"model":"m","input":[` +
			`{"role":"developer","content":[{"type":"input_text","text":"b"},{"type":"input_text","text":"c"}]},` +
			`{"type":"message","role":"system","content":"s","id":"x"},` +
			`{"role":"user","name":"bob","content":"a","status":"incomplete"}]}`,
		messages: `[{"role":"developer","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]},` +
			`{"role":"system","content":"s"},{"role":"user","content":"a"}]`,
	},
	{
		// An output message's text is its first part's; an easy input
		// message's is its string, or its first part's. Each follows an
		// assistant message with content, so each starts a message.
		name: "assistant_messages",
		body: `{"model":"m","input":[{"role":"user","content":"q"},` +
			`{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[` +
			`{"type":"output_text","text":"one","annotations":[],"logprobs":[]},{"type":"output_text","text":"two","annotations":[]}]},` +
			`{"role":"assistant","content":"plain"},` +
			`{"role":"assistant","content":[{"type":"input_text","text":"x"},{"type":"input_text","text":"y"}]},` +
			`{"type":"message","id":"msg_2","role":"assistant","status":"completed","content":[]}]}`,
		messages: `[{"role":"user","content":"q"},{"role":"assistant","content":"one"},` +
			`{"role":"assistant","content":"plain"},{"role":"assistant","content":"x"},{"role":"assistant","content":""}]`,
	},
	{
		// An agent turn: reasoning, calls (one namespaced) merged into
		// one assistant message, their outputs as tool messages, then
		// the answer.
		name: "agent_turn",
		body: `{"model":"m","input":[{"role":"user","content":"q"},` +
			`{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"sum"}],"content":[{"type":"reasoning_text","text":"think"}]},` +
			`{"type":"function_call","id":"fc_1","call_id":"c1","name":"get","arguments":"{\"a\": 1}","status":"completed"},` +
			`{"type":"function_call","call_id":"c2","name":"find","namespace":"crm","arguments":""},` +
			`{"type":"function_call_output","call_id":"c1","output":"r1"},` +
			`{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"r2"}]},` +
			`{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"done","annotations":[]}]}]}`,
		messages: `[{"role":"user","content":"q"},` +
			`{"role":"assistant","reasoning":"think","tool_calls":[` +
			`{"id":"c1","type":"function","function":{"name":"get","arguments":"{\"a\": 1}"}},` +
			`{"id":"c2","type":"function","function":{"name":"crm__find","arguments":""}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"r1"},` +
			`{"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"r2"}]},` +
			`{"role":"assistant","content":"done"}]`,
	},
	{
		// Reasoning is the first content part's text, else the first
		// summary part's, else empty.
		name: "reasoning_text",
		body: `{"model":"m","input":[` +
			`{"type":"reasoning","id":"a","summary":[{"type":"summary_text","text":"s1"},{"type":"summary_text","text":"s2"}],"content":null},` +
			`{"type":"reasoning","id":"b","summary":[{"type":"summary_text","text":"s3"}],"content":[]},` +
			`{"type":"reasoning","id":"c","summary":[],"encrypted_content":""}]}`,
		messages: `[{"role":"assistant","reasoning":"s1"},{"role":"assistant","reasoning":"s3"},{"role":"assistant","reasoning":""}]`,
	},
	{
		// Items merge into the preceding assistant message only where it
		// lacks what they bring; calls always merge.
		name: "merging",
		body: `{"model":"m","input":[` +
			`{"type":"message","id":"m1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"a","annotations":[]}]},` +
			`{"type":"reasoning","id":"r1","summary":[{"type":"summary_text","text":"r1"}]},` +
			`{"type":"reasoning","id":"r2","summary":[{"type":"summary_text","text":"r2"}]},` +
			`{"role":"assistant","content":"b"},` +
			`{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},` +
			`{"role":"user","content":"u"},` +
			`{"type":"function_call","call_id":"d","name":"g","arguments":"{}"},` +
			`{"type":"reasoning","id":"r3","summary":[{"type":"summary_text","text":"r3"}]},` +
			`{"role":"assistant","content":"e"}]}`,
		messages: `[{"role":"assistant","reasoning":"r1","content":"a"},` +
			`{"role":"assistant","reasoning":"r2","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}],"content":"b"},` +
			`{"role":"user","content":"u"},` +
			`{"role":"assistant","reasoning":"r3","tool_calls":[{"id":"d","type":"function","function":{"name":"g","arguments":"{}"}}],"content":"e"}]`,
	},
	{
		// A last output message in progress is continued.
		name: "continue_output_message",
		body: `{"model":"m","input":[{"role":"user","content":"q"},` +
			`{"type":"message","id":"m","role":"assistant","status":"in_progress","content":[{"type":"output_text","text":"The answer is","annotations":[]}]}]}`,
		messages:  `[{"role":"user","content":"q"},{"role":"assistant","content":"The answer is"}]`,
		continued: true,
	},
	{
		// An output message without an id or a status is read as a
		// dict: a first refusal part has no text, and the status of the
		// last one still counts.
		name: "output_messages_without_id",
		body: `{"model":"m","input":[{"role":"user","content":"q"},` +
			`{"type":"message","role":"assistant","id":"m","content":[{"type":"refusal","refusal":"no"},{"type":"output_text","text":"x","annotations":[]}]},` +
			`{"role":"user","content":"again"},` +
			`{"type":"message","role":"assistant","status":"incomplete","content":[{"type":"output_text","text":"Well,","annotations":[]}]}]}`,
		messages: `[{"role":"user","content":"q"},{"role":"assistant","content":""},` +
			`{"role":"user","content":"again"},{"role":"assistant","content":"Well,"}]`,
		continued: true,
	},
	{
		// So is a last reasoning item left incomplete.
		name:      "continue_reasoning",
		body:      `{"model":"m","input":[{"role":"user","content":"q"},{"type":"reasoning","id":"r","status":"incomplete","summary":[{"type":"summary_text","text":"Let me"}]}]}`,
		messages:  `[{"role":"user","content":"q"},{"role":"assistant","reasoning":"Let me"}]`,
		continued: true,
	},
	{
		// And a last input message with a list of content in progress;
		// one with a string keeps no status.
		name:      "continue_input_message",
		body:      `{"model":"m","input":[{"type":"message","role":"user","status":"in_progress","content":[{"type":"input_text","text":"q"}]}]}`,
		messages:  `[{"role":"user","content":[{"type":"text","text":"q"}]}]`,
		continued: true,
	},
	{
		name:     "no_continue_for_earlier_items",
		body:     `{"model":"m","input":[{"type":"message","id":"m","role":"assistant","status":"incomplete","content":[]},{"role":"user","content":"q","status":"in_progress"}]}`,
		messages: `[{"role":"assistant","content":""},{"role":"user","content":"q"}]`,
	},
	{
		// Function tools, with absent members null and the parameters as
		// json.dumps writes them; a namespace's functions named after it;
		// built-in and custom tools left out; tool_choice "none" keeps
		// them.
		name: "tools",
		body: `{"model":"m","input":"q","tool_choice":"none","tools":[` +
			`{"type":"function","name":"f","description":"d","strict":"true","parameters":{"type":"object","properties":{"x":{"type":"number","default":1E2}}}},` +
			`{"type":"function","name":"g","description":null,"parameters":null},` +
			`{"type":"web_search"},{"type":"custom","name":"apply_patch"},` +
			`{"type":"namespace","name":"crm","description":"CRM","tools":[{"type":"function","name":"find","parameters":{"type":"object"},"defer_loading":true},{"type":"custom","name":"raw"}]}]}`,
		messages: `[{"role":"user","content":"q"}]`,
		tools: `[{"type":"function","function":{"name":"f","description":"d","parameters":{"type": "object", "properties": {"x": {"type": "number", "default": 100.0}}},"strict":true,"defer_loading":null}},` +
			`{"type":"function","function":{"name":"g","description":null,"parameters":null,"strict":null,"defer_loading":null}},` +
			`{"type":"function","function":{"name":"crm__find","description":null,"parameters":{"type": "object"},"strict":null,"defer_loading":true}}]`,
	},
	{
		// Tools none of which is a function render as an empty list; no
		// tools as none.
		name:     "builtin_tools_only",
		body:     `{"model":"m","input":"q","tools":[{"type":"web_search_preview"},{"type":"mcp","server_label":"x"}]}`,
		messages: `[{"role":"user","content":"q"}]`,
		tools:    `[]`,
	},
	{
		name:     "no_tools",
		body:     `{"model":"m","input":"q","tools":[]}`,
		messages: `[{"role":"user","content":"q"}]`,
	},
	{
		// reasoning.effort and chat_template_kwargs reach the template;
		// sampling fields do not.
		name:     "effort",
		body:     `{"model":"m","input":"q","reasoning":{"effort":"high","summary":"auto"},"temperature":0.2,"stream":true,"store":false,"chat_template_kwargs":{"x":1.5E1,"enable_thinking":false}}`,
		messages: `[{"role":"user","content":"q"}]`,
		kwargs:   `{"x": 15.0, "enable_thinking": false}`,
		effort:   "high",
	},
	{
		name:     "effort_null",
		body:     `{"model":"m","input":"q","reasoning":{"effort":null}}`,
		messages: `[{"role":"user","content":"q"}]`,
	},
	{
		// truncation "auto" or null truncates to the context length less
		// max_output_tokens.
		name:      "truncation_auto",
		body:      `{"model":"m","input":"q","truncation":"auto","max_output_tokens":100}`,
		messages:  `[{"role":"user","content":"q"}]`,
		maxTokens: 100,
		truncated: true,
	},
	{
		name:      "truncation_null",
		body:      `{"model":"m","input":"q","truncation":null}`,
		messages:  `[{"role":"user","content":"q"}]`,
		truncated: true,
	},
	{
		name:      "truncation_disabled",
		body:      `{"model":"m","input":"q","truncation":"disabled","max_output_tokens":"64"}`,
		messages:  `[{"role":"user","content":"q"}]`,
		maxTokens: 64,
	},
}

func TestChatFromResponsesConvertsAsVLLM(t *testing.T) {
	for _, tt := range responsesCases {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ChatFromResponses([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			checkConverted(t, got, tt.chat())
			if tt.tools != "" && compactJSON(t, string(got.Tools)) != compactJSON(t, tt.tools) {
				t.Errorf("tools %s, want %s", got.Tools, tt.tools)
			}
			if truncated := got.TruncatePromptTokens != nil && *got.TruncatePromptTokens == -1; truncated != tt.truncated ||
				!truncated && got.TruncatePromptTokens != nil {
				t.Errorf("truncate_prompt_tokens %v, want -1: %v", got.TruncatePromptTokens, tt.truncated)
			}
			if cont, gen := boolOr(got.ContinueFinalMessage, false), boolOr(got.AddGenerationPrompt, true); cont != tt.continued || gen == tt.continued {
				t.Errorf("continue_final_message %v, add_generation_prompt %v; want continued %v", cont, gen, tt.continued)
			}
		})
	}
}

func TestChatFromResponsesRefusesWhatItCannotReproduce(t *testing.T) {
	items := func(items ...string) string {
		return `{"model":"m","input":[` + strings.Join(items, ",") + `]}`
	}
	user := func(content string) string { return items(`{"role":"user","content":` + content + `}`) }
	tool := func(tool string) string { return `{"model":"m","input":"q","tools":[` + tool + `]}` }
	params := func(schema string) string {
		return tool(`{"type":"function","name":"f","parameters":` + schema + `}`)
	}
	reasoning := func(members string) string { return items(`{"type":"reasoning","id":"r",` + members + `}`) }
	output := func(content string) string {
		return items(`{"type":"message","id":"m","role":"assistant","status":"completed","content":[` + content + `]}`)
	}
	hugeNamespace := `{"type":"namespace","name":"` + strings.Repeat("n", 4096) + `","description":"d","tools":[` +
		strings.TrimSuffix(strings.Repeat(`{"type":"function","name":""},`, 64), ",") + `]}`
	checkRefusals(t, ChatFromResponses, []refusal{
		// Accepted by vLLM, rendered unlike anything reproducible here.
		{"previous_response_id", `{"model":"m","input":"q","previous_response_id":"resp_1"}`, ReasonUnsupported},
		{"previous_response", `{"model":"m","input":"q","previous_response":{"id":"resp_1"}}`, ReasonUnsupported},
		{"previous_input_messages", `{"model":"m","input":"q","previous_input_messages":[]}`, ReasonUnsupported},
		{"conversation", `{"model":"m","input":"q","conversation":"conv_1"}`, ReasonUnsupported},
		{"image", user(`[{"type":"input_image","image_url":"http://x/a.png"}]`), ReasonUnsupported},
		{"file", user(`[{"type":"input_text","text":"a"},{"type":"input_file","file_id":"f"}]`), ReasonUnsupported},
		{"audio", user(`[{"type":"input_audio","input_audio":{}}]`), ReasonUnsupported},
		{"image_in_assistant_message", items(`{"role":"assistant","content":[{"type":"input_image","image_url":"u"}]}`), ReasonUnsupported},
		{"image_in_tool_output", items(`{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"u"}]}`), ReasonUnsupported},
		{"item_reference", items(`{"type":"item_reference","id":"msg_1"}`), ReasonUnsupported},
		{"custom_tool_call", items(`{"type":"custom_tool_call","call_id":"c","name":"apply_patch","input":"x"}`), ReasonUnsupported},
		{"tool_search_output", items(`{"type":"tool_search_output","tools":[]}`), ReasonUnsupported},
		{"tool_search_tool", tool(`{"type":"tool_search","execution":"client"}`), ReasonUnsupported},
		{"reasoning_without_id", items(`{"type":"reasoning","summary":[],"encrypted_content":"gAAAA"}`), ReasonUnsupported},
		{"annotations", output(`{"type":"output_text","text":"t","annotations":[{"type":"url_citation"}]}`), ReasonUnsupported},
		{"unknown_function_tool_member", tool(`{"type":"function","name":"f","x":1}`), ReasonUnsupported},
		{"member_named_twice_in_parameters", params(`{"type":"object","type":"object"}`), ReasonUnsupported},
		{"lone_surrogate_in_parameters", params(`{"k":"\udbff"}`), ReasonUnsupported},
		{"lone_surrogate_in_text", user(`"a\ud800b"`), ReasonUnsupported},
		{"parameters_nested_too_deep", params(strings.Repeat(`{"k":`, 101) + "1" + strings.Repeat("}", 101)), ReasonUnsupported},
		{"member_named_twice_in_kwargs", `{"model":"m","input":"q","chat_template_kwargs":{"a":1,"a":2}}`, ReasonUnsupported},
		{"namespace_beyond_the_bound", tool(hugeNamespace), ReasonUnsupported},

		// Refused by vLLM itself.
		{"not_json", `{"model":`, ReasonInput},
		{"not_an_object", `[]`, ReasonInput},
		{"invalid_utf8", "{\"model\":\"m\xff\",\"input\":\"q\"}", ReasonInput},
		{"no_model", `{"input":"q"}`, ReasonInput},
		{"empty_model", `{"model":"","input":"q"}`, ReasonInput},
		{"model_not_a_string", `{"model":7,"input":"q"}`, ReasonInput},
		{"prompt_template", `{"model":"m","input":"q","prompt":{"id":"p"}}`, ReasonInput},
		{"no_input", `{"model":"m"}`, ReasonInput},
		{"null_input", `{"model":"m","input":null}`, ReasonInput},
		{"input_a_number", `{"model":"m","input":1}`, ReasonInput},
		{"instructions_a_number", `{"model":"m","instructions":1,"input":"q"}`, ReasonInput},
		{"item_not_an_object", items(`"hi"`), ReasonInput},
		{"item_without_role", items(`{"content":"x"}`), ReasonInput},
		{"type_not_a_string", items(`{"type":1,"role":"user","content":"x"}`), ReasonInput},
		{"unknown_role", items(`{"role":"bot","content":"x"}`), ReasonInput},
		{"message_without_content", items(`{"role":"user"}`), ReasonInput},
		{"null_content", user(`null`), ReasonInput},
		{"content_a_number", user(`7`), ReasonInput},
		{"unknown_part_type", user(`[{"type":"document"}]`), ReasonInput},
		{"output_text_in_user_message", user(`[{"type":"output_text","text":"x","annotations":[]}]`), ReasonInput},
		{"input_text_without_text", user(`[{"type":"input_text"}]`), ReasonInput},
		{"output_message_with_a_null_id", items(`{"type":"message","id":null,"role":"assistant","content":[{"type":"output_text","text":"x","annotations":[]}]}`), ReasonInput},
		{"output_message_of_unknown_status", items(`{"type":"message","role":"assistant","status":"done","content":[{"type":"output_text","text":"x","annotations":[]}]}`), ReasonInput},
		{"output_text_without_annotations", output(`{"type":"output_text","text":"x"}`), ReasonInput},
		{"refusal_first", output(`{"type":"refusal","refusal":"no"},{"type":"output_text","text":"x","annotations":[]}`), ReasonInput},
		{"function_call_without_call_id", items(`{"type":"function_call","name":"f","arguments":"{}"}`), ReasonInput},
		{"function_call_arguments_an_object", items(`{"type":"function_call","call_id":"c","name":"f","arguments":{}}`), ReasonInput},
		{"function_call_unknown_status", items(`{"type":"function_call","call_id":"c","name":"f","arguments":"","status":"done"}`), ReasonInput},
		{"function_call_namespace_a_number", items(`{"type":"function_call","call_id":"c","name":"f","arguments":"","namespace":1}`), ReasonInput},
		{"function_call_output_without_output", items(`{"type":"function_call_output","call_id":"c"}`), ReasonInput},
		{"reasoning_without_summary", reasoning(`"content":[{"type":"reasoning_text","text":"t"}]`), ReasonInput},
		{"reasoning_with_a_null_id", items(`{"type":"reasoning","id":null,"summary":[]}`), ReasonInput},
		{"reasoning_summary_of_wrong_type", reasoning(`"summary":[{"type":"reasoning_text","text":"t"}]`), ReasonInput},
		{"encrypted_reasoning", reasoning(`"summary":[{"type":"summary_text","text":"s"}],"encrypted_content":"gAAAA"}`), ReasonInput},
		{"unknown_effort", `{"model":"m","input":"q","reasoning":{"effort":"extreme"}}`, ReasonInput},
		{"empty_effort", `{"model":"m","input":"q","reasoning":{"effort":""}}`, ReasonInput},
		{"kwargs_a_list", `{"model":"m","input":"q","chat_template_kwargs":[]}`, ReasonInput},
		{"reasoning_a_string", `{"model":"m","input":"q","reasoning":"high"}`, ReasonInput},
		{"zero_max_output_tokens", `{"model":"m","input":"q","max_output_tokens":0}`, ReasonInput},
		{"fractional_max_output_tokens", `{"model":"m","input":"q","max_output_tokens":1.5}`, ReasonInput},
		{"unknown_truncation", `{"model":"m","input":"q","truncation":"left"}`, ReasonInput},
		{"tools_not_a_list", `{"model":"m","input":"q","tools":{}}`, ReasonInput},
		{"null_tools", `{"model":"m","input":"q","tools":null}`, ReasonInput},
		{"tool_without_type", tool(`{"name":"f"}`), ReasonInput},
		{"function_without_name", tool(`{"type":"function"}`), ReasonInput},
		{"parameters_a_list", params(`[]`), ReasonInput},
		{"strict_not_a_bool", tool(`{"type":"function","name":"f","strict":"maybe"}`), ReasonInput},
		{"namespace_without_description", tool(`{"type":"namespace","name":"n","tools":[]}`), ReasonInput},
		{"namespace_with_a_builtin_tool", tool(`{"type":"namespace","name":"n","description":"d","tools":[{"type":"web_search"}]}`), ReasonInput},
	})
}

// TestChatFromResponsesResultIsBoundedByTheBody feeds bodies made of what
// grows most in the conversion and checks that the result stays within
// five times the body's size.
func TestChatFromResponsesResultIsBoundedByTheBody(t *testing.T) {
	many := func(n int, s string) string { return strings.TrimSuffix(strings.Repeat(s+",", n), ",") }
	for _, tt := range []struct{ name, body string }{
		{"minimal_function_tools", `{"model":"m","input":"","tools":[` + many(1000, `{"type":"function","name":""}`) + `]}`},
		{"minimal_namespaced_functions", `{"model":"m","input":"","tools":[{"type":"namespace","name":"n","description":"","tools":[` +
			many(1000, `{"type":"function","name":""}`) + `]}]}`},
		{"long_floats_in_parameters", `{"model":"m","input":"","tools":[{"type":"function","name":"","parameters":{"a":[` +
			many(1000, `1e15`) + `]}}]}`},
		{"non_ascii_in_parameters", `{"model":"m","input":"","tools":[{"type":"function","name":"","parameters":{"a":"` +
			strings.Repeat("é", 1000) + `"}}]}`},
		{"minimal_calls", `{"model":"m","input":[` + many(1000, `{"type":"function_call","call_id":"","name":"","arguments":""}`) + `]}`},
		{"minimal_reasoning", `{"model":"m","input":[` + many(1000, `{"type":"reasoning","id":"","summary":[]}`) + `]}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ChatFromResponses([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if n := len(got.Messages) + len(got.Tools) + len(got.ChatTemplateKwargs); n > 5*len(tt.body) {
				t.Fatalf("wrote %d bytes of JSON for a body of %d", n, len(tt.body))
			}
		})
	}
}

// A Codex CLI turn: instructions, the user's request, a shell call and its
// output, the answer and a follow-up, with a function tool and built-in
// ones, as a Responses body and as the OpenAI chat body vLLM renders it
// as, written as an OpenAI client would write it.
const codexTurnResponses = `{
  "model": "m", "stream": true, "store": false, "parallel_tool_calls": false,
  "instructions": "You are Codex, a coding agent.\nBe concise.",
  "input": [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "How many Go files are there?"}]},
    {"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"bash\",\"-lc\",\"ls *.go | wc -l\"]}", "call_id": "call_1"},
    {"type": "function_call_output", "call_id": "call_1", "output": "2\n"},
    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "There are 2 Go files.", "annotations": []}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks, and tests?"}]}
  ],
  "tools": [
    {"type": "function", "name": "shell", "description": "Runs a shell command.", "strict": false,
     "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}, "timeout_ms": {"type": "number"}}, "required": ["command"], "additionalProperties": false}},
    {"type": "web_search"}, {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}}
  ],
  "tool_choice": "auto"
}`

const codexTurnChat = `{
  "model": "m",
  "messages": [
    {"role": "system", "content": "You are Codex, a coding agent.\nBe concise."},
    {"role": "user", "content": [{"type": "text", "text": "How many Go files are there?"}]},
    {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\":[\"bash\",\"-lc\",\"ls *.go | wc -l\"]}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "2\n"},
    {"role": "assistant", "content": "There are 2 Go files."},
    {"role": "user", "content": [{"type": "text", "text": "Thanks, and tests?"}]}
  ],
  "tools": [
    {"type": "function", "function": {
      "name": "shell", "description": "Runs a shell command.",
      "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}, "timeout_ms": {"type": "number"}}, "required": ["command"], "additionalProperties": false},
      "strict": false, "defer_loading": null}}
  ]
}`

// TestChatFromResponsesTokenizesAsTheEquivalentOpenAIChat renders the
// converted requests with real models' chat templates and tokenizers,
// through the package's in-process chat path, and checks that each gives
// the ids of the equivalent OpenAI chat body, or that both are refused
// alike (a template that reads an assistant's reasoning, for one).
func TestChatFromResponsesTokenizesAsTheEquivalentOpenAIChat(t *testing.T) {
	tks := anthropicTokenizers(t)
	turn, err := ChatFromResponses([]byte(codexTurnResponses))
	if err != nil {
		t.Fatal(err)
	}
	pairs := []chatPair{{name: "codex_turn", converted: turn, openAI: chatRequest(t, codexTurnChat), mustTokenize: true}}
	for _, c := range responsesCases {
		got, err := ChatFromResponses([]byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		want := c.chat().request()
		if c.continued {
			f, t := false, true
			want.AddGenerationPrompt, want.ContinueFinalMessage = &f, &t
		}
		pairs = append(pairs, chatPair{name: c.name, converted: got, openAI: want})
	}
	tokenizesAsTheEquivalentChat(t, tks, pairs)
}

func ExampleChatFromResponses() {
	req, err := ChatFromResponses([]byte(`{"model":"m","instructions":"Be brief.","input":[` +
		`{"role":"user","content":"Weather in Paris?"},` +
		`{"type":"function_call","call_id":"c1","name":"weather","arguments":"{\"city\":\"Paris\"}"},` +
		`{"type":"function_call_output","call_id":"c1","output":"18C"}]}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(req.Messages))
	// Output:
	// [{"role":"system","content":"Be brief."},{"role":"user","content":"Weather in Paris?"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"18C"}]
}
