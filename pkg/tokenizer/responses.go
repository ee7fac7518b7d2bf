package tokenizer

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
)

// namespaceSeparator joins a namespace tool's name and the name of each of
// its functions into the function name the model sees.
const namespaceSeparator = "__"

// ChatFromResponses returns the chat request whose rendering is the prompt
// vLLM renders for body, the JSON body of an OpenAI Responses request
// (POST /v1/responses), for the models vLLM renders with their chat
// template: all but gpt-oss, which it renders with harmony, not
// reproduced here, so that the caller must not use it for them. vLLM
// serves the endpoint by converting the body into chat messages and tools
// (construct_input_messages and construct_tool_dicts in
// vllm/entrypoints/openai/responses/utils.py) and rendering them as a chat
// completion is rendered; the result is that chat, for TokenizeChat:
//
//   - instructions, when not empty, becomes a leading system message, and
//     input, when a string, one user message;
//   - each message item of an input list with role user, system or
//     developer becomes a message of its role and content, a string or a
//     list of input_text parts (as text parts), its other members left
//     out;
//   - an assistant message item becomes an assistant message holding the
//     text of its first content part only: an output_text part when the
//     item is an output message (of type message, its content output_text
//     and refusal parts), else an input_text part or the content as a
//     string; "" when it has none or it is a refusal;
//   - a reasoning item becomes an assistant message whose reasoning is the
//     text of its first content part, else of its first summary part, else
//     "";
//   - a function_call item becomes an assistant's tool call {"id":
//     call_id, "type": "function", "function": {"name", "arguments"}},
//     named "<namespace>__<name>" when it has a namespace, its arguments
//     the string as sent; a function_call_output item becomes a tool
//     message holding its output;
//   - an assistant message, reasoning or function call item that follows
//     an assistant message is merged into it instead: a call always, a
//     message when it has no content yet, reasoning when it has none yet;
//   - the last item is continued (continue_final_message set,
//     add_generation_prompt cleared) when its status is "in_progress" or
//     "incomplete" and it is an output message, a reasoning item or a
//     user, system or developer message whose content is a list;
//   - tools of type function become OpenAI function tools {"type":
//     "function", "function": {"name", "description", "parameters",
//     "strict", "defer_loading"}}, absent members null and parameters as
//     Python's json.dumps writes them, and so do the functions of a
//     namespace tool, named "<namespace>__<name>"; other tools are not
//     rendered, and tools none of which is a function render as an empty
//     list;
//   - chat_template_kwargs is kept, and reasoning.effort becomes
//     reasoning_effort, passed to the template as a chat's is (with
//     enable_thinking, unless chat_template_kwargs sets it);
//   - truncation "auto" or null truncates the prompt to the model's
//     context length less max_output_tokens, which becomes both max_tokens
//     and max_completion_tokens.
//
// The sampling fields, stream, store and text do not change the prompt,
// nor does tool_choice unless vLLM runs with
// --exclude-tools-when-tool-choice-none, which then drops the tools for
// "none", as it does for chats, whose tool_choice is not forwarded either
// (see ChatRequest). This is vLLM's current conversion: earlier versions
// read no chat_template_kwargs and set no enable_thinking, left the tools
// out whenever tool_choice was "none", read a reasoning item's summary
// before its content, merged no items, knew no namespaces and passed
// assistant message items on as they were.
//
// A request whose prompt cannot be reproduced exactly is refused with
// ReasonUnsupported, so that the caller routes it on load alone, since a
// wrong prompt would credit the wrong pods: one that continues a
// conversation the engine holds (previous_response_id, previous_response,
// previous_input_messages, conversation), images, files and audio
// (anywhere), a tool_search tool and items of any type but those above
// (which vLLM versions render differently or not at all), a reasoning item
// without an id (which some refuse and others read otherwise), an output_text
// part with annotations, a function tool with members other than those
// above, JSON values Python reads into something this package does not
// reproduce (as for ChatFromAnthropic: strings holding lone UTF-16
// surrogates, and in parameters or chat_template_kwargs members named
// twice, numbers out of Python's range, nesting deeper than 100), and
// namespaces whose name, repeated in each of their functions, would make
// the result more than five times larger than the body. A body vLLM
// itself refuses fails with ReasonInput: no model, no input, an item of
// no shape vLLM knows, values of the wrong type, a prompt template, a
// reasoning item with encrypted_content (which vLLM does not read), an
// output message with an id and a status whose first part is a refusal,
// max_output_tokens below 1. Every error is an *Error.
//
// body is read whole and is not retained; its size bounds the work and the
// result, which is at most five times larger than body.
func ChatFromResponses(body []byte) (req *ChatRequest, err error) {
	c := &responsesConverter{limit: 5 * len(body)}
	defer func() {
		if err != nil {
			req, err = nil, conversionError(c.model, "responses", err)
		}
	}()
	var r responsesRequest
	if err := bodyMembers(body, func(name, value []byte) error {
		switch string(jsonscan.Name(name)) {
		case "model":
			r.model = value
		case "input":
			r.input = value
		case "instructions":
			r.instructions = value
		case "tools":
			r.tools = value
		case "reasoning":
			r.reasoning = value
		case "max_output_tokens":
			r.maxOutputTokens = value
		case "truncation":
			r.truncation = value
		case "prompt":
			r.prompt = value
		case "chat_template_kwargs":
			r.chatTemplateKwargs = value
		case "previous_response_id", "previous_response", "previous_input_messages", "conversation":
			if present(value) {
				r.stored = string(jsonscan.Name(name))
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if c.model, err = requestModel(r.model); err != nil {
		return nil, err
	}
	if r.stored != "" {
		return nil, notReproducible("%s continues a conversation the engine holds", r.stored)
	}
	if present(r.prompt) {
		return nil, errors.New("prompt templates are not supported")
	}
	out := &ChatRequest{Model: c.model}
	if err := responsesTruncation(out, r.maxOutputTokens, r.truncation); err != nil {
		return nil, err
	}
	if out.ReasoningEffort, err = responsesEffort(r.reasoning); err != nil {
		return nil, err
	}
	if out.ChatTemplateKwargs, err = chatTemplateKwargs(r.chatTemplateKwargs); err != nil {
		return nil, err
	}
	instructions, err := stringJSON(r.instructions, "instructions")
	if err != nil {
		return nil, err
	}
	if len(jsonInner(instructions)) > 0 {
		c.msgs = append(c.msgs, chatMessage{role: "system", content: instructions})
	}
	continueFinal, err := c.input(r.input)
	if err != nil {
		return nil, err
	}
	if continueFinal {
		f, t := false, true
		out.AddGenerationPrompt, out.ContinueFinalMessage = &f, &t
	}
	out.Messages = appendChatMessages(nil, c.msgs)
	if out.Tools, err = tools(r.tools, c.limit-len(out.Messages)); err != nil {
		return nil, err
	}
	return out, nil
}

// responsesRequest holds the members of a Responses request body that
// change the prompt, as written; absent ones are nil. stored names a
// member that continues a conversation held by the engine.
type responsesRequest struct {
	model, input, instructions, tools, reasoning, maxOutputTokens, truncation, prompt, chatTemplateKwargs []byte
	stored                                                                                                string
}

// responsesConverter builds the chat request of one body.
type responsesConverter struct {
	model string
	msgs  []chatMessage
	limit int // the most bytes of JSON the result may hold
}

// responsesTruncation sets out's truncation fields from max_output_tokens
// and truncation (build_tok_params).
func responsesTruncation(out *ChatRequest, maxRaw, truncRaw []byte) error {
	n, null, err := jsonscan.LaxInt(maxRaw)
	switch {
	case maxRaw == nil || null:
	case err != nil:
		return fmt.Errorf("max_output_tokens: %w", err)
	case n < 1:
		return errors.New("max_output_tokens must be at least 1")
	default:
		out.MaxTokens, out.MaxCompletionTokens = &n, &n
	}
	if truncRaw == nil {
		return nil
	}
	if present(truncRaw) {
		t, err := stringField(truncRaw, "truncation")
		if err != nil {
			return err
		}
		switch t {
		case "disabled":
			return nil
		case "auto":
		default:
			return fmt.Errorf("truncation %q is neither auto nor disabled", t)
		}
	}
	keep := -1
	out.TruncatePromptTokens = &keep
	return nil
}

// responsesEffort returns reasoning.effort, "" when there is none.
func responsesEffort(raw []byte) (string, error) {
	e, ok, err := stringMember(raw, "reasoning", "effort")
	if err != nil || !ok {
		return "", err
	}
	switch e {
	case "none", "minimal", "low", "medium", "high", "xhigh":
		return e, nil
	}
	return "", fmt.Errorf("reasoning.effort %q is not none, minimal, low, medium, high or xhigh", e)
}

// input converts the input member (construct_input_messages), reporting
// whether its last item is one to continue (should_continue_final_message).
func (c *responsesConverter) input(raw []byte) (bool, error) {
	switch {
	case !present(raw):
		return false, errors.New("input is required")
	case raw[0] == '"':
		s, err := stringJSON(raw, "input")
		if err != nil {
			return false, err
		}
		c.msgs = append(c.msgs, chatMessage{role: "user", content: s})
		return false, nil
	case !isArray(raw):
		return false, errors.New("input is neither a string nor a list")
	}
	continueFinal := false
	err := eachElement(raw, "input", func(_ int, elem []byte) (err error) {
		continueFinal, err = c.item(elem)
		return err
	})
	return continueFinal, err
}

// responseItem holds the members of an input item that the conversion
// reads, as written; absent ones are nil.
type responseItem struct {
	typ, role, content, status, id, callID, name, arguments, namespace,
	output, summary, encryptedContent []byte
	typed bool // type is present and a string
}

func decodeItem(raw []byte) (responseItem, error) {
	var it responseItem
	if !isObject(raw) {
		return it, errors.New("item is not an object")
	}
	err := jsonscan.Members(raw, func(name, value []byte) error {
		switch string(jsonscan.Name(name)) {
		case "type":
			it.typ = value
		case "role":
			it.role = value
		case "content":
			it.content = value
		case "status":
			it.status = value
		case "id":
			it.id = value
		case "call_id":
			it.callID = value
		case "name":
			it.name = value
		case "arguments":
			it.arguments = value
		case "namespace":
			it.namespace = value
		case "output":
			it.output = value
		case "summary":
			it.summary = value
		case "encrypted_content":
			it.encryptedContent = value
		}
		return nil
	})
	return it, err
}

// item converts one input item (_construct_message_from_response_item),
// reporting whether it is one to continue were it the last.
func (c *responsesConverter) item(raw []byte) (bool, error) {
	it, err := decodeItem(raw)
	if err != nil {
		return false, err
	}
	typ := "message"
	if it.typ != nil {
		if typ, err = requiredString(it.typ, "type"); err != nil {
			return false, err
		}
		it.typed = true
	}
	switch typ {
	case "message":
		return c.message(it)
	case "function_call":
		return false, c.functionCall(it)
	case "function_call_output":
		return false, c.functionCallOutput(it)
	case "reasoning":
		return c.reasoning(it)
	}
	return false, notReproducible("an item of type %q", typ)
}

// itemStatus reads an item's optional status: "" when absent or null.
func itemStatus(raw []byte) (string, error) {
	s, err := stringField(raw, "status")
	if err != nil {
		return "", err
	}
	switch s {
	case "", "in_progress", "completed", "incomplete":
		return s, nil
	}
	return "", fmt.Errorf("status %q is not in_progress, completed or incomplete", s)
}

func continues(status string) bool { return status == "in_progress" || status == "incomplete" }

// requiredString decodes a member that must be a string.
func requiredString(raw []byte, what string) (string, error) {
	if !present(raw) || raw[0] != '"' {
		return "", fmt.Errorf("%s is required and must be a string", what)
	}
	return stringField(raw, what)
}

// checkIDAndStatus checks the members a function call or function call
// output item may carry but the conversion does not use: an id (absent,
// null or a string) and a status.
func checkIDAndStatus(it responseItem) error {
	if _, err := stringField(it.id, "id"); err != nil {
		return err
	}
	_, err := itemStatus(it.status)
	return err
}

// message converts a message item: a user, system or developer message is
// passed on with its role and content; an assistant message is read as
// vLLM reads it, as an output message when it is one, else as an easy
// input message.
func (c *responsesConverter) message(it responseItem) (bool, error) {
	role, err := requiredString(it.role, "role")
	if err != nil {
		return false, err
	}
	switch role {
	case "user", "system", "developer":
	case "assistant":
		return c.assistantMessage(it)
	default:
		return false, fmt.Errorf("role %q is not user, system, developer or assistant", role)
	}
	if !present(it.content) {
		return false, errors.New("content is required")
	}
	if it.content[0] == '"' {
		s, err := stringJSON(it.content, "content")
		if err != nil {
			return false, err
		}
		c.msgs = append(c.msgs, chatMessage{role: role, content: s})
		return false, nil
	}
	texts, err := inputParts(it.content)
	if err != nil {
		return false, err
	}
	c.msgs = append(c.msgs, chatMessage{role: role, content: appendTextParts(nil, texts)})
	// The status survives validation only as that of an input message with
	// a list of content, and only when it is a valid one.
	status, err := itemStatus(it.status)
	return err == nil && continues(status), nil
}

// inputParts returns the texts of a list of input content parts, as JSON
// strings, refusing media.
func inputParts(raw []byte) ([][]byte, error) {
	if !isArray(raw) {
		return nil, errors.New("content is neither a string nor a list")
	}
	var texts [][]byte
	err := eachElement(raw, "content", func(_ int, elem []byte) error {
		typ, text, _, err := contentPart(elem)
		switch {
		case err != nil:
			return err
		case typ == "input_text":
			texts = append(texts, text)
		case typ == "input_image", typ == "input_file", typ == "input_audio":
			return notReproducible("an %s part", typ)
		default:
			return fmt.Errorf("content part type %q is not an input part", typ)
		}
		return nil
	})
	return texts, err
}

// contentPart decodes a content part's type and, for a text part
// (input_text, output_text), its text as a JSON string, which it
// requires, and reports whether it holds annotations.
func contentPart(raw []byte) (typ string, text []byte, annotated bool, err error) {
	if !isObject(raw) {
		return "", nil, false, errors.New("content part is not an object")
	}
	var typRaw, textRaw, annotations []byte
	if err := jsonscan.Members(raw, func(name, value []byte) error {
		switch string(jsonscan.Name(name)) {
		case "type":
			typRaw = value
		case "text":
			textRaw = value
		case "annotations":
			annotations = value
		}
		return nil
	}); err != nil {
		return "", nil, false, err
	}
	if typ, err = requiredString(typRaw, "content part type"); err != nil {
		return "", nil, false, err
	}
	switch typ {
	case "input_text", "output_text":
		if text, err = requiredStringJSON(textRaw, "text"); err != nil {
			return "", nil, false, err
		}
	}
	if typ == "output_text" {
		if !isArray(annotations) {
			return "", nil, false, errors.New("output_text annotations is required and must be a list")
		}
		annotated = jsonscan.ArrayElements(annotations, func([]byte) {}) == nil && !emptyArray(annotations)
	}
	return typ, text, annotated, nil
}

func emptyArray(raw []byte) bool {
	empty := true
	_ = jsonscan.ArrayElements(raw, func([]byte) { empty = false })
	return empty
}

// assistantMessage converts an assistant message item: an output message
// (see outputMessage) or else an easy input message, whose text is its
// content as a string or its first input_text part's; it fills the
// content of a preceding assistant message that has none.
func (c *responsesConverter) assistantMessage(it responseItem) (bool, error) {
	text, cont, output, err := outputMessage(it)
	if err != nil {
		return false, err
	}
	if !output {
		if !present(it.content) {
			return false, errors.New("content is required")
		}
		if it.content[0] == '"' {
			if text, err = stringJSON(it.content, "content"); err != nil {
				return false, err
			}
		} else {
			texts, err := inputParts(it.content)
			if err != nil {
				return false, err
			}
			if len(texts) > 0 {
				text = texts[0]
			}
		}
	}
	if text == nil {
		text = emptyJSONString
	}
	if prev := c.prevAssistant(); prev != nil && prev.content == nil {
		prev.content = text
		return cont, nil
	}
	c.msgs = append(c.msgs, chatMessage{role: "assistant", content: text})
	return cont, nil
}

// outputMessage reads an assistant message item as an output message,
// reporting false when it is not one: an item of type message whose
// content is a list of output_text and refusal parts. With an id and a
// status it is vLLM's ResponseOutputMessage, which fails on a first part
// that is a refusal; without either it is the output message param, read
// as a dict, whose text is then "". The text is a JSON string, nil for "".
func outputMessage(it responseItem) (text []byte, cont, output bool, err error) {
	if !it.typed || !isArray(it.content) {
		return nil, false, false, nil
	}
	status, serr := itemStatus(it.status)
	idOK := it.id == nil || present(it.id) && it.id[0] == '"'
	statusOK := serr == nil && (it.status == nil || status != "")
	if !idOK || !statusOK {
		return nil, false, false, nil
	}
	model := it.id != nil && it.status != nil
	firstRefusal := false
	err = eachElement(it.content, "", func(i int, elem []byte) error {
		typ, t, annotated, err := contentPart(elem)
		switch {
		case err != nil:
			return err
		case typ == "output_text" && annotated:
			return notReproducible("an output_text part with annotations")
		case typ == "output_text":
			if i == 0 {
				text = t
			}
		case typ == "refusal":
			firstRefusal = firstRefusal || i == 0
		default:
			return errNotOutput
		}
		return nil
	})
	switch {
	case errors.Is(err, errNotOutput):
		return nil, false, false, nil
	case err != nil:
		return nil, false, false, err
	case firstRefusal && model:
		return nil, false, false, errors.New("an output message starting with a refusal, which vLLM fails on")
	}
	return text, continues(status), true, nil
}

// errNotOutput marks a content part no output message holds.
var errNotOutput = errors.New("not an output message part")

// prevAssistant returns the last message when it is an assistant's.
func (c *responsesConverter) prevAssistant() *chatMessage {
	if n := len(c.msgs); n > 0 && c.msgs[n-1].role == "assistant" {
		return &c.msgs[n-1]
	}
	return nil
}

// functionCall converts a function_call item (ResponseFunctionToolCall)
// into a tool call, added to the preceding assistant message if any.
func (c *responsesConverter) functionCall(it responseItem) error {
	args, err := requiredStringJSON(it.arguments, "arguments")
	if err != nil {
		return err
	}
	callID, err := requiredString(it.callID, "call_id")
	if err != nil {
		return err
	}
	name, err := requiredString(it.name, "name")
	if err != nil {
		return err
	}
	if err := checkIDAndStatus(it); err != nil {
		return err
	}
	namespace, err := stringField(it.namespace, "namespace")
	if err != nil {
		return err
	}
	if namespace != "" {
		name = namespace + namespaceSeparator + name
	}
	call := appendToolCall(nil, callID, name, args)
	if prev := c.prevAssistant(); prev != nil {
		if prev.toolCalls != nil {
			prev.toolCalls = append(prev.toolCalls, ',')
		}
		prev.toolCalls = append(prev.toolCalls, call...)
		return nil
	}
	c.msgs = append(c.msgs, chatMessage{role: "assistant", toolCalls: call})
	return nil
}

// functionCallOutput converts a function_call_output item into a tool
// message.
func (c *responsesConverter) functionCallOutput(it responseItem) error {
	callID, err := requiredString(it.callID, "call_id")
	if err != nil {
		return err
	}
	if err := checkIDAndStatus(it); err != nil {
		return err
	}
	var content []byte
	switch {
	case !present(it.output):
		return errors.New("output is required")
	case it.output[0] == '"':
		if content, err = stringJSON(it.output, "output"); err != nil {
			return err
		}
	default:
		texts, err := inputParts(it.output)
		if err != nil {
			return fmt.Errorf("output: %w", err)
		}
		content = appendTextParts(nil, texts)
	}
	c.msgs = append(c.msgs, chatMessage{role: "tool", toolCallID: &callID, content: content})
	return nil
}

// reasoning converts a reasoning item (ResponseReasoningItem) into an
// assistant's reasoning, added to the preceding assistant message when it
// has none.
func (c *responsesConverter) reasoning(it responseItem) (bool, error) {
	if it.id == nil {
		return false, notReproducible("a reasoning item without an id, which vLLM versions refuse or read otherwise")
	}
	if _, err := requiredString(it.id, "id"); err != nil {
		return false, err
	}
	status, err := itemStatus(it.status)
	if err != nil {
		return false, err
	}
	encrypted, err := stringField(it.encryptedContent, "encrypted_content")
	if err != nil {
		return false, err
	}
	if !isArray(it.summary) {
		return false, errors.New("summary is required and must be a list")
	}
	summary, err := reasoningTexts(it.summary, "summary_text")
	if err != nil {
		return false, fmt.Errorf("summary: %w", err)
	}
	var content [][]byte
	if present(it.content) {
		if !isArray(it.content) {
			return false, errors.New("content is not a list")
		}
		if content, err = reasoningTexts(it.content, "reasoning_text"); err != nil {
			return false, fmt.Errorf("content: %w", err)
		}
	}
	if encrypted != "" {
		return false, errors.New("a reasoning item with encrypted_content, which vLLM does not read")
	}
	text := emptyJSONString
	switch {
	case len(content) > 0:
		text = content[0]
	case len(summary) > 0:
		text = summary[0]
	}
	if prev := c.prevAssistant(); prev != nil && prev.reasoning == nil {
		prev.reasoning = text
		return continues(status), nil
	}
	c.msgs = append(c.msgs, chatMessage{role: "assistant", reasoning: text})
	return continues(status), nil
}

// reasoningTexts returns the texts of a reasoning item's summary or
// content parts, each of type typ, as JSON strings.
func reasoningTexts(raw []byte, typ string) ([][]byte, error) {
	var texts [][]byte
	err := eachElement(raw, "", func(_ int, elem []byte) error {
		typRaw, textRaw, err := typeAnd(elem, "part", "text")
		if err != nil {
			return err
		}
		if t, err := requiredString(typRaw, "type"); err != nil || t != typ {
			return fmt.Errorf("part type is not %s", typ)
		}
		t, err := requiredStringJSON(textRaw, "text")
		if err != nil {
			return err
		}
		texts = append(texts, t)
		return nil
	})
	return texts, err
}

// tools returns the OpenAI function tools of the request's tools
// (construct_tool_dicts), nil when it has none, refusing to write more
// than budget bytes.
func tools(raw []byte, budget int) ([]byte, error) {
	if raw == nil {
		return nil, nil
	}
	if !isArray(raw) {
		return nil, errors.New("tools is not a list")
	}
	if emptyArray(raw) {
		return nil, nil
	}
	out := []byte{'['}
	if err := eachElement(raw, "tools", func(_ int, elem []byte) (err error) {
		out, err = appendResponsesTool(out, elem, budget)
		return err
	}); err != nil {
		return nil, err
	}
	return append(out, ']'), nil
}

// appendResponsesTool appends the function tools of one Responses tool to
// out, an array being written, refusing to let it grow beyond budget bytes.
func appendResponsesTool(out, raw []byte, budget int) ([]byte, error) {
	if !isObject(raw) {
		return nil, errors.New("tool is not an object")
	}
	var typRaw, nameRaw, descRaw, toolsRaw []byte
	if err := jsonscan.Members(raw, func(name, value []byte) error {
		switch string(jsonscan.Name(name)) {
		case "type":
			typRaw = value
		case "name":
			nameRaw = value
		case "description":
			descRaw = value
		case "tools":
			toolsRaw = value
		}
		return nil
	}); err != nil {
		return nil, err
	}
	typ, err := requiredString(typRaw, "type")
	if err != nil {
		return nil, err
	}
	switch typ {
	case "function":
		return appendFunctionTool(out, raw, "", budget)
	case "namespace":
	case "tool_search":
		return nil, notReproducible("a tool_search tool, which vLLM versions render differently")
	default:
		// Built-in and custom tools are not rendered.
		return out, nil
	}
	namespace, err := requiredString(nameRaw, "name")
	if err != nil {
		return nil, err
	}
	if _, err := requiredString(descRaw, "description"); err != nil {
		return nil, err
	}
	if !isArray(toolsRaw) {
		return nil, errors.New("a namespace's tools is required and must be a list")
	}
	if err := eachElement(toolsRaw, "tools", func(_ int, elem []byte) error {
		innerType, innerName, err := typeAnd(elem, "tool", "name")
		if err != nil {
			return err
		}
		t, err := requiredString(innerType, "type")
		if err != nil {
			return err
		}
		switch t {
		case "function":
			out, err = appendFunctionTool(out, elem, namespace, budget)
			return err
		case "custom":
			_, err = requiredString(innerName, "name")
			return err
		}
		return fmt.Errorf("a namespace's tool of type %q is neither function nor custom", t)
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// functionToolMembers are the members of a function tool vLLM's models
// know; it passes any other to the template as it is.
var functionToolMembers = map[string]bool{
	"type": true, "name": true, "description": true, "parameters": true, "strict": true, "defer_loading": true,
}

// appendFunctionTool appends the OpenAI function tool of a function tool,
// or of a namespace's function when namespace is not empty: name,
// description, parameters, strict and defer_loading, absent ones null.
func appendFunctionTool(out, raw []byte, namespace string, budget int) ([]byte, error) {
	var name, desc, params, strict, deferLoading []byte
	var unknown string
	if err := jsonscan.Members(raw, func(n, value []byte) error {
		switch key := string(jsonscan.Name(n)); key {
		case "name":
			name = value
		case "description":
			desc = value
		case "parameters":
			params = value
		case "strict":
			strict = value
		case "defer_loading":
			deferLoading = value
		default:
			if !functionToolMembers[key] && unknown == "" {
				unknown = key
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	toolName, err := requiredString(name, "name")
	if err != nil {
		return nil, err
	}
	if namespace != "" {
		toolName = namespace + namespaceSeparator + toolName
	}
	if unknown != "" {
		return nil, notReproducible("a function tool member %q, passed to the template as it is", unknown)
	}
	if len(out) > 1 {
		out = append(out, ',')
	}
	if out, err = appendFunctionHead(out, toolName, desc, requiredString); err != nil {
		return nil, err
	}
	out = append(out, `,"parameters":`...)
	switch {
	case !present(params):
		out = append(out, "null"...)
	case !isObject(params):
		return nil, errors.New("parameters is not an object")
	default:
		if out, err = appendPyDumps(out, params); err != nil {
			return nil, fmt.Errorf("parameters: %w", err)
		}
	}
	if out, err = appendBoolMember(out, "strict", strict); err != nil {
		return nil, err
	}
	if out, err = appendBoolMember(out, "defer_loading", deferLoading); err != nil {
		return nil, err
	}
	out = append(out, '}', '}')
	if len(out) > budget {
		return nil, notReproducible("tools that would take more than five times the body's size")
	}
	return out, nil
}
