package simserver

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
	"github.com/kvgate/kvgate/pkg/sim"
)

// AnthropicChat is the chat completion request vLLM builds from the body
// of an Anthropic Messages request, as far as the simulator serves it.
type AnthropicChat struct {
	Model string
	// MaxTokens is the body's max_tokens; 0 for a token count's body.
	MaxTokens int
	// Messages, Tools and ChatTemplateKwargs are the chat's members, as
	// the chat template reads them; Tools and ChatTemplateKwargs are nil
	// when absent.
	Messages, Tools, ChatTemplateKwargs json.RawMessage
	// ReasoningEffort is the chat's reasoning_effort, vLLM's reading of
	// output_config.effort; empty for none. It reaches the chat template
	// as a chat completion request's does.
	ReasoningEffort string
}

// AnthropicConverter converts the body of an Anthropic Messages request
// (of a token count when countTokens) into the chat vLLM serves it as. It
// fails with an error wrapping ErrAnthropicUnsupported for a body vLLM
// renders in a way the simulator cannot reproduce, and with any other
// error for a body vLLM refuses.
type AnthropicConverter func(body []byte, countTokens bool) (*AnthropicChat, error)

// ErrAnthropicUnsupported marks a Messages body vLLM accepts but renders
// in a way the simulator cannot reproduce (images, among others).
var ErrAnthropicUnsupported = errors.New("the simulator cannot render this request as vLLM would")

// handleMessages serves Anthropic's Messages API (POST /v1/messages) as
// vLLM does: the body is converted into the chat completion request vLLM
// builds from it (Config.Anthropic), that chat is rendered and
// generated as POST /v1/chat/completions would, so that the prompt's token
// ids, and the KV events of its blocks, are the chat's; and the result is
// answered in Anthropic's form. Errors are Anthropic's error objects.
func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readAnthropicBody(w, r)
	if !ok {
		return
	}
	chat, err := s.anthropic(body, false)
	if err != nil {
		s.writeAnthropicError(w, conversionError(err))
		return
	}
	stream, err := anthropicStream(body)
	if err != nil {
		s.writeAnthropicError(w, err)
		return
	}
	lora, prompt, err := s.renderAnthropic(chat)
	if err != nil {
		s.writeAnthropicError(w, err)
		return
	}
	rank, err := s.requestedRank(r)
	if err != nil {
		s.writeAnthropicError(w, err)
		return
	}
	g, err := s.startGeneration(generationSpec{idPrefix: "chatcmpl-", model: chat.Model, lora: lora,
		prompts: [][]uint32{prompt}, n: 1, maxTokens: chat.MaxTokens, rank: rank})
	if err != nil {
		s.writeAnthropicError(w, err)
		return
	}
	if stream {
		s.streamMessage(w, r, g)
		return
	}
	if !g.waitFor(r, w, s.writeAnthropicError) {
		return
	}
	c := g.choices[0]
	content := []anthropicContentBlock{}
	if text := (sim.Tokenizer{}).Decode(c.tokens); text != "" {
		content = append(content, anthropicContentBlock{Type: "text", Text: &text})
	}
	u := g.usage()
	writeJSON(w, http.StatusOK, anthropicMessage{ID: g.id, Type: "message", Role: "assistant", Content: content,
		Model: g.model, StopReason: anthropicStopReason(c.finish),
		Usage: anthropicUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens}})
}

// handleCountTokens serves Anthropic's token count (POST
// /v1/messages/count_tokens) as vLLM does: the prompt's length, rendered
// as the prompt of POST /v1/messages is.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readAnthropicBody(w, r)
	if !ok {
		return
	}
	chat, err := s.anthropic(body, true)
	if err != nil {
		s.writeAnthropicError(w, conversionError(err))
		return
	}
	_, prompt, err := s.renderAnthropic(chat)
	if err != nil {
		s.writeAnthropicError(w, err)
		return
	}
	n := len(prompt)
	writeJSON(w, http.StatusOK, anthropicCountTokens{InputTokens: n,
		ContextManagement: anthropicContextManagement{OriginalInputTokens: n}})
}

