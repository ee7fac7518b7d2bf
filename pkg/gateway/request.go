package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// kind is the OpenAI endpoint a request came to.
type kind uint8

const (
	kindCompletion kind = iota
	kindChat
	// kindMessages is Anthropic's Messages API (POST /v1/messages), which
	// vLLM serves by converting the body into a chat: its prompt is that
	// chat's, and its response is in Anthropic's shapes.
	kindMessages
	// kindResponses is OpenAI's Responses API (POST /v1/responses), which
	// vLLM serves, for models other than gpt-oss, by converting the body
	// into a chat: its prompt is that chat's, and its response is in the
	// Responses API's shapes.
	kindResponses
	// kindModel is any other endpoint whose JSON body names its model
	// (modelPaths): the gateway reads the model alone, neither a prompt nor
	// the response's usage, and routes the request on load alone.
	kindModel
	// kindStored is a request for a Responses API response an engine
	// stored (GET /v1/responses/{id}, POST /v1/responses/{id}/cancel):
	// it names no model, and goes to the engine that made the response
	// (see storedResponses), its body and response passed on unread.
	kindStored
)

// generates reports whether requests of kind k are completions whose
// prompt the gateway reads: their algorithm may tokenize them, an
// SLO-aware one queue them, and their responses' usage is read.
func (k kind) generates() bool { return k < kindModel }

// converted reports whether vLLM converts the bodies of requests of kind
// k into chats (Anthropic's Messages and OpenAI's Responses): the gateway
// reads their model, stream and output bound alone, and their prompt from
// the chat the whole body converts into (see convertedBody).
func (k kind) converted() bool { return k == kindMessages || k == kindResponses }

// streamFields are the fields of an OpenAI body that shape a streamed
// response.
type streamFields struct {
	Stream        bool            `json:"stream"`
	StreamOptions json.RawMessage `json:"stream_options"`
}

// completionBody is what the gateway reads of a /v1/completions body.
type completionBody struct {
	tokenizer.CompletionRequest
	streamFields
}

// chatBody is what the gateway reads of a /v1/chat/completions body.
type chatBody struct {
	tokenizer.ChatRequest
	streamFields
}

// convertedBody is what the gateway reads of a body vLLM converts into a
// chat, a /v1/messages or /v1/responses body: the members that route it
// and shape its response (model, stream, and max_tokens or
// max_output_tokens, its bound on the output). Its prompt is read from the
// whole body when it is tokenized (see tokenizer.ChatFromAnthropic and
// tokenizer.ChatFromResponses). vLLM streams such a request's usage
// whatever the client asked, so stream_options is not read.
type convertedBody struct {
	Model     string
	MaxTokens *int
	streamFields
	// PreviousResponseID is a Responses request's previous_response_id,
	// "" for none: the stored response it continues, which only the
	// engine that made it holds (see storedResponses). NotStored reports
	// a Responses request whose store is false, whose response no engine
	// keeps.
	PreviousResponseID string
	NotStored          bool
	// body is the whole body, which chat is converted from when the
	// prompt is first tokenized.
	body []byte
	chat *tokenizer.ChatRequest
}

// inference is a decoded request body of any kind but kindModel. The body itself is
// forwarded as received, except for stream_options (see withStreamUsage).
// Its JSON values (the prompt, the messages, ...) alias the body decode
// read them from.
type inference struct {
	kind kind
	comp completionBody
	chat chatBody
	conv convertedBody
	// storedID and storedLabel are, for a request of kindStored, the
	// response it asks for and its endpoint label.
	storedID, storedLabel string
}

// errNotObject reports a body that is valid JSON but not an object.
var errNotObject = errors.New("the request body must be a JSON object")

// typeError reports a member of the body whose value has the wrong type.
type typeError struct {
	field, want, got string
}

func (e *typeError) Error() string {
	return fmt.Sprintf("%q must be %s, not %s", e.field, e.want, e.got)
}

