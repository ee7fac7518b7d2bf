package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/kvgate/kvgate/pkg/internal/chatkwargs"
	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
)

// CompletionRequest holds the fields of an OpenAI /v1/completions body that
// decide the prompt's token ids. The JSON tags are the body's, so a gateway
// can decode the body straight into it, or into a struct that embeds it.
type CompletionRequest struct {
	// Model names the served model or LoRA adapter; vLLM tokenizes with the
	// adapter's own tokenizer when it has one.
	Model string `json:"model"`
	// Prompt is the "prompt" value as sent: a string, a list holding one
	// string, a list of token ids, or a list holding one list of token ids.
	// Token ids are returned as they are, without a call. A list of several
	// prompts is refused with ErrMultiplePrompts.
	Prompt json.RawMessage `json:"prompt"`
	// AddSpecialTokens is vLLM's add_special_tokens; nil means true, vLLM's
	// default for completions.
	AddSpecialTokens *bool `json:"add_special_tokens,omitempty"`
	// TruncatePromptTokens, TruncationSide and MaxTokens are vLLM's
	// truncation fields; see Truncation in the package documentation.
	TruncatePromptTokens *int   `json:"truncate_prompt_tokens,omitempty"`
	TruncationSide       string `json:"truncation_side,omitempty"`
	MaxTokens            *int   `json:"max_tokens,omitempty"`
}

