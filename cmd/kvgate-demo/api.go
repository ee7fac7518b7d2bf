package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/kvgate/kvgate/pkg/gateway"
)

// The APIs of -api, by which the users send their conversations.
const (
	// apiChat is OpenAI's chat completions (POST /v1/chat/completions).
	apiChat = "chat"
	// apiResponses is OpenAI's Responses API (POST /v1/responses), shaped
	// as Codex CLI sends it: the system prompt as instructions, the whole
	// history as input items, nothing stored.
	apiResponses = "responses"
	// apiMessages is Anthropic's Messages API (POST /v1/messages), shaped
	// as Claude Code sends it: the system prompt and every message as
	// lists of text blocks. Its usage reports no cached tokens.
	apiMessages = "messages"
)

// apiPaths are the gateway's path of each API.
var apiPaths = map[string]string{
	apiChat:      gateway.PathChatCompletions,
	apiResponses: gateway.PathResponses,
	apiMessages:  gateway.PathMessages,
}

// apiNames are the APIs of -api, in the order the help lists them.
var apiNames = []string{apiChat, apiResponses, apiMessages}

// apiNoun describes the requests the users send through api.
func apiNoun(api string) string {
	switch api {
	case apiResponses:
		return "streamed Responses requests as Codex CLI sends them"
	case apiMessages:
		return "streamed Messages requests as Claude Code sends them"
	}
	return "streamed chat completions"
}

