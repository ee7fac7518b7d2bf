package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
)

// billingHeader starts the system text block Claude Code sends with a
// per-request hash; vLLM leaves such blocks out of the prompt.
const billingHeader = "x-anthropic-billing-header"

// ChatFromAnthropic returns the chat request whose rendering is the prompt
// vLLM renders for body, the JSON body of an Anthropic Messages request
// (POST /v1/messages). vLLM serves that endpoint by converting the body
// into an OpenAI chat completion request
// (AnthropicServingMessages._convert_anthropic_to_openai_request in
// vllm/entrypoints/anthropic/serving.py) and rendering it as a chat; the
// result is that request, for TokenizeChat:
//
//   - system, a string or a list of text blocks, becomes a leading system
//     message: the blocks' texts joined with nothing between them, empty
//     ones and Claude Code's x-anthropic-billing-header block left out;
//   - a message's text blocks become its content (a string for one, a
//     list of text parts for several), its thinking blocks its reasoning
//     (joined with nothing between them), its tool_use blocks its
//     tool_calls, whose arguments are the input as Python's json.dumps
//     writes it, byte for byte; redacted_thinking and tool_reference
//     blocks are left out;
//   - a user message's tool_result blocks become tool messages placed
//     before it, holding their text (text items joined with "\n"); the
//     user message itself is left out when nothing else remains of it.
//     An assistant's become text parts "Tool result: ...";
//   - tools become OpenAI function tools {"type":"function","function":
//     {"name","description","parameters","defer_loading"}}, their
//     input_schema given "type":"object" when it names no type;
//   - chat_template_kwargs is kept, output_config.effort becomes
//     reasoning_effort and max_tokens both max_tokens and
//     max_completion_tokens. tool_choice, which the OpenAI chat form does
//     not forward either (see ChatRequest), and sampling fields are left
//     out; "ctx" and "msg" roles are read as "user", as vLLM reads them.
//
// This is vLLM's current conversion; earlier versions kept the billing
// header, left defer_loading out of tools and rendered tool results
// otherwise.
//
// A request vLLM renders into a prompt that cannot be reproduced exactly
// is refused with ReasonUnsupported, so that the caller routes it on load
// alone, since a wrong prompt would credit the wrong pods: images
// (anywhere), a tool_use block without an id (vLLM names it after the
// current time), a system message inside messages (which vLLM versions
// and settings place differently), a tool_result whose content holds
// anything but text items, an assistant's tool_result with a list of
// content (Python's repr), and JSON values Python reads into something
// this package does not reproduce: strings holding lone UTF-16
// surrogates, objects in tool inputs, schemas or chat_template_kwargs
// naming a member twice, numbers that overflow a float, integers of more
// than 4300 digits and nesting deeper than 100. A body vLLM itself
// refuses (no model or max_tokens, a content block of an unknown type,
// values of the wrong type) fails with ReasonInput. Every error is an
// *Error.
//
// body is read whole and is not retained; its size bounds the work and the
// result, which is at most five times larger than body (Python's
// spelling of a number or of a non-ASCII character is longer than the
// JSON it came from).
func ChatFromAnthropic(body []byte) (*ChatRequest, error) {
	return chatFromAnthropic(body, false)
}

// ChatFromAnthropicCountTokens is ChatFromAnthropic for the body of an
// Anthropic token count request (POST /v1/messages/count_tokens), which
// vLLM converts alike but for max_tokens and output_config, which it does
// not read.
func ChatFromAnthropicCountTokens(body []byte) (*ChatRequest, error) {
	return chatFromAnthropic(body, true)
}

// anthropicRequest holds the members of a Messages request body that
// change the prompt, as written; absent ones are nil.
type anthropicRequest struct {
	model, messages, maxTokens, system, tools, chatTemplateKwargs, outputConfig []byte
}

// anthropicConverter builds the OpenAI chat request of one body.
type anthropicConverter struct {
	model string
	msgs  []chatMessage
}