// ChatRequest holds the fields of an OpenAI /v1/chat/completions body that
// change the prompt vLLM renders from the messages, or its token ids. The
// JSON tags are the body's, so a gateway can decode the body straight into
// it, or into a struct that embeds it. JSON values are forwarded to vLLM as
// they are; a field that is absent or null takes vLLM's default.
//
// vLLM's /tokenize takes no documents or reasoning_effort fields, so they
// are passed the way vLLM's chat endpoint passes them to the chat template:
// as chat_template_kwargs entries that override the request's own, with
// enable_thinking set to reasoning_effort != "none" unless
// chat_template_kwargs already sets it. tool_choice and response_format,
// which a few of vLLM's model-specific renderers read, have no /tokenize
// field and are not forwarded. Multimodal content is expanded into
// placeholder tokens by the pod as for generation, which loads the media.
type ChatRequest struct {
	// Model names the served model or LoRA adapter.
	Model string `json:"model"`
	// Messages is the conversation, a JSON array.
	Messages json.RawMessage `json:"messages"`
	// Tools is the JSON array of tools the template may render.
	Tools json.RawMessage `json:"tools,omitempty"`
	// Documents is the JSON array of documents for retrieval-augmented
	// templates.
	Documents json.RawMessage `json:"documents,omitempty"`
	// ChatTemplate replaces the server's chat template when not empty.
	ChatTemplate string `json:"chat_template,omitempty"`
	// ChatTemplateKwargs is the JSON object of extra template variables.
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs,omitempty"`
	// ReasoningEffort is passed to the template when not empty.
	ReasoningEffort string `json:"reasoning_effort,omitempty"`
	// AddGenerationPrompt defaults to true, ContinueFinalMessage and
	// AddSpecialTokens to false, as in vLLM.
	AddGenerationPrompt  *bool `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage *bool `json:"continue_final_message,omitempty"`
	AddSpecialTokens     *bool `json:"add_special_tokens,omitempty"`
	// MMProcessorKwargs and MediaIOKwargs change how multimodal content
	// expands into placeholder tokens.
	MMProcessorKwargs json.RawMessage `json:"mm_processor_kwargs,omitempty"`
	MediaIOKwargs     json.RawMessage `json:"media_io_kwargs,omitempty"`
	// TruncatePromptTokens, TruncationSide, MaxTokens and
	// MaxCompletionTokens are vLLM's truncation fields; see Truncation in
	// the package documentation.
	TruncatePromptTokens *int   `json:"truncate_prompt_tokens,omitempty"`
	TruncationSide       string `json:"truncation_side,omitempty"`
	MaxTokens            *int   `json:"max_tokens,omitempty"`
	MaxCompletionTokens  *int   `json:"max_completion_tokens,omitempty"`
}

// Key forms: the same fields mean different things in the two forms.
const (
	formCompletion byte = 'p'
	formChat       byte = 'c'
)

var jsonNull = []byte("null")

// present reports whether raw holds a JSON value other than null.
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(raw, jsonNull)
}

// value returns raw, or nil when it is absent or null.
func value(raw json.RawMessage) json.RawMessage {
	if present(raw) {
		return raw
	}
	return nil
}

func boolOr(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}

// key returns the cache key of r's text prompt.
func (r *CompletionRequest) key(seed uint64, text json.RawMessage) digest {
	k := keyBuilder{seed: seed}
	k.flags(formCompletion, boolOr(r.AddSpecialTokens, true))
	k.str(r.Model)
	k.raw(text)
	return k.sum()
}

// body returns the /tokenize body for r's text prompt, vLLM's
// TokenizeCompletionRequest. It is written by hand around the prompt, a
// JSON string from a body already decoded and so valid, to spare
// re-encoding a long prompt.
func (r *CompletionRequest) body(text json.RawMessage) ([]byte, error) {
	b := make([]byte, 0, len(text)+len(r.Model)+64)
	b = append(b, '{')
	if r.Model != "" {
		b = appendMember(b, "model", jsonString(r.Model))
	}
	b = appendMember(b, "prompt", text)
	b = appendMember(b, "add_special_tokens", jsonBool(boolOr(r.AddSpecialTokens, true)))
	b[len(b)-1] = '}'
	return b, nil
}

// key returns the cache key of r: a digest of every field that reaches
// vLLM, with defaults applied, so that requests vLLM renders alike share it.
// The messages are chained one by one (see prefixKeys), so that the key
// of a conversation's first k messages is the key a request holding just
// those messages had. With no messages the key is the digest of the other
// fields alone.
func (r *ChatRequest) key(seed uint64) digest {
	base := r.base(seed)
	d := base
	if !r.chainMessages(base, func(k digest) { d = k }) {
		return r.rawKey(base)
	}
	return d
}

// prefixKeys returns the keys of r's proper message prefixes that leave
// out at most len(buf) messages, longest first, in buf: the request with
// all its messages but the last, then all but the last two, and so on. It
// returns none when the messages are not a JSON array.
func (r *ChatRequest) prefixKeys(seed uint64, buf *[maxPrefixMessages]digest) []digest {
	// ring holds the keys of the last len(ring) prefixes chained, the
	// whole chat's included: the key of the first i+1 messages is at
	// i%len(ring).
	var ring [maxPrefixMessages + 1]digest
	n := 0
	if !r.chainMessages(r.base(seed), func(k digest) {
		ring[n%len(ring)] = k
		n++
	}) {
		return nil
	}
	keys := buf[:0]
	for m := n - 1; m >= 1 && len(keys) < len(buf); m-- {
		keys = append(keys, ring[(m-1)%len(ring)])
	}
	return keys
}

// base digests every field of r but the messages.
func (r *ChatRequest) base(seed uint64) digest {
	k := keyBuilder{seed: seed}
	k.flags(formChat,
		boolOr(r.AddGenerationPrompt, true),
		boolOr(r.ContinueFinalMessage, false),
		boolOr(r.AddSpecialTokens, false))
	k.str(r.Model)
	k.raw(value(r.Tools))
	k.raw(value(r.Documents))
	k.str(r.ChatTemplate)
	k.raw(value(r.ChatTemplateKwargs))
	k.str(r.ReasoningEffort)
	k.raw(value(r.MMProcessorKwargs))
	k.raw(value(r.MediaIOKwargs))
	return k.sum()
}

// chainMessages calls each with the key of every message prefix, shortest
// first: the base chained with each message's digest in turn. It reports
// false when the messages are not a JSON array.
func (r *ChatRequest) chainMessages(base digest, each func(digest)) bool {
	d := base
	err := jsonscan.ArrayElements(r.Messages, func(msg []byte) {
		d = d.chain(msg)
		each(d)
	})
	return err == nil
}

// rawKey is the key of messages that are not a JSON array: vLLM refuses
// them, but the refusal is cached like any answer would be.
func (r *ChatRequest) rawKey(base digest) digest {
	return base.chain(r.Messages)
}

// body returns the /tokenize body for r: vLLM's TokenizeChatRequest. It
// is written by hand around the request's JSON values, which came from a
// body already decoded and so are valid, to spare re-encoding the
// messages.
func (r *ChatRequest) body() ([]byte, error) {
	if !present(r.Messages) {
		return nil, errors.New("chat request has no messages")
	}
	if jsonscan.ArrayElements(r.Messages, func([]byte) {}) != nil {
		return nil, errors.New("messages is not a JSON array")
	}
	kwargs, err := r.templateKwargs()
	if err != nil {
		return nil, err
	}
	for _, v := range [][]byte{r.Tools, kwargs, r.MMProcessorKwargs, r.MediaIOKwargs} {
		if len(v) > 0 && !json.Valid(v) {
			return nil, errors.New("a field of the chat request is not valid JSON")
		}
	}
	b := make([]byte, 0, len(r.Messages)+len(r.Tools)+len(kwargs)+len(r.MMProcessorKwargs)+len(r.MediaIOKwargs)+256)
	b = append(b, '{')
	if r.Model != "" {
		b = appendMember(b, "model", jsonString(r.Model))
	}
	b = appendMember(b, "messages", r.Messages)
	b = appendMember(b, "add_generation_prompt", jsonBool(boolOr(r.AddGenerationPrompt, true)))
	b = appendMember(b, "continue_final_message", jsonBool(boolOr(r.ContinueFinalMessage, false)))
	b = appendMember(b, "add_special_tokens", jsonBool(boolOr(r.AddSpecialTokens, false)))
	if r.ChatTemplate != "" {
		b = appendMember(b, "chat_template", jsonString(r.ChatTemplate))
	}
	for _, m := range []struct {
		name  string
		value json.RawMessage
	}{
		{"chat_template_kwargs", kwargs}, {"tools", value(r.Tools)},
		{"mm_processor_kwargs", value(r.MMProcessorKwargs)}, {"media_io_kwargs", value(r.MediaIOKwargs)},
	} {
		if m.value != nil {
			b = appendMember(b, m.name, m.value)
		}
	}
	b[len(b)-1] = '}'
	return b, nil
}

// appendMember appends "name":value, to an object being written.
func appendMember(b []byte, name string, value []byte) []byte {
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	b = append(b, bytes.TrimSpace(value)...)
	return append(b, ',')
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

func jsonBool(v bool) []byte {
	if v {
		return []byte("true")
	}
	return []byte("false")
}

// detach returns a copy of r that owns its JSON values, for work that
// outlives the caller's buffers.
func (r *ChatRequest) detach() *ChatRequest {
	c := *r
	for _, raw := range []*json.RawMessage{&c.Messages, &c.Tools, &c.Documents, &c.ChatTemplateKwargs, &c.MMProcessorKwargs, &c.MediaIOKwargs} {
		*raw = bytes.Clone(*raw)
	}
	return &c
}

// templateKwargs returns the chat_template_kwargs to send: the request's,
// with documents, reasoning_effort and enable_thinking merged in as vLLM's
// chat endpoint merges them (chatkwargs.Merge).
func (r *ChatRequest) templateKwargs() (json.RawMessage, error) {
	return chatkwargs.Merge(r.ChatTemplateKwargs, r.Documents, r.ReasoningEffort)
}
