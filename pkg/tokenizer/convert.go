package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
)

// The helpers below serve the conversions of request bodies of other APIs
// (ChatFromAnthropic, ChatFromResponses) into the chat vLLM renders for
// them, where the two read or write alike.

// conversionError returns err, met converting a request body of api for
// model, as an *Error: ReasonUnsupported when it wraps errNotReproducible,
// else ReasonInput. Its message starts with "<api> request: ".
func conversionError(model, api string, err error) error {
	err = fmt.Errorf("%s request: %w", api, err)
	if errors.Is(err, errNotReproducible) {
		return unsupportedError(model, err)
	}
	return inputError(model, err)
}

// bodyMembers calls fn with the name and value of each member of body, as
// jsonscan.Members does, but fails first unless body is valid UTF-8 and
// valid JSON, as json.Valid checks it. A body jsonscan reads whole is
// valid JSON (it checks the same grammar, only to a lesser depth), so
// that json.Valid is asked only about a body jsonscan refuses, to tell
// an invalid body from one that is not an object or nests too deep.
func bodyMembers(body []byte, fn func(name, value []byte) error) error {
	err := jsonscan.Members(body, fn)
	if !utf8.Valid(body) || err != nil && !json.Valid(body) {
		return errors.New("the body is not valid JSON")
	}
	return err
}

// requestModel decodes the model member, which must be a non-empty string.
func requestModel(raw []byte) (string, error) {
	model, err := stringField(raw, "model")
	if err != nil {
		return "", err
	}
	if model == "" {
		return "", errors.New("model is required")
	}
	return model, nil
}

// chatTemplateKwargs returns the chat_template_kwargs member, an object
// that may be absent or null (nil then), as Python's json.dumps writes it.
func chatTemplateKwargs(raw []byte) (json.RawMessage, error) {
	if !present(raw) {
		return nil, nil
	}
	if !isObject(raw) {
		return nil, errors.New("chat_template_kwargs is not an object")
	}
	out, err := appendPyDumps(nil, raw)
	if err != nil {
		return nil, fmt.Errorf("chat_template_kwargs: %w", err)
	}
	return out, nil
}

// stringJSON returns the JSON string appendJSONString writes for the
// string member raw, read as stringField reads it ("" when absent or
// null), failing as stringField does. raw is a value jsonscan read from a
// body bodyMembers accepted, so that a string is valid JSON and UTF-8: one
// without escapes, which then holds no quote, backslash or control
// character, is what appendJSONString writes for its text and is returned
// as written, sharing raw's bytes (the caller copies it before returning
// it).
func stringJSON(raw []byte, what string) ([]byte, error) {
	if present(raw) && raw[0] == '"' && bytes.IndexByte(raw, '\\') < 0 {
		return raw[:len(raw):len(raw)], nil
	}
	s, err := stringField(raw, what)
	if err != nil {
		return nil, err
	}
	return appendJSONString(nil, s), nil
}

// requiredStringJSON is stringJSON for a member that must be a string,
// failing as requiredString does.
func requiredStringJSON(raw []byte, what string) ([]byte, error) {
	if !present(raw) || raw[0] != '"' {
		return nil, fmt.Errorf("%s is required and must be a string", what)
	}
	return stringJSON(raw, what)
}

// jsonInner returns what JSON string s, as appendJSONString writes it,
// holds between its quotes; since appendJSONString escapes byte by byte,
// the inners of the strings of a and b make that of a+b.
func jsonInner(s []byte) []byte { return s[1 : len(s)-1] }

// emptyJSONString is the JSON string "".
var emptyJSONString = []byte(`""`)[:2:2]

// stringMember decodes the string member named member of raw, the value of
// the member named object: an object, or absent or null, which gives "".
// ok reports whether the member is there and not null.
func stringMember(raw []byte, object, member string) (s string, ok bool, err error) {
	if !present(raw) {
		return "", false, nil
	}
	if !isObject(raw) {
		return "", false, fmt.Errorf("%s is not an object", object)
	}
	var v []byte
	if err := jsonscan.Members(raw, func(name, value []byte) error {
		if string(jsonscan.Name(name)) == member {
			v = value
		}
		return nil
	}); err != nil {
		return "", false, err
	}
	if s, err = stringField(v, object+"."+member); err != nil {
		return "", false, err
	}
	return s, present(v), nil
}

// typeAnd returns the values of raw's members type and member, nil when
// absent (the last, when one is named twice); raw must be an object, what
// names it in the error when it is not.
func typeAnd(raw []byte, what, member string) (typ, value []byte, err error) {
	if !isObject(raw) {
		return nil, nil, fmt.Errorf("%s is not an object", what)
	}
	return jsonscan.TypeAnd(raw, member)
}