// decode reads body, which must be a JSON object, into in. It reads only
// the members that route the request, shape its response or tokenize its
// prompt (of a Messages body: model, max_tokens and stream; of a Responses
// body: model, max_output_tokens, stream, previous_response_id and store;
// the prompt of either is converted from the whole body when it is
// tokenized), by hand (package jsonscan), checking the whole body's syntax
// as encoding/json would; values it does not read are skipped, not decoded.
// Member names match exactly, as in vLLM, and the last of a repeated name
// wins, a last null included.
//
// Each member is read as vLLM reads it: vLLM validates a request with
// pydantic in its lax mode, so an integer member (max_tokens,
// max_completion_tokens, max_output_tokens, truncate_prompt_tokens) may
// also be a whole number written as a float (100.0, 1e3), a string holding
// an integer ("100"), true or false (see jsonscan.LaxInt), and a boolean
// member (stream, store, add_special_tokens, add_generation_prompt,
// continue_final_message) the numbers 0 and 1 or a string such as "true",
// "0" or "no" in any case (see jsonscan.LaxBool). null reads as absent,
// but for store, which vLLM then reads as false. String members (model,
// previous_response_id, chat_template, truncation_side, reasoning_effort)
// must be strings or null, as in vLLM. A value that no such reading
// accepts, which vLLM refuses too, fails with a *typeError: the gateway
// never routes on a reading the engine would not make. The body is
// forwarded as the client wrote it, values included.
func (in *inference) decode(k kind, body []byte) error {
	in.kind = k
	in.comp, in.chat, in.conv = completionBody{}, chatBody{}, convertedBody{}
	if i := jsonscan.SkipSpace(body, 0); i < len(body) && body[i] != '{' {
		if end, err := jsonscan.SkipValue(body, i); err == nil && jsonscan.Trailing(body, end) == nil {
			return errNotObject
		}
	}
	if k.converted() {
		in.conv.body = body
	}
	return jsonscan.Members(body, func(name, value []byte) error {
		switch k {
		case kindChat:
			return in.chat.member(jsonscan.Name(name), value)
		case kindMessages:
			return in.conv.member(jsonscan.Name(name), value, "max_tokens")
		case kindResponses:
			return in.conv.responsesMember(jsonscan.Name(name), value)
		}
		return in.comp.member(jsonscan.Name(name), value)
	})
}

// member decodes one member of a /v1/completions body.
func (b *completionBody) member(name, value []byte) error {
	r := &b.CompletionRequest
	switch string(name) {
	case "model":
		return decodeString(name, value, &r.Model)
	case "prompt":
		r.Prompt = value
	case "add_special_tokens":
		return decodeOptBool(name, value, &r.AddSpecialTokens)
	case "truncate_prompt_tokens":
		return decodeOptInt(name, value, &r.TruncatePromptTokens)
	case "truncation_side":
		return decodeString(name, value, &r.TruncationSide)
	case "max_tokens":
		return decodeOptInt(name, value, &r.MaxTokens)
	default:
		return b.streamFields.member(name, value)
	}
	return nil
}

// member decodes one member of a /v1/chat/completions body.
func (b *chatBody) member(name, value []byte) error {
	r := &b.ChatRequest
	switch string(name) {
	case "model":
		return decodeString(name, value, &r.Model)
	case "messages":
		r.Messages = value
	case "tools":
		r.Tools = value
	case "documents":
		r.Documents = value
	case "chat_template":
		return decodeString(name, value, &r.ChatTemplate)
	case "chat_template_kwargs":
		r.ChatTemplateKwargs = value
	case "reasoning_effort":
		return decodeString(name, value, &r.ReasoningEffort)
	case "add_generation_prompt":
		return decodeOptBool(name, value, &r.AddGenerationPrompt)
	case "continue_final_message":
		return decodeOptBool(name, value, &r.ContinueFinalMessage)
	case "add_special_tokens":
		return decodeOptBool(name, value, &r.AddSpecialTokens)
	case "mm_processor_kwargs":
		r.MMProcessorKwargs = value
	case "media_io_kwargs":
		r.MediaIOKwargs = value
	case "truncate_prompt_tokens":
		return decodeOptInt(name, value, &r.TruncatePromptTokens)
	case "truncation_side":
		return decodeString(name, value, &r.TruncationSide)
	case "max_tokens":
		return decodeOptInt(name, value, &r.MaxTokens)
	case "max_completion_tokens":
		return decodeOptInt(name, value, &r.MaxCompletionTokens)
	default:
		return b.streamFields.member(name, value)
	}
	return nil
}