// readAnthropicBody reads the request body, answering with an Anthropic
// error and returning false when that fails.
func (s *Server) readAnthropicBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		s.writeAnthropicError(w, badRequestf("read body: %v", err))
		return nil, false
	}
	return body, true
}

// renderAnthropic resolves the model chat names and renders its prompt as
// a chat completion request's.
func (s *Server) renderAnthropic(chat *AnthropicChat) (*sim.LoRA, []uint32, error) {
	lora, err := s.lora(chat.Model)
	if err != nil {
		return nil, nil, err
	}
	kwargs, err := templateKwargs(chat.ChatTemplateKwargs, nil, chat.ReasoningEffort)
	if err != nil {
		return nil, nil, err
	}
	prompt, err := s.tokenizer.encodeChat(chatPrompt{messages: chat.Messages, tools: chat.Tools,
		kwargs: kwargs, addGenerationPrompt: true})
	if err != nil {
		return nil, nil, err
	}
	return lora, prompt, nil
}

// conversionError turns an error of Config.Anthropic into the client's
// error: vLLM refuses the body, or the simulator cannot render what vLLM
// would (ErrAnthropicUnsupported: images, among others).
func conversionError(err error) error {
	return badRequestf("%v", err)
}

// anthropicStream reads the body's stream member as vLLM reads it
// (jsonscan.LaxBool; null or absent is false). The body is valid JSON.
func anthropicStream(body []byte) (bool, error) {
	var stream laxBool
	err := jsonscan.Members(body, func(name, value []byte) error {
		if string(jsonscan.Name(name)) == "stream" {
			return stream.UnmarshalJSON(value)
		}
		return nil
	})
	if err != nil {
		return false, badRequestf("invalid JSON body: %v", err)
	}
	if err := stream.check("stream", true); err != nil {
		return false, err
	}
	return stream.or(false), nil
}

// streamMessage answers with the events vLLM sends for a streamed Messages
// request: message_start, once the first token is generated; for the text, content_block_start, a
// content_block_delta per token with text, content_block_stop;
// message_delta with the stop reason and usage; message_stop. An engine
// that fails mid-stream ends it with an error event. If the client goes
// away the generation is aborted.
func (s *Server) streamMessage(w http.ResponseWriter, r *http.Request, g *generation) {
	sse := startEvents(w)
	started := false
	start := func() {
		if !started {
			started = true
			sse.event("message_start", anthropicStreamEvent{Type: "message_start", Message: &anthropicMessageStart{
				ID: g.id, Content: []anthropicContentBlock{}, Model: g.model,
				Usage: anthropicUsage{InputTokens: len(g.prompts[0])},
			}})
		}
	}
	var finish sim.FinishReason
	open := false
	for g.pending > 0 && sse.err == nil {
		outs, err := g.next(r.Context())
		if err != nil {
			if r.Context().Err() == nil {
				sse.event("error", anthropicError{Type: "error", Error: anthropicErrorBody{Type: "internal_error", Message: err.Error()}})
			}
			return
		}
		// vLLM sends message_start with the chat stream's first chunk,
		// which comes with the first generated token.
		start()
		for _, out := range outs {
			if out.Finished {
				finish = out.FinishReason
			}
			text := sim.Tokenizer{}.Decode([]uint32{out.Token})
			if text == "" {
				continue
			}
			if !open {
				empty := ""
				sse.event("content_block_start", anthropicStreamEvent{Type: "content_block_start",
					ContentBlock: &anthropicContentBlock{Type: "text", Text: &empty}, Index: new(0)})
				open = true
			}
			sse.event("content_block_delta", anthropicStreamEvent{Type: "content_block_delta",
				Delta: &anthropicDelta{Type: "text_delta", Text: &text}, Index: new(0)})
		}
	}
	if sse.err != nil {
		g.abort()
		return
	}
	if open {
		sse.event("content_block_stop", anthropicStreamEvent{Type: "content_block_stop", Index: new(0)})
	}
	if finish == "" {
		finish = sim.FinishStop
	}
	start()
	u := g.usage()
	sse.event("message_delta", anthropicMessageDelta{Type: "message_delta",
		Delta: anthropicStopDelta{StopReason: anthropicStopReason(finish)},
		Usage: anthropicUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens}})
	sse.event("message_stop", anthropicStreamEvent{Type: "message_stop"})
}