func chatFromAnthropic(body []byte, countTokens bool) (req *ChatRequest, err error) {
	c := &anthropicConverter{}
	defer func() {
		if err != nil {
			req, err = nil, conversionError(c.model, "anthropic", err)
		}
	}()
	var r anthropicRequest
	err = bodyMembers(body, func(name, value []byte) error {
		switch string(jsonscan.Name(name)) {
		case "model":
			r.model = value
		case "messages":
			r.messages = value
		case "max_tokens":
			r.maxTokens = value
		case "system":
			r.system = value
		case "tools":
			r.tools = value
		case "chat_template_kwargs":
			r.chatTemplateKwargs = value
		case "output_config":
			r.outputConfig = value
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if c.model, err = requestModel(r.model); err != nil {
		return nil, err
	}
	out := &ChatRequest{Model: c.model}
	if !countTokens {
		n, null, err := jsonscan.LaxInt(r.maxTokens)
		switch {
		case r.maxTokens == nil || null:
			return nil, errors.New("max_tokens is required")
		case err != nil:
			return nil, fmt.Errorf("max_tokens: %w", err)
		case n <= 0:
			return nil, errors.New("max_tokens must be positive")
		}
		out.MaxTokens, out.MaxCompletionTokens = &n, &n
		if out.ReasoningEffort, err = anthropicEffort(r.outputConfig); err != nil {
			return nil, err
		}
	}
	if err := c.system(r.system); err != nil {
		return nil, err
	}
	if !present(r.messages) {
		return nil, errors.New("messages is required")
	}
	if err := c.messages(r.messages); err != nil {
		return nil, err
	}
	out.Messages = appendChatMessages(nil, c.msgs)
	if out.Tools, err = anthropicTools(r.tools); err != nil {
		return nil, err
	}
	if out.ChatTemplateKwargs, err = chatTemplateKwargs(r.chatTemplateKwargs); err != nil {
		return nil, err
	}
	return out, nil
}

// stringField decodes a string member; null or absent gives "".
func stringField(raw []byte, what string) (string, error) {
	if !present(raw) {
		return "", nil
	}
	if raw[0] != '"' {
		return "", fmt.Errorf("%s is not a string", what)
	}
	s, _, err := decodeString(raw, 0)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return s, nil
}

func isObject(raw []byte) bool { return len(raw) > 0 && raw[0] == '{' }
func isArray(raw []byte) bool  { return len(raw) > 0 && raw[0] == '[' }

// anthropicEffort reads output_config.effort.
func anthropicEffort(raw []byte) (string, error) {
	e, _, err := stringMember(raw, "output_config", "effort")
	if err != nil {
		return "", err
	}
	switch e {
	case "", "low", "medium", "high", "xhigh", "max":
		return e, nil
	}
	return "", fmt.Errorf("output_config.effort %q is not low, medium, high, xhigh or max", e)
}

// anthropicBlock holds the members of a content block that the conversion
// reads, decoded; text and thinking (as JSON strings) and input are nil
// when absent or null.
type anthropicBlock struct {
	typ       string
	text      []byte
	thinking  []byte
	id, name  string
	toolUseID string
	input     []byte // a JSON object, or nil
	content   []byte // a JSON string or array, or nil
}

// blockTypes are the content block types vLLM accepts.
var blockTypes = map[string]bool{
	"text": true, "image": true, "tool_use": true, "tool_result": true,
	"tool_reference": true, "thinking": true, "redacted_thinking": true,
}

// decodeBlock reads a content block as vLLM validates it.
func decodeBlock(raw []byte) (anthropicBlock, error) {
	var b anthropicBlock
	if !isObject(raw) {
		return b, errors.New("content block is not an object")
	}
	var typ, text, thinking, id, name, toolUseID []byte
	if err := jsonscan.Members(raw, func(n, value []byte) error {
		switch string(jsonscan.Name(n)) {
		case "type":
			typ = value
		case "text":
			text = value
		case "thinking":
			thinking = value
		case "id":
			id = value
		case "name":
			name = value
		case "tool_use_id":
			toolUseID = value
		case "input":
			b.input = value
		case "content":
			b.content = value
		}
		return nil
	}); err != nil {
		return b, err
	}
	var err error
	if b.typ, err = stringField(typ, "type"); err != nil {
		return b, err
	}
	if !blockTypes[b.typ] {
		return b, fmt.Errorf("content block type %q is not one vLLM accepts", b.typ)
	}
	if present(text) {
		if b.text, err = stringJSON(text, "text"); err != nil {
			return b, err
		}
	}
	if present(thinking) {
		if b.thinking, err = stringJSON(thinking, "thinking"); err != nil {
			return b, err
		}
	}
	if b.id, err = stringField(id, "id"); err != nil {
		return b, err
	}
	if b.name, err = stringField(name, "name"); err != nil {
		return b, err
	}
	if b.toolUseID, err = stringField(toolUseID, "tool_use_id"); err != nil {
		return b, err
	}
	if b.input = value(b.input); b.input != nil && !isObject(b.input) {
		return b, errors.New("tool_use input is not an object")
	}
	if b.content = value(b.content); b.content != nil && b.content[0] != '"' && !isArray(b.content) {
		return b, errors.New("tool_result content is neither a string nor a list")
	}
	return b, nil
}

// system writes the leading system message (_convert_system_message).
func (c *anthropicConverter) system(raw []byte) error {
	if !present(raw) {
		return nil
	}
	var texts [][]byte // JSON strings
	switch {
	case raw[0] == '"':
		s, err := stringJSON(raw, "system")
		if err != nil {
			return err
		}
		texts = append(texts, s)
	case isArray(raw):
		if err := eachElement(raw, "", func(_ int, elem []byte) error {
			b, err := decodeBlock(elem)
			switch {
			case err != nil:
				return fmt.Errorf("system: %w", err)
			case b.typ == "image":
				return notReproducible("system holds an image")
			case b.typ == "text" && b.text != nil && !startsWithBillingHeader(b.text):
				texts = append(texts, b.text)
			}
			return nil
		}); err != nil {
			return err
		}
	default:
		return errors.New("system is neither a string nor a list")
	}
	n := 0
	for _, t := range texts {
		n += len(jsonInner(t))
	}
	switch {
	case n == 0:
	case len(texts) == 1:
		c.msgs = append(c.msgs, chatMessage{role: "system", content: texts[0]})
	default:
		c.msgs = append(c.msgs, chatMessage{role: "system", content: joinJSONStrings(texts, "")})
	}
	return nil
}

// startsWithBillingHeader reports whether the text of JSON string s, as
// appendJSONString writes it, starts with billingHeader.
func startsWithBillingHeader(s []byte) bool {
	inner := jsonInner(s)
	if bytes.IndexByte(inner[:min(len(inner), len(billingHeader))], '\\') < 0 {
		return bytes.HasPrefix(inner, []byte(billingHeader))
	}
	text, _ := stringField(s, "text")
	return strings.HasPrefix(text, billingHeader)
}

// messages writes the conversation (_convert_messages).
func (c *anthropicConverter) messages(raw []byte) error {
	if !isArray(raw) {
		return errors.New("messages is not a list")
	}
	return eachElement(raw, "messages", func(_ int, elem []byte) error { return c.message(elem) })
}

// message writes one Anthropic message: the tool messages of its
// tool_result blocks, then itself (_convert_message_content,
// _convert_block).
func (c *anthropicConverter) message(raw []byte) error {
	if !isObject(raw) {
		return errors.New("message is not an object")
	}
	var roleRaw, content []byte
	if err := jsonscan.Members(raw, func(name, value []byte) error {
		switch string(jsonscan.Name(name)) {
		case "role":
			roleRaw = value
		case "content":
			content = value
		}
		return nil
	}); err != nil {
		return err
	}
	role, err := stringField(roleRaw, "role")
	if err != nil {
		return err
	}
	switch role {
	case "ctx", "msg":
		role = "user"
	case "user", "assistant":
	case "system":
		return notReproducible("a system message inside messages, which vLLM versions place differently")
	default:
		return fmt.Errorf("role %q is not user, assistant or system", role)
	}
	if !present(content) {
		return errors.New("content is required")
	}
	if content[0] == '"' {
		s, err := stringJSON(content, "content")
		if err != nil {
			return err
		}
		c.msgs = append(c.msgs, chatMessage{role: role, content: s})
		return nil
	}
	if !isArray(content) {
		return errors.New("content is neither a string nor a list")
	}
	var (
		parts        [][]byte // JSON strings
		calls        []byte   // the tool_calls array's elements
		reasoning    []byte   // the inner of a JSON string
		hasReasoning bool
	)
	err = eachElement(content, "content", func(_ int, elem []byte) error {
		b, err := decodeBlock(elem)
		if err != nil {
			return err
		}
		switch b.typ {
		case "text":
			if b.text != nil && len(jsonInner(b.text)) > 0 {
				parts = append(parts, b.text)
			}
		case "image":
			return notReproducible("an image")
		case "thinking":
			if b.thinking != nil {
				reasoning = append(reasoning, jsonInner(b.thinking)...)
				hasReasoning = true
			}
		case "tool_use":
			if b.id == "" {
				return notReproducible("a tool_use block without an id, which vLLM names after the current time")
			}
			input := b.input
			if input == nil {
				input = []byte("{}")
			}
			args, err := appendPyDumps(nil, input)
			if err != nil {
				return fmt.Errorf("tool_use input: %w", err)
			}
			if len(calls) > 0 {
				calls = append(calls, ',')
			}
			calls = appendToolCall(calls, b.id, b.name, appendJSONString(nil, string(args)))
		case "tool_result":
			if role == "user" {
				return c.toolResult(b)
			}
			text, err := assistantToolResult(b.content)
			if err != nil {
				return err
			}
			parts = append(parts, appendJSONString(nil, "Tool result: "+text))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if role == "user" && len(parts) == 0 {
		return nil
	}
	m := chatMessage{role: role, toolCalls: calls}
	if hasReasoning {
		m.reasoning = make([]byte, 0, len(reasoning)+2)
		m.reasoning = append(append(append(m.reasoning, '"'), reasoning...), '"')
	}
	switch {
	case len(parts) == 1:
		m.content = parts[0]
	case len(parts) > 1:
		m.content = appendTextParts(nil, parts)
	}
	c.msgs = append(c.msgs, m)
	return nil
}

// toolResult writes the tool message of a user's tool_result block
// (_convert_user_tool_result).
func (c *anthropicConverter) toolResult(b anthropicBlock) error {
	text := emptyJSONString
	switch {
	case b.content == nil:
	case b.content[0] == '"':
		s, err := stringJSON(b.content, "tool_result content")
		if err != nil {
			return err
		}
		text = s
	default:
		var texts [][]byte
		if err := eachElement(b.content, "", func(_ int, item []byte) error {
			typ, itemText, err := typeAnd(item, "tool_result content item", "text")
			if err != nil {
				return err
			}
			if string(typ) != `"text"` {
				return notReproducible("a tool_result content item of type %.40s", typ)
			}
			s := emptyJSONString
			if itemText != nil {
				if len(itemText) == 0 || itemText[0] != '"' {
					return errors.New("tool_result text is not a string")
				}
				if s, err = stringJSON(itemText, "tool_result text"); err != nil {
					return err
				}
			}
			texts = append(texts, s)
			return nil
		}); err != nil {
			return err
		}
		text = joinJSONStrings(texts, `\n`)
	}
	c.msgs = append(c.msgs, chatMessage{role: "tool", toolCallID: &b.toolUseID, content: text})
	return nil
}

// assistantToolResult returns the text of an assistant's tool_result
// block, Python's str() of its content: a string as it is, an empty or
// absent content as "", and a list, printed as Python's repr, refused.
func assistantToolResult(content []byte) (string, error) {
	switch {
	case content == nil:
		return "", nil
	case content[0] == '"':
		return stringField(content, "tool_result content")
	}
	empty := true
	if err := jsonscan.ArrayElements(content, func([]byte) { empty = false }); err != nil {
		return "", err
	}
	if !empty {
		return "", notReproducible("an assistant's tool_result holding a list, which vLLM prints as Python's repr")
	}
	return "", nil
}

// anthropicTools returns the OpenAI tools of Anthropic's (_convert_tools),
// as vLLM builds them.
func anthropicTools(raw []byte) (json.RawMessage, error) {
	if !present(raw) {
		return nil, nil
	}
	if !isArray(raw) {
		return nil, errors.New("tools is not a list")
	}
	out := []byte{'['}
	if err := eachElement(raw, "tools", func(i int, elem []byte) (err error) {
		if i > 0 {
			out = append(out, ',')
		}
		out, err = appendAnthropicTool(out, elem)
		return err
	}); err != nil {
		return nil, err
	}
	return append(out, ']'), nil
}

// appendAnthropicTool appends the OpenAI function tool of one Anthropic
// tool: name, description (null when absent), parameters (the input
// schema, with "type":"object" appended when it names no type) and
// defer_loading (null when absent), in that order.
func appendAnthropicTool(out, raw []byte) ([]byte, error) {
	if !isObject(raw) {
		return nil, errors.New("tool is not an object")
	}
	var name, description, schema, deferLoading []byte
	if err := jsonscan.Members(raw, func(n, value []byte) error {
		switch string(jsonscan.Name(n)) {
		case "name":
			name = value
		case "description":
			description = value
		case "input_schema":
			schema = value
		case "defer_loading":
			deferLoading = value
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if !present(name) || name[0] != '"' {
		return nil, errors.New("name is required and must be a string")
	}
	toolName, err := stringField(name, "name")
	if err != nil {
		return nil, err
	}
	if out, err = appendFunctionHead(out, toolName, description, stringField); err != nil {
		return nil, err
	}
	if !present(schema) || !isObject(schema) {
		return nil, errors.New("input_schema is required and must be an object")
	}
	hasType := false
	if err := jsonscan.Members(schema, func(n, _ []byte) error {
		if string(jsonscan.Name(n)) == "type" {
			hasType = true
		}
		return nil
	}); err != nil {
		return nil, err
	}
	out = append(out, `,"parameters":`...)
	if out, err = appendPyDumps(out, schema); err != nil {
		return nil, fmt.Errorf("input_schema: %w", err)
	}
	if !hasType {
		out = out[:len(out)-1]
		if !bytes.HasSuffix(out, []byte("{")) {
			out = append(out, ", "...)
		}
		out = append(out, `"type": "object"}`...)
	}
	if out, err = appendBoolMember(out, "defer_loading", deferLoading); err != nil {
		return nil, err
	}
	return append(out, '}', '}'), nil
}

// joinJSONStrings returns the JSON string of the texts of the JSON strings
// texts joined with the text whose JSON string holds sep between its
// quotes.
func joinJSONStrings(texts [][]byte, sep string) []byte {
	n := 2
	for _, t := range texts {
		n += len(t) + len(sep)
	}
	out := append(make([]byte, 0, n), '"')
	for i, t := range texts {
		if i > 0 {
			out = append(out, sep...)
		}
		out = append(out, jsonInner(t)...)
	}
	return append(out, '"')
}