// eachElement calls fn with each element of raw, a JSON array, and its
// index, until fn fails. When label is not empty, fn's error is returned
// as "<label>[<index>]: <error>"; an error reading raw comes first.
func eachElement(raw []byte, label string, fn func(i int, elem []byte) error) error {
	var ferr error
	i := 0
	err := jsonscan.ArrayElements(raw, func(elem []byte) {
		if ferr == nil {
			if ferr = fn(i, elem); ferr != nil && label != "" {
				ferr = fmt.Errorf("%s[%d]: %w", label, i, ferr)
			}
		}
		i++
	})
	if err != nil {
		return err
	}
	return ferr
}

// appendTextParts appends a JSON array of the chat text parts
// {"type":"text","text":...} of texts, JSON strings, in order.
func appendTextParts(out []byte, texts [][]byte) []byte {
	n := 2
	for _, t := range texts {
		n += len(`{"type":"text","text":""},`) + len(t)
	}
	out = slices.Grow(out, n)
	out = append(out, '[')
	for i, t := range texts {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"type":"text","text":`...)
		out = append(out, t...)
		out = append(out, '}')
	}
	return append(out, ']')
}

// appendToolCall appends the chat tool call {"id","type":"function",
// "function":{"name","arguments"}}, arguments a JSON string.
func appendToolCall(out []byte, id, name string, arguments []byte) []byte {
	out = slices.Grow(out, len(`{"id":"","type":"function","function":{"name":"","arguments":""}}`)+len(id)+len(name)+len(arguments))
	out = append(out, `{"id":`...)
	out = appendJSONString(out, id)
	out = append(out, `,"type":"function","function":{"name":`...)
	out = appendJSONString(out, name)
	out = append(out, `,"arguments":`...)
	out = append(out, arguments...)
	return append(out, '}', '}')
}

// appendFunctionHead opens an OpenAI function tool named name, up to its
// description: {"type":"function","function":{"name":...,"description":...
// The description is desc decoded by decode, or null when desc is absent
// or null.
func appendFunctionHead(out []byte, name string, desc []byte, decode func(raw []byte, what string) (string, error)) ([]byte, error) {
	out = append(out, `{"type":"function","function":{"name":`...)
	out = appendJSONString(out, name)
	out = append(out, `,"description":`...)
	if !present(desc) {
		return append(out, "null"...), nil
	}
	d, err := decode(desc, "description")
	if err != nil {
		return nil, err
	}
	return appendJSONString(out, d), nil
}

// appendBoolMember appends the member ,"<name>":<raw read as pydantic reads
// a bool>, null when raw is absent or null.
func appendBoolMember(out []byte, name string, raw []byte) ([]byte, error) {
	out = append(out, ',', '"')
	out = append(out, name...)
	out = append(out, '"', ':')
	if raw == nil {
		return append(out, "null"...), nil
	}
	switch v, null, err := jsonscan.LaxBool(raw); {
	case null:
		return append(out, "null"...), nil
	case err != nil:
		return nil, fmt.Errorf("%s: %w", name, err)
	default:
		return append(out, jsonBool(v)...), nil
	}
}

// chatMessage is one chat message being built; a conversion may change it
// (merging later items into it) until the next message starts. Its
// content and reasoning may share the body's bytes: they are replaced,
// never appended to, and copied into the result.
type chatMessage struct {
	role       string
	content    []byte // a JSON string or array, nil when absent
	reasoning  []byte // a JSON string, nil when absent
	toolCalls  []byte // the tool_calls array's elements, nil when absent
	toolCallID *string
}

// appendChatMessages appends msgs as a JSON array of chat messages, each
// {"role","tool_call_id","reasoning","tool_calls","content"} in that order,
// its absent members left out.
func appendChatMessages(out []byte, msgs []chatMessage) []byte {
	out = slices.Grow(out, chatMessagesSize(msgs))
	out = append(out, '[')
	for i, m := range msgs {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"role":`...)
		out = appendJSONString(out, m.role)
		if m.toolCallID != nil {
			out = append(out, `,"tool_call_id":`...)
			out = appendJSONString(out, *m.toolCallID)
		}
		if m.reasoning != nil {
			out = append(out, `,"reasoning":`...)
			out = append(out, m.reasoning...)
		}
		if m.toolCalls != nil {
			out = append(out, `,"tool_calls":[`...)
			out = append(out, m.toolCalls...)
			out = append(out, ']')
		}
		if m.content != nil {
			out = append(out, `,"content":`...)
			out = append(out, m.content...)
		}
		out = append(out, '}')
	}
	return append(out, ']')
}

// chatMessagesSize returns the bytes appendChatMessages writes for msgs
// when their strings need no escapes, so that its buffer is allocated
// once.
func chatMessagesSize(msgs []chatMessage) int {
	n := 2
	for _, m := range msgs {
		n += len(`{"role":"","tool_call_id":"","reasoning":"","tool_calls":[],"content":},`) +
			len(m.role) + len(m.content) + len(m.toolCalls) + len(m.reasoning)
		if m.toolCallID != nil {
			n += len(*m.toolCallID)
		}
	}
	return n
}