// anthropicStopReason maps an engine's finish reason to Anthropic's stop
// reason as vLLM does; nil for one it does not map (abort).
func anthropicStopReason(r sim.FinishReason) *string {
	var s string
	switch r {
	case sim.FinishStop:
		s = "end_turn"
	case sim.FinishLength:
		s = "max_tokens"
	default:
		return nil
	}
	return &s
}

// writeAnthropicError answers with the status err calls for and Anthropic's
// error object, whose type is the error type an OpenAI error would carry,
// as vLLM's is.
func (s *Server) writeAnthropicError(w http.ResponseWriter, err error) {
	status, kind := s.errorStatus(err)
	writeJSON(w, status, anthropicError{Type: "error", Error: anthropicErrorBody{Type: kind, Message: err.Error()}})
}

// anthropicMessage is a whole Messages response, its absent members left
// out as vLLM leaves them.
type anthropicMessage struct {
	ID         string                  `json:"id"`
	Type       string                  `json:"type"`
	Role       string                  `json:"role"`
	Content    []anthropicContentBlock `json:"content"`
	Model      string                  `json:"model"`
	StopReason *string                 `json:"stop_reason,omitempty"`
	Usage      anthropicUsage          `json:"usage"`
}

// anthropicMessageStart is the message of a message_start event, with the
// members vLLM sends: not type or role, but a null stop_reason and
// stop_sequence.
type anthropicMessageStart struct {
	ID           string                  `json:"id"`
	Content      []anthropicContentBlock `json:"content"`
	Model        string                  `json:"model"`
	StopReason   *string                 `json:"stop_reason"`
	StopSequence *string                 `json:"stop_sequence"`
	Usage        anthropicUsage          `json:"usage"`
}

type anthropicContentBlock struct {
	Type string  `json:"type"`
	Text *string `json:"text,omitempty"`
}

type anthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// anthropicStreamEvent is the data of a streamed event other than
// message_delta.
type anthropicStreamEvent struct {
	Type         string                 `json:"type"`
	Message      *anthropicMessageStart `json:"message,omitempty"`
	Delta        *anthropicDelta        `json:"delta,omitempty"`
	ContentBlock *anthropicContentBlock `json:"content_block,omitempty"`
	Index        *int                   `json:"index,omitempty"`
}

type anthropicDelta struct {
	Type string  `json:"type"`
	Text *string `json:"text,omitempty"`
}

// anthropicMessageDelta is the data of the message_delta event; its
// stop_reason is null when vLLM maps none.
type anthropicMessageDelta struct {
	Type  string             `json:"type"`
	Delta anthropicStopDelta `json:"delta"`
	Usage anthropicUsage     `json:"usage"`
}

type anthropicStopDelta struct {
	StopReason *string `json:"stop_reason"`
}

type anthropicCountTokens struct {
	InputTokens       int                        `json:"input_tokens"`
	ContextManagement anthropicContextManagement `json:"context_management"`
}

type anthropicContextManagement struct {
	OriginalInputTokens int `json:"original_input_tokens"`
}

// anthropicError is Anthropic's error object.
type anthropicError struct {
	Type  string             `json:"type"`
	Error anthropicErrorBody `json:"error"`
}

type anthropicErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}
