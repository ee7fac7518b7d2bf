package simserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kvgate/kvgate/pkg/internal/chatkwargs"
	"github.com/kvgate/kvgate/pkg/sim"
)

// streamOptions is OpenAI's stream_options, read as vLLM reads them.
type streamOptions struct {
	// IncludeUsage is include_usage: absent means true, vLLM's default,
	// and null means false.
	IncludeUsage laxBool `json:"include_usage"`
	// ContinuousUsageStats is checked as vLLM checks it, and otherwise
	// ignored.
	ContinuousUsageStats laxBool `json:"continuous_usage_stats"`
}

// wantsUsage reports whether o asks for the usage chunk.
func (o *streamOptions) wantsUsage() bool {
	return o != nil && (!o.IncludeUsage.set || o.IncludeUsage.v)
}

// check fails for options vLLM refuses.
func (o *streamOptions) check() error {
	if o == nil {
		return nil
	}
	return checkAll(o.IncludeUsage.check("stream_options.include_usage", true),
		o.ContinuousUsageStats.check("stream_options.continuous_usage_stats", true))
}

// generationParams are the fields completions and chat requests share.
// Integer and boolean members are read as vLLM reads them (see laxInt and
// laxBool).
type generationParams struct {
	Model         string         `json:"model"`
	MaxTokens     laxInt         `json:"max_tokens"`
	N             laxInt         `json:"n"`
	Seed          laxInt         `json:"seed"`
	Stream        laxBool        `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
}

// check fails for members vLLM refuses; nullableN says whether n may be
// null (it may in chat requests, not in completions). A seed must lie in
// int64's range.
func (p *generationParams) check(nullableN bool) error {
	if err := checkAll(p.MaxTokens.check("max_tokens", true), p.N.check("n", nullableN),
		p.Seed.check("seed", true), p.Stream.check("stream", true), p.StreamOptions.check()); err != nil {
		return err
	}
	if p.Seed.beyond {
		return badRequestf("seed: want an integer in int64's range")
	}
	return nil
}

// completionRequest is the body of POST /v1/completions. Sampling fields
// the simulated model has no use for (temperature, stop, ...) are accepted
// and ignored.
type completionRequest struct {
	generationParams
	Prompt           json.RawMessage `json:"prompt"`
	AddSpecialTokens laxBool         `json:"add_special_tokens"`
}

func (r *completionRequest) check() error {
	return checkAll(r.generationParams.check(false), r.AddSpecialTokens.check("add_special_tokens", false))
}

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	generationParams
	chatFields
	MaxCompletionTokens laxInt `json:"max_completion_tokens"`
	// Documents and ReasoningEffort reach the chat template as vLLM's
	// chat endpoint passes them (see templateKwargs); /tokenize, as
	// vLLM's, reads neither.
	Documents       json.RawMessage `json:"documents"`
	ReasoningEffort string          `json:"reasoning_effort"`
}

// chatPrompt returns the chat prompt of r, with the template variables
// vLLM's chat endpoint passes.
func (r *chatRequest) chatPrompt() (chatPrompt, error) {
	p := r.prompt()
	var err error
	p.kwargs, err = templateKwargs(p.kwargs, r.Documents, r.ReasoningEffort)
	return p, err
}

// templateKwargs returns the chat_template_kwargs vLLM's chat endpoint
// renders a chat with: kwargs with documents, reasoning_effort and the
// enable_thinking it implies merged in (chatkwargs.Merge). It fails as a
// bad request when kwargs, to be merged into, is not a JSON object.
func templateKwargs(kwargs, documents json.RawMessage, reasoningEffort string) (json.RawMessage, error) {
	merged, err := chatkwargs.Merge(kwargs, documents, reasoningEffort)
	if err != nil {
		return nil, badRequestf("%v", err)
	}
	return merged, nil
}

func (r *chatRequest) check() error {
	return checkAll(r.generationParams.check(true), r.chatFields.check(),
		r.MaxCompletionTokens.check("max_completion_tokens", true))
}

// chatFields are the fields of chat and /tokenize requests that shape the
// prompt.
type chatFields struct {
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  laxBool         `json:"add_generation_prompt"`
	ContinueFinalMessage laxBool         `json:"continue_final_message"`
	AddSpecialTokens     laxBool         `json:"add_special_tokens"`
}

// check fails for members vLLM refuses; none of f's booleans may be null.
func (f *chatFields) check() error {
	return checkAll(f.AddGenerationPrompt.check("add_generation_prompt", false),
		f.ContinueFinalMessage.check("continue_final_message", false),
		f.AddSpecialTokens.check("add_special_tokens", false))
}

// prompt returns the chat prompt of f.
func (f *chatFields) prompt() chatPrompt {
	return chatPrompt{
		messages: f.Messages, tools: f.Tools, kwargs: f.ChatTemplateKwargs,
		addGenerationPrompt:  f.AddGenerationPrompt.or(true),
		continueFinalMessage: f.ContinueFinalMessage.or(false),
		addSpecialTokens:     f.AddSpecialTokens.or(false),
	}
}

// tokenizeRequest is the body of POST /tokenize: a prompt or messages.
type tokenizeRequest struct {
	Model  string  `json:"model"`
	Prompt *string `json:"prompt"`
	chatFields
}

func (r *tokenizeRequest) check() error { return r.chatFields.check() }

// chatMessage is an OpenAI chat message; content is a string, an array of
// content parts, or null.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// contentPart is one part of a message's content array.
type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// badRequest marks errors the client caused.
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func badRequestf(format string, args ...any) error {
	return &badRequest{msg: fmt.Sprintf(format, args...)}
}

// decodeBody parses a JSON request body into v.
func decodeBody(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return badRequestf("invalid JSON body: %v", err)
	}
	return nil
}

// messages converts chat messages to the template's form. Text parts of a
// content array are joined with newlines, as vLLM does for templates that
// take string content.
func toSimMessages(msgs []chatMessage) ([]sim.ChatMessage, error) {
	if len(msgs) == 0 {
		return nil, badRequestf("messages must not be empty")
	}
	out := make([]sim.ChatMessage, len(msgs))
	for i, m := range msgs {
		content, err := messageText(m.Content)
		if err != nil {
			return nil, badRequestf("messages[%d].content: %v", i, err)
		}
		out[i] = sim.ChatMessage{Role: m.Role, Content: content}
	}
	return out, nil
}

func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []contentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("want a string or an array of content parts")
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part type %q: the simulated model reads text only", p.Type)
		}
		texts = append(texts, p.Text)
	}
	return strings.Join(texts, "\n"), nil
}

// parsePrompts turns a completions prompt (a string, an array of strings,
// an array of token ids, or an array of arrays of token ids) into token id
// lists, tokenizing text with a BOS token when addSpecial is set.
func parsePrompts(tk promptTokenizer, raw json.RawMessage, addSpecial bool) ([][]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequestf("prompt is required")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return [][]uint32{tk.encode(text, addSpecial)}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return nil, badRequestf("prompt must be a string, token ids, or a non-empty array of either")
	}
	if ids, err := tokenIDs(raw); err == nil {
		return [][]uint32{ids}, nil
	}
	prompts := make([][]uint32, len(items))
	for i, item := range items {
		if json.Unmarshal(item, &text) == nil {
			prompts[i] = tk.encode(text, addSpecial)
			continue
		}
		ids, err := tokenIDs(item)
		if err != nil {
			return nil, badRequestf("prompt[%d]: %v", i, err)
		}
		prompts[i] = ids
	}
	return prompts, nil
}

// tokenIDs parses a JSON array of token ids.
func tokenIDs(raw json.RawMessage) ([]uint32, error) {
	var nums []int64
	if err := json.Unmarshal(raw, &nums); err != nil {
		return nil, errors.New("want a string or an array of token ids")
	}
	ids := make([]uint32, len(nums))
	for i, v := range nums {
		if v < 0 || v > math.MaxUint32 {
			return nil, fmt.Errorf("token id %d is not a valid id", v)
		}
		ids[i] = uint32(v)
	}
	return ids, nil
}

// usage is OpenAI's usage object with vLLM's prompt_tokens_details.
type usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	PromptTokensDetails promptTokensDetails `json:"prompt_tokens_details"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// completionChoice is a choice of a text_completion object, whole or as a
// stream chunk.
type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

// chatChoice is a choice of a chat.completion object.
type chatChoice struct {
	Index        int          `json:"index"`
	Message      assistantMsg `json:"message"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	StopReason   any          `json:"stop_reason"`
}

// chatChunkChoice is a choice of a chat.completion.chunk object.
type chatChunkChoice struct {
	Index        int          `json:"index"`
	Delta        assistantMsg `json:"delta"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	StopReason   any          `json:"stop_reason"`
}

type assistantMsg struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

// response is the envelope of every completion object and chunk.
type response struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices any    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

// tokenizeResponse is vLLM's /tokenize answer.
type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// modelCard is an entry of /v1/models.
type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        string            `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen *int              `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

// modelPermission is the permission vLLM attaches to every model card,
// always the same but for its id and time.
type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

// newModelPermission returns vLLM's default permission.
func newModelPermission(created int64) modelPermission {
	return modelPermission{ID: "modelperm-" + randomHex(), Object: "model_permission", Created: created,
		AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*"}
}

// apiError is the body of an error response.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    int    `json:"code"`
}
