package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// kind is the OpenAI endpoint a request came to.
type kind uint8

const (
	kindCompletion kind = iota
	kindChat
)

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

// inference is a decoded request body of either kind. The body itself is
// forwarded as received, except for stream_options (see withStreamUsage).
type inference struct {
	kind kind
	comp completionBody
	chat chatBody
}

// errNotObject reports a body that is valid JSON but not an object.
var errNotObject = errors.New("the request body must be a JSON object")

// decode reads body, which must be a JSON object, into in.
func (in *inference) decode(k kind, body []byte) error {
	in.kind = k
	in.comp, in.chat = completionBody{}, chatBody{}
	if i := firstNonSpace(body); i < 0 || body[i] != '{' {
		if json.Valid(body) {
			return errNotObject
		}
	}
	var err error
	if k == kindChat {
		err = json.Unmarshal(body, &in.chat)
	} else {
		err = json.Unmarshal(body, &in.comp)
	}
	return err
}

// model returns the requested model.
func (in *inference) model() string {
	if in.kind == kindChat {
		return in.chat.Model
	}
	return in.comp.Model
}

func (in *inference) stream() *streamFields {
	if in.kind == kindChat {
		return &in.chat.streamFields
	}
	return &in.comp.streamFields
}

// maxTokens returns the most tokens the request may generate, 0 when it
// does not say.
func (in *inference) maxTokens() int {
	var p *int
	if in.kind == kindChat {
		p = in.chat.MaxCompletionTokens
		if p == nil {
			p = in.chat.MaxTokens
		}
	} else {
		p = in.comp.MaxTokens
	}
	if p == nil || *p < 0 {
		return 0
	}
	return *p
}

// tokenize returns the prompt's token ids, asking the vLLM server at
// baseURL when tk has not cached them. The ids must not be modified.
func (in *inference) tokenize(ctx context.Context, tk *tokenizer.Tokenizer, baseURL string) ([]uint32, error) {
	if in.kind == kindChat {
		return tk.TokenizeChat(ctx, baseURL, &in.chat.ChatRequest)
	}
	return tk.TokenizeCompletion(ctx, baseURL, &in.comp.CompletionRequest)
}

// clientWantsUsage reports whether a streamed request asks for the usage
// chunk itself (stream_options.include_usage true).
func (s *streamFields) clientWantsUsage() bool {
	var opts struct {
		IncludeUsage bool `json:"include_usage"`
	}
	if len(s.StreamOptions) == 0 || json.Unmarshal(s.StreamOptions, &opts) != nil {
		return false
	}
	return opts.IncludeUsage
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
		i := firstNonSpace(body)
		dst.Grow(len(body) + len(usageOption) + 1)
		dst.Write(body[:i+1])
		dst.WriteString(usageOption)
		if j := firstNonSpace(body[i+1:]); j >= 0 && body[i+1+j] != '}' {
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

// firstNonSpace returns the index of b's first byte that is not JSON white
// space, -1 when there is none.
func firstNonSpace(b []byte) int {
	for i, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r':
		default:
			return i
		}
	}
	return -1
}

// jsonError describes a decoding error for the client.
func jsonError(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, errNotObject):
		return err.Error()
	case errors.As(err, &syn):
		return fmt.Sprintf("the request body is not valid JSON: %v (at byte %d)", syn, syn.Offset)
	case errors.As(err, &typ):
		return fmt.Sprintf("the request body has a field of the wrong type: %q must be %s, not %s", typ.Field, typ.Type, typ.Value)
	}
	return "the request body cannot be decoded: " + err.Error()
}