// member decodes one member of a converted body, whose bound on the
// output is the member named maxTokens.
func (b *convertedBody) member(name, value []byte, maxTokens string) error {
	switch string(name) {
	case "model":
		return decodeString(name, value, &b.Model)
	case maxTokens:
		return decodeOptInt(name, value, &b.MaxTokens)
	case "stream":
		return b.streamFields.member(name, value)
	}
	return nil
}

// responsesMember decodes one member of a Responses body.
func (b *convertedBody) responsesMember(name, value []byte) error {
	switch string(name) {
	case "previous_response_id":
		return decodeString(name, value, &b.PreviousResponseID)
	case "store":
		// vLLM keeps the response when store is true, its default: a
		// null, which its request model accepts, keeps none.
		v, null, err := jsonscan.LaxBool(value)
		if err != nil {
			return wrongType(name, "a boolean", value)
		}
		b.NotStored = null || !v
		return nil
	}
	return b.member(name, value, "max_output_tokens")
}

// member decodes one member of any body that shapes a stream.
func (s *streamFields) member(name, value []byte) error {
	switch string(name) {
	case "stream":
		v, _, err := jsonscan.LaxBool(value)
		if err != nil {
			return wrongType(name, "a boolean", value)
		}
		s.Stream = v
	case "stream_options":
		s.StreamOptions = value
	}
	return nil
}