// responsesRequest is the body of a Responses request.
type responsesRequest struct {
	Model           string          `json:"model"`
	Instructions    string          `json:"instructions,omitempty"`
	Input           []responsesItem `json:"input"`
	MaxOutputTokens int             `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
	Store           bool            `json:"store"`
}

// responsesItem is an item of a Responses request's input: a user message
// of input_text parts, an earlier answer as the output message it came
// as, with its id and status, or the reasoning item that preceded that
// answer, whose text is a reasoning_text part.
type responsesItem struct {
	Type    string             `json:"type"`
	Role    string             `json:"role,omitempty"`
	ID      string             `json:"id,omitempty"`
	Status  string             `json:"status,omitempty"`
	Summary json.RawMessage    `json:"summary,omitempty"`
	Content []responsesContent `json:"content"`
}

// responsesContent is a text part of a message item; Annotations, an
// output_text part's, is left out when nil.
type responsesContent struct {
	Type        string          `json:"type"`
	Text        string          `json:"text"`
	Annotations json.RawMessage `json:"annotations,omitempty"`
}

// responsesBody returns the body of a streamed Responses request of
// messages asking for maxTokens tokens: a leading system message becomes
// the instructions, the other messages the input items, an answer's
// reasoning a reasoning item before it.
func responsesBody(model string, messages []chatMessage, maxTokens int) ([]byte, error) {
	body := responsesRequest{Model: model, MaxOutputTokens: maxTokens, Stream: true, Input: []responsesItem{}}
	if len(messages) > 0 && messages[0].Role == "system" {
		body.Instructions, messages = messages[0].Content, messages[1:]
	}
	for _, m := range messages {
		item := responsesItem{Type: "message", Role: m.Role,
			Content: []responsesContent{{Type: "input_text", Text: m.Content}}}
		if m.Role == "assistant" {
			item.ID, item.Status = m.id, "completed"
			item.Content[0] = responsesContent{Type: "output_text", Text: m.Content, Annotations: json.RawMessage(`[]`)}
			if m.Reasoning != "" {
				body.Input = append(body.Input, responsesItem{Type: "reasoning", ID: "rs_" + strings.TrimPrefix(m.id, "msg_"),
					Summary: json.RawMessage(`[]`), Content: []responsesContent{{Type: "reasoning_text", Text: m.Reasoning}}})
			}
		}
		body.Input = append(body.Input, item)
	}
	return json.Marshal(&body)
}

// responsesEvent is what the client reads of a Responses stream's events.
type responsesEvent struct {
	Type string `json:"type"`
	// Delta is a response.output_text.delta's text.
	Delta string `json:"delta"`
	// Item is the output item of response.output_item.done.
	Item *struct {
		ID   string `json:"id"`
		Type string `json:"type"`
	} `json:"item"`
	// Response is the response object of the lifecycle events.
	Response *struct {
		Output []struct {
			ID   string `json:"id"`
			Type string `json:"type"`
		} `json:"output"`
		Usage *struct {
			InputTokens        int `json:"input_tokens"`
			InputTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	} `json:"response"`
	// Message is an error event's, in OpenAI's form; Error the OpenAI
	// error object the gateway sends when the engine breaks a stream off.
	Message string `json:"message"`
	Error   *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// readResponsesStream reads a Responses stream's events up to
// response.completed (or response.incomplete), calling firstToken at the
// first generated text, and sets r's answer, the id of the output message
// holding it, and the usage, cached tokens included.
func readResponsesStream(body io.Reader, r *result, firstToken func()) error {
	var answer strings.Builder
	seen := false
	err := readEvents(body, "response.completed", func(data []byte) (bool, error) {
		var ev responsesEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			return false, fmt.Errorf("undecodable event %.80q: %w", data, err)
		}
		switch ev.Type {
		case "response.output_text.delta":
			if !seen && ev.Delta != "" {
				seen = true
				firstToken()
			}
			answer.WriteString(ev.Delta)
		case "response.output_item.done":
			if ev.Item != nil && ev.Item.Type == "message" && r.answerID == "" {
				r.answerID = ev.Item.ID
			}
		case "response.completed", "response.incomplete":
			if !seen {
				firstToken()
			}
			if ev.Response == nil || ev.Response.Usage == nil {
				return true, errors.New("the stream ended without its usage")
			}
			u := ev.Response.Usage
			r.promptTokens = u.InputTokens
			if u.InputTokensDetails != nil {
				r.cachedTokens = u.InputTokensDetails.CachedTokens
			}
			// An answer with no text opened no output item: the
			// response's own message stands for it.
			for _, o := range ev.Response.Output {
				if o.Type == "message" && r.answerID == "" {
					r.answerID = o.ID
				}
			}
			return true, nil
		case "response.failed":
			msg := "no reason given"
			if ev.Response != nil && ev.Response.Error != nil {
				msg = ev.Response.Error.Message
			}
			return false, fmt.Errorf("the stream failed: %s", msg)
		case "error":
			return false, fmt.Errorf("the stream failed: %s", ev.Message)
		}
		if ev.Error != nil {
			return false, fmt.Errorf("the stream failed: %s", ev.Error.Message)
		}
		return false, nil
	})
	r.answer = answer.String()
	return err
}

// messagesRequest is the body of an Anthropic Messages request.
type messagesRequest struct {
	Model     string            `json:"model"`
	System    []messagesText    `json:"system,omitempty"`
	Messages  []messagesMessage `json:"messages"`
	MaxTokens int               `json:"max_tokens"`
	Stream    bool              `json:"stream"`
}

type messagesMessage struct {
	Role    string         `json:"role"`
	Content []messagesText `json:"content"`
}

// messagesText is a text block, or a thinking block with its signature.
type messagesText struct {
	Type      string `json:"type"`
	Text      string `json:"text,omitempty"`
	Thinking  string `json:"thinking,omitempty"`
	Signature string `json:"signature,omitempty"`
}

// messagesBody returns the body of a streamed Messages request of
// messages asking for maxTokens tokens: a leading system message becomes
// the system blocks, the other messages the messages, an answer's
// reasoning a thinking block before its text.
func messagesBody(model string, messages []chatMessage, maxTokens int) ([]byte, error) {
	body := messagesRequest{Model: model, MaxTokens: maxTokens, Stream: true, Messages: []messagesMessage{}}
	if len(messages) > 0 && messages[0].Role == "system" {
		body.System, messages = []messagesText{{Type: "text", Text: messages[0].Content}}, messages[1:]
	}
	for _, m := range messages {
		msg := messagesMessage{Role: m.Role}
		if m.Reasoning != "" {
			msg.Content = append(msg.Content, messagesText{Type: "thinking", Thinking: m.Reasoning, Signature: "kvgate-demo"})
		}
		msg.Content = append(msg.Content, messagesText{Type: "text", Text: m.Content})
		body.Messages = append(body.Messages, msg)
	}
	return json.Marshal(&body)
}

// messagesEvent is what the client reads of a Messages stream's events.
type messagesEvent struct {
	Type string `json:"type"`
	// Message is message_start's message.
	Message *struct {
		Usage messagesUsage `json:"usage"`
	} `json:"message"`
	// Delta is a content_block_delta's delta.
	Delta *struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"delta"`
	// Usage is message_delta's.
	Usage *messagesUsage `json:"usage"`
	// Error is an error event's.
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

type messagesUsage struct {
	InputTokens int `json:"input_tokens"`
}

// readMessagesStream reads a Messages stream's events up to message_stop,
// calling firstToken at the first generated text, and sets r's answer and
// usage: the prompt's tokens, its cached ones unknown.
func readMessagesStream(body io.Reader, r *result, firstToken func()) error {
	var answer strings.Builder
	seen, usage := false, false
	r.cachedUnknown = true
	err := readEvents(body, "message_stop", func(data []byte) (bool, error) {
		var ev messagesEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			return false, fmt.Errorf("undecodable event %.80q: %w", data, err)
		}
		switch ev.Type {
		case "message_start":
			if ev.Message != nil {
				usage = true
				r.promptTokens = ev.Message.Usage.InputTokens
			}
		case "content_block_delta":
			if ev.Delta != nil && ev.Delta.Type == "text_delta" {
				if !seen && ev.Delta.Text != "" {
					seen = true
					firstToken()
				}
				answer.WriteString(ev.Delta.Text)
			}
		case "message_delta":
			if !seen {
				seen = true
				firstToken()
			}
			if ev.Usage != nil && ev.Usage.InputTokens > 0 {
				usage = true
				r.promptTokens = ev.Usage.InputTokens
			}
		case "message_stop":
			if !usage {
				return true, errors.New("the stream ended without its usage")
			}
			return true, nil
		case "error":
			msg := "no reason given"
			if ev.Error != nil {
				msg = ev.Error.Message
			}
			return false, fmt.Errorf("the stream failed: %s", msg)
		}
		return false, nil
	})
	r.answer = answer.String()
	return err
}