// jsonKind names the type of a JSON value by its first byte.
func jsonKind(value []byte) string {
	switch value[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

func wrongType(name []byte, want string, value []byte) error {
	return &typeError{field: string(name), want: want, got: jsonKind(value)}
}

func decodeString(name, value []byte, dst *string) error {
	if value[0] != '"' && value[0] != 'n' {
		return wrongType(name, "a string", value)
	}
	s, err := jsonscan.String(value)
	if err != nil {
		return wrongType(name, "a string", value)
	}
	*dst = s
	return nil
}

func decodeOptBool(name, value []byte, dst **bool) error {
	v, null, err := jsonscan.LaxBool(value)
	switch {
	case err != nil:
		return wrongType(name, "a boolean", value)
	case null:
		*dst = nil
	default:
		*dst = &v
	}
	return nil
}

func decodeOptInt(name, value []byte, dst **int) error {
	n, null, err := jsonscan.LaxInt(value)
	switch {
	case err != nil:
		return wrongType(name, "an integer", value)
	case null:
		*dst = nil
	default:
		*dst = &n
	}
	return nil
}

// model returns the requested model.
func (in *inference) model() string {
	switch in.kind {
	case kindChat:
		return in.chat.Model
	case kindMessages, kindResponses:
		return in.conv.Model
	}
	return in.comp.Model
}

func (in *inference) stream() *streamFields {
	switch in.kind {
	case kindChat:
		return &in.chat.streamFields
	case kindMessages, kindResponses:
		return &in.conv.streamFields
	}
	return &in.comp.streamFields
}

// maxTokens returns the most tokens the request may generate, 0 when it
// does not say.
func (in *inference) maxTokens() int {
	var p *int
	switch in.kind {
	case kindChat:
		p = in.chat.MaxCompletionTokens
		if p == nil {
			p = in.chat.MaxTokens
		}
	case kindMessages, kindResponses:
		p = in.conv.MaxTokens
	default:
		p = in.comp.MaxTokens
	}
	if p == nil || *p < 0 {
		return 0
	}
	return *p
}

// tokenize returns the prompt's token ids, asking the vLLM server at
// baseURL when tk has not cached them. The ids must not be modified. A
// Messages or Responses request is tokenized as the chat vLLM converts it
// into (see tokenizer.ChatFromAnthropic and tokenizer.ChatFromResponses),
// converted once; a body whose conversion fails, or whose prompt cannot be
// reproduced, fails with the conversion's *tokenizer.Error (ReasonInput,
// ReasonUnsupported).
func (in *inference) tokenize(ctx context.Context, tk *tokenizer.Tokenizer, baseURL string) ([]uint32, error) {
	switch in.kind {
	case kindChat:
		return tk.TokenizeChat(ctx, baseURL, &in.chat.ChatRequest)
	case kindMessages, kindResponses:
		if in.conv.chat == nil {
			convert := tokenizer.ChatFromAnthropic
			if in.kind == kindResponses {
				convert = tokenizer.ChatFromResponses
			}
			chat, err := convert(in.conv.body)
			if err != nil {
				return nil, err
			}
			in.conv.chat = chat
		}
		return tk.TokenizeChat(ctx, baseURL, in.conv.chat)
	}
	return tk.TokenizeCompletion(ctx, baseURL, &in.comp.CompletionRequest)
}

// clientWantsUsage reports whether a streamed request asks for the usage
// chunk itself, as vLLM reads stream_options: an object whose
// include_usage is absent (vLLM's default is true) or reads as true (see
// jsonscan.LaxBool); null reads as false. It fails when include_usage or
// continuous_usage_stats does not read as a boolean, which the engine
// would refuse.
func (s *streamFields) clientWantsUsage() (bool, error) {
	if len(s.StreamOptions) == 0 || s.StreamOptions[0] != '{' {
		return false, nil
	}
	wants := true
	err := jsonscan.Members(s.StreamOptions, func(name, value []byte) error {
		switch n := string(jsonscan.Name(name)); n {
		case "include_usage", "continuous_usage_stats":
			v, _, err := jsonscan.LaxBool(value)
			if err != nil {
				return &typeError{field: "stream_options." + n, want: "a boolean", got: jsonKind(value)}
			}
			if n == "include_usage" {
				wants = v
			}
		}
		return nil
	})
	return wants && err == nil, err
}

// usageOption is the stream_options member the gateway adds to a streamed
// request whose client did not ask for usage.
const usageOption = `"stream_options":{"include_usage":true}`

// withStreamUsage writes to dst the body of a streamed request that asks
// the engine for the usage chunk, and returns it. A body without
// stream_options gets the member inserted as its first, leaving every other
// byte as sent; a body with stream_options is re-encoded with
// include_usage set, and with continuous_usage_stats off, since the client
// asked for no usage at all.
func withStreamUsage(dst *bytes.Buffer, body []byte, opts json.RawMessage) ([]byte, error) {
	dst.Reset()
	if len(opts) == 0 {
		i := jsonscan.SkipSpace(body, 0)
		dst.Grow(len(body) + len(usageOption) + 1)
		dst.Write(body[:i+1])
		dst.WriteString(usageOption)
		if j := jsonscan.SkipSpace(body, i+1); j < len(body) && body[j] != '}' {
			dst.WriteByte(',')
		}
		dst.Write(body[i+1:])
		return dst.Bytes(), nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, err
	}
	var so map[string]json.RawMessage
	if err := json.Unmarshal(opts, &so); err != nil {
		return nil, fmt.Errorf("stream_options: %w", err)
	}
	if so == nil {
		so = map[string]json.RawMessage{}
	}
	so["include_usage"] = json.RawMessage("true")
	if _, ok := so["continuous_usage_stats"]; ok {
		so["continuous_usage_stats"] = json.RawMessage("false")
	}
	var err error
	if fields["stream_options"], err = json.Marshal(so); err != nil {
		return nil, err
	}
	out, err := json.Marshal(fields)
	if err != nil {
		return nil, err
	}
	dst.Write(out)
	return dst.Bytes(), nil
}

// jsonError describes a decoding error for the client.
func jsonError(err error) string {
	var syn *json.SyntaxError
	var scan *jsonscan.Error
	var typ *json.UnmarshalTypeError
	var field *typeError
	var unknown *unknownFieldError
	switch {
	case errors.Is(err, errNotObject):
		return err.Error()
	case errors.As(err, &scan):
		return fmt.Sprintf("the request body is not valid JSON: %s (at byte %d)", scan.Msg, scan.Offset)
	case errors.As(err, &syn):
		return fmt.Sprintf("the request body is not valid JSON: %v (at byte %d)", syn, syn.Offset)
	case errors.As(err, &field):
		return "the request body has a field of the wrong type: " + field.Error()
	case errors.As(err, &unknown):
		return "the request body has an " + unknown.Error()
	case errors.As(err, &typ):
		return fmt.Sprintf("the request body has a field of the wrong type: %q must be %s, not %s", typ.Field, typ.Type, typ.Value)
	}
	return "the request body cannot be decoded: " + err.Error()
}
