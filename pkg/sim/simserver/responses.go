package simserver

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
	"github.com/kvgate/kvgate/pkg/sim"
)

// ResponsesChat is the chat completion request vLLM renders the body of a
// Responses request (POST /v1/responses) as, for models it does not serve
// with harmony.
//
// The server reads the body's model itself, so that a request for a model
// it does not serve is answered 404 even when the simulator cannot render
// the body.
type ResponsesChat struct {
	// Messages, Tools and ChatTemplateKwargs are the chat's members, as
	// the chat template reads them; Tools and ChatTemplateKwargs are nil
	// when absent.
	Messages, Tools, ChatTemplateKwargs json.RawMessage
	// AddGenerationPrompt and ContinueFinalMessage are the chat's flags,
	// nil for their defaults (true and false): vLLM continues a final
	// assistant message the input ends with instead of opening a new one.
	AddGenerationPrompt, ContinueFinalMessage *bool
	// ReasoningEffort is the chat's reasoning_effort, vLLM's reading of
	// reasoning.effort; empty for none. It reaches the chat template as a
	// chat completion request's does.
	ReasoningEffort string
}

// ResponsesConverter converts the body of a Responses request into the
// chat vLLM renders it as. It fails with an error wrapping
// ErrResponsesUnsupported for a body vLLM renders in a way the simulator
// cannot reproduce, and with any other error for a body vLLM refuses.
type ResponsesConverter func(body []byte) (*ResponsesChat, error)

// ErrResponsesUnsupported marks a Responses body vLLM accepts but renders
// in a way the simulator cannot reproduce.
var ErrResponsesUnsupported = errors.New("the simulator cannot render this request as vLLM would")

// responsesRequest holds the members of a Responses body the simulator
// reads or echoes back in the response object. The echoed members are
// kept as sent (nil when absent).
type responsesRequest struct {
	Model              *string         `json:"model"`
	Stream             laxBool         `json:"stream"`
	MaxOutputTokens    laxInt          `json:"max_output_tokens"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Input              json.RawMessage `json:"input"`
	Background         laxBool         `json:"background"`
	Store              laxBool         `json:"store"`
	Instructions       json.RawMessage `json:"instructions"`
	Metadata           json.RawMessage `json:"metadata"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ParallelToolCalls  json.RawMessage `json:"parallel_tool_calls"`
	Temperature        json.RawMessage `json:"temperature"`
	TopP               json.RawMessage `json:"top_p"`
	MaxToolCalls       json.RawMessage `json:"max_tool_calls"`
	Reasoning          json.RawMessage `json:"reasoning"`
	ServiceTier        json.RawMessage `json:"service_tier"`
	Text               json.RawMessage `json:"text"`
	Truncation         json.RawMessage `json:"truncation"`
	User               json.RawMessage `json:"user"`
	PresencePenalty    json.RawMessage `json:"presence_penalty"`
	FrequencyPenalty   json.RawMessage `json:"frequency_penalty"`
}

// check fails for members vLLM refuses.
func (r *responsesRequest) check() error {
	return checkAll(r.Stream.check("stream", true), r.MaxOutputTokens.check("max_output_tokens", true),
		r.Background.check("background", true), r.Store.check("store", true))
}

// responsesFailure is an error vLLM answers on the Responses path with a
// status, an error type and the parameter it blames.
type responsesFailure struct {
	status      int
	kind, param string
	msg         string
}

func (e *responsesFailure) Error() string { return e.msg }

// handleResponses serves OpenAI's Responses API (POST /v1/responses) as
// vLLM does for models it does not serve with harmony: the body is
// converted into the chat vLLM renders it as (Config.Responses), which is
// rendered and generated as POST /v1/chat/completions would, so that the
// prompt's token ids, and the KV events of its blocks, are the chat's; the
// answer is vLLM's response object or, with stream, vLLM's Responses
// events. Errors are OpenAI error objects.
func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		s.writeResponsesError(w, badRequestf("read body: %v", err))
		return
	}
	chat, convErr := s.responses(body)
	if convErr != nil && !errors.Is(convErr, ErrResponsesUnsupported) {
		s.writeResponsesError(w, badRequestf("%v", convErr))
		return
	}
	var req responsesRequest
	if err := decodeBody(body, &req); err != nil {
		s.writeResponsesError(w, err)
		return
	}
	if err := req.check(); err != nil {
		s.writeResponsesError(w, err)
		return
	}
	if err := s.checkResponsesBackground(&req); err != nil {
		s.writeResponsesError(w, err)
		return
	}
	model := ""
	if req.Model != nil {
		model = *req.Model
	}
	lora, err := s.lora(model)
	if err != nil {
		s.writeResponsesError(w, err)
		return
	}
	// Without store mode no response is kept (store is ignored), so none
	// is found to continue.
	var history []json.RawMessage
	if req.PreviousResponseID != nil {
		prev, prevInput, ok := s.store.get(*req.PreviousResponseID)
		if !ok {
			s.writeResponsesError(w, responseNotFound(*req.PreviousResponseID))
			return
		}
		history = continuedItems(prev, prevInput)
		continued, err := continuationBody(body, history)
		if err != nil {
			s.writeResponsesError(w, badRequestf("%v", err))
			return
		}
		chat, convErr = s.responses(continued)
	}
	if convErr != nil {
		s.writeResponsesError(w, badRequestf("%v", convErr))
		return
	}
	maxOut := req.MaxOutputTokens.or(0)
	if req.MaxOutputTokens.given() && maxOut > s.maxModelLen {
		s.writeResponsesError(w, badRequestf("max_output_tokens=%dcannot be greater than max_model_len=max_total_tokens=%d. "+
			"Please request fewer output tokens. (parameter=max_output_tokens, value=%d)", maxOut, s.maxModelLen, maxOut))
		return
	}
	kwargs, err := templateKwargs(chat.ChatTemplateKwargs, nil, chat.ReasoningEffort)
	if err != nil {
		s.writeResponsesError(w, err)
		return
	}
	prompt, err := s.tokenizer.encodeChat(chatPrompt{messages: chat.Messages, tools: chat.Tools, kwargs: kwargs,
		addGenerationPrompt:  chat.AddGenerationPrompt == nil || *chat.AddGenerationPrompt,
		continueFinalMessage: chat.ContinueFinalMessage != nil && *chat.ContinueFinalMessage})
	if err != nil {
		s.writeResponsesError(w, err)
		return
	}
	if err := s.checkResponsesPrompt(len(prompt), maxOut); err != nil {
		s.writeResponsesError(w, err)
		return
	}
	if req.MaxOutputTokens.given() && maxOut < 1 {
		s.writeResponsesError(w, badRequestf("max_tokens must be at least 1, got %d.", maxOut))
		return
	}
	rank, err := s.requestedRank(r)
	if err != nil {
		s.writeResponsesError(w, err)
		return
	}
	g, err := s.startGeneration(generationSpec{idPrefix: "resp_", model: cmp.Or(model, s.model), lora: lora,
		prompts: [][]uint32{prompt}, n: 1, maxTokens: maxOut, rank: rank})
	if err != nil {
		s.writeResponsesError(w, err)
		return
	}
	// vLLM's max_output_tokens is its sampling's max_tokens: the room the
	// prompt leaves when the body sets none.
	resp := newResponsesObject(g, &req, s.maxModelLen-len(prompt))
	if req.MaxOutputTokens.given() {
		resp.MaxOutputTokens = maxOut
	}
	// The input items are kept with the response when it is stored.
	var input []json.RawMessage
	keep := s.store != nil && req.Store.or(true)
	if keep {
		input = requestItems(&req, history)
	}
	if req.Background.or(false) {
		queued := *resp
		queued.Status = "queued"
		ctx, cancel := context.WithCancel(context.Background())
		stream := req.Stream.or(false)
		e := s.store.putBackground(&queued, input, cancel, stream)
		go s.runBackground(ctx, cancel, g, resp, e)
		if stream {
			s.replayEvents(w, r, e, 0)
			return
		}
		writeJSON(w, http.StatusOK, &queued)
		return
	}
	if req.Stream.or(false) {
		if done := s.streamResponse(w, r, g, resp); done != nil && keep {
			s.store.put(done, input)
		}
		return
	}
	if !g.waitFor(r, w, s.writeResponsesError) {
		return
	}
	c := g.choices[0]
	resp.complete(sim.Tokenizer{}.Decode(c.tokens), c.finish, g.usage())
	if keep {
		s.store.put(resp, input)
	}
	writeJSON(w, http.StatusOK, resp)
}

// runBackground waits for g, the generation of background response
// resp kept as e, until ctx ends, and keeps its end: the completed
// response, or the response failed.
func (s *Server) runBackground(ctx context.Context, cancel context.CancelFunc, g *generation, resp *responsesObject,
	e *storedResponse) {
	defer cancel()
	done, err := resp, error(nil)
	if e.streamed {
		done, err = responseEvents(ctx, g, resp, func(frame []byte) error {
			s.store.addEvent(e, frame)
			return nil
		})
	} else if err = g.wait(ctx); err == nil {
		c := g.choices[0]
		resp.complete(sim.Tokenizer{}.Decode(c.tokens), c.finish, g.usage())
	}
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error(err, "Background response failed", "response", resp.ID)
		}
		s.store.fail(e)
		return
	}
	s.store.finish(e, done)
}

// replayEvents answers with the events of background stream e from the
// from-th on (its sequence numbers are its indexes), waiting for more
// until its generation ends, as vLLM's replay does but that vLLM's waits
// on when its generation is cancelled or fails. A response that is not a
// background stream is broken off after the answer began, as vLLM's is,
// which fails looking for its events.
func (s *Server) replayEvents(w http.ResponseWriter, r *http.Request, e *storedResponse, from int) {
	sse := startEvents(w)
	if !e.streamed {
		_ = sse.rc.Flush()
		panic(http.ErrAbortHandler)
	}
	for {
		frames, ended, wake := s.store.eventsFrom(e, from)
		for _, f := range frames {
			sse.frame(f)
		}
		from += len(frames)
		if sse.err != nil || ended {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-wake:
		}
	}
}

// handleCancelResponse answers POST /v1/responses/{response_id}/cancel as
// vLLM does (see responseStore.cancel).
func (s *Server) handleCancelResponse(w http.ResponseWriter, r *http.Request) {
	resp, err := s.store.cancel(r.PathValue("response_id"))
	if err != nil {
		s.writeResponsesError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// handleGetResponse answers GET /v1/responses/{response_id} as vLLM
// does: the response kept under the id, or 404.
//
// With the query stream=true it replays the events of a background stream
// after the sequence number starting_after (from the first without it),
// and those still to come (see replayEvents).
func (s *Server) handleGetResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("response_id")
	q := r.URL.Query()
	stream, err := queryBool(q.Get("stream"))
	if err != nil {
		s.writeResponsesError(w, badRequestf("stream: %v", err))
		return
	}
	from := 0
	if v := q.Get("starting_after"); stream && v != "" {
		after, err := strconv.Atoi(v)
		if err != nil {
			s.writeResponsesError(w, badRequestf("starting_after: want an integer, got %q", v))
			return
		}
		from = max(after+1, 0)
	}
	if stream {
		if e, ok := s.store.lookup(id); ok {
			s.replayEvents(w, r, e, from)
			return
		}
	} else if resp, _, ok := s.store.get(id); ok {
		writeJSON(w, http.StatusOK, resp)
		return
	}
	s.writeResponsesError(w, responseNotFound(id))
}

// queryBool reads a boolean query parameter as vLLM's (pydantic's) does;
// "" is false.
func queryBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "", "0", "off", "f", "false", "n", "no":
		return false, nil
	case "1", "on", "t", "true", "y", "yes":
		return true, nil
	}
	return false, fmt.Errorf("want a boolean, got %q", v)
}

// continuedItems returns the input items a request continuing prev,
// whose request was rendered from prevInput, inherits, as vLLM builds
// them: prevInput as kept (its instructions' system message included),
// then an assistant message of each content part of prev's output
// messages.
func continuedItems(prev *responsesObject, prevInput []json.RawMessage) []json.RawMessage {
	items := slices.Clip(prevInput)
	for _, out := range prev.Output {
		if out.Type != "message" || out.Role != "assistant" {
			continue
		}
		for _, part := range out.Content {
			items = append(items, mustJSON(inputMessage{Role: "assistant", Content: part.Text}))
		}
	}
	return items
}

// requestItems returns the input items req is rendered from, as vLLM
// keeps them: its instructions, when not empty, as a system message, the
// history it continues, then its input, a string as a user message.
func requestItems(req *responsesRequest, history []json.RawMessage) []json.RawMessage {
	var items []json.RawMessage
	var instructions string
	if json.Unmarshal(req.Instructions, &instructions) == nil && instructions != "" {
		items = append(items, mustJSON(inputMessage{Role: "system", Content: instructions}))
	}
	items = append(items, history...)
	return append(items, inputItems(req.Input)...)
}

// inputItems returns the items of a request's input: a string is one
// user message, a list its elements; nil for any other value.
func inputItems(input json.RawMessage) []json.RawMessage {
	input = bytes.TrimSpace(input)
	if len(input) == 0 {
		return nil
	}
	switch input[0] {
	case '"':
		var text string
		if json.Unmarshal(input, &text) == nil {
			return []json.RawMessage{mustJSON(inputMessage{Role: "user", Content: text})}
		}
	case '[':
		var items []json.RawMessage
		if json.Unmarshal(input, &items) == nil {
			return items
		}
	}
	return nil
}

// continuationBody returns body as the request vLLM renders when it
// continues a conversation: previous_response_id left out and the input
// preceded by history, the items the conversation holds, so that the
// converter renders the whole conversation. An input that is neither a
// string nor a list is left as it is, for the converter to refuse.
func continuationBody(body []byte, history []json.RawMessage) ([]byte, error) {
	out := []byte{'{'}
	var input []byte
	err := jsonscan.Members(body, func(name, value []byte) error {
		switch string(jsonscan.Name(name)) {
		case "previous_response_id":
			return nil
		case "input":
			input = value
			return nil
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(append(append(append(out, '"'), name...), `":`...), value...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if input != nil {
		if items := inputItems(input); items != nil {
			input = mustJSON(append(slices.Clip(history), items...))
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(append(out, `"input":`...), input...)
	}
	return append(out, '}'), nil
}

// inputMessage is an input message item with text content.
type inputMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// mustJSON returns v, which always encodes, as JSON.
func mustJSON(v any) json.RawMessage {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}

// checkResponsesBackground refuses background mode without store, and
// without store mode, as vLLM without VLLM_ENABLE_RESPONSES_API_STORE
// does.
func (s *Server) checkResponsesBackground(req *responsesRequest) error {
	if !req.Background.or(false) {
		return nil
	}
	if !req.Store.or(true) {
		return badRequestf("background can only be used when `store` is true")
	}
	if s.store != nil {
		return nil
	}
	return &responsesFailure{status: http.StatusBadRequest, kind: "invalid_request_error", param: "background",
		msg: "This vLLM engine does not support `store=True` and therefore does not support the background mode. " +
			"To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when " +
			"launching the vLLM server."}
}

// checkResponsesPrompt refuses a prompt of n tokens that, with maxOut
// output tokens (0 when the body sets none), does not fit the model
// length, in vLLM's words.
func (s *Server) checkResponsesPrompt(n, maxOut int) error {
	limit := s.maxModelLen - max(maxOut, 0)
	if n > limit {
		return badRequestf("You passed %d input tokens and requested %d output tokens. However, the model's context "+
			"length is only %d tokens, resulting in a maximum input length of %d tokens. Please reduce the length of "+
			"the input prompt. (parameter=input_tokens, value=%d)", n, max(maxOut, 0), s.maxModelLen, limit, n)
	}
	if n >= s.maxModelLen {
		return &responsesFailure{status: http.StatusBadRequest, kind: "invalid_request_error", param: "input",
			msg: fmt.Sprintf("The engine prompt length %d exceeds the max_model_len %d. Please reduce prompt.", n, s.maxModelLen)}
	}
	return nil
}

// writeResponsesError answers with the status and OpenAI error object err
// calls for.
func (s *Server) writeResponsesError(w http.ResponseWriter, err error) {
	var f *responsesFailure
	if !errors.As(err, &f) {
		s.writeError(w, err)
		return
	}
	writeJSON(w, f.status, apiError{Error: apiErrorBody{Message: f.msg, Type: f.kind, Param: f.param, Code: f.status}})
}

// streamResponse answers with the events vLLM sends for a streamed
// Responses request (see responseEvents) and returns the completed
// response, nil when the stream did not complete. If the client goes away
// the generation is aborted; if an engine fails mid-stream the stream is
// broken off, as vLLM's is.
func (s *Server) streamResponse(w http.ResponseWriter, r *http.Request, g *generation, resp *responsesObject) *responsesObject {
	sse := startEvents(w)
	done, err := responseEvents(r.Context(), g, resp, func(frame []byte) error {
		sse.frame(frame)
		return sse.err
	})
	if err != nil && sse.err == nil && r.Context().Err() == nil {
		panic(http.ErrAbortHandler)
	}
	return done
}

// responseEvents generates the events vLLM sends for a streamed Responses
// request, each framed "event: <type>" and "data: <json>" and numbered by
// sequence_number, with no closing [DONE], passing each frame to emit:
// response.created and response.in_progress at once, before any token;
// for the text, response.output_item.added, response.content_part.added,
// a response.output_text.delta per token with text, then
// response.output_text.done, response.content_part.done and
// response.output_item.done; response.completed with the whole response
// and its usage, which it returns. When ctx ends, an engine fails or emit
// fails before the generation ends, it aborts the generation and returns
// the error.
func responseEvents(ctx context.Context, g *generation, resp *responsesObject, emit func(frame []byte) error) (*responsesObject, error) {
	seq := 0
	var err error
	send := func(name string, ev responsesEvent) {
		if err != nil {
			return
		}
		ev.setSequence(seq)
		seq++
		var frame []byte
		if frame, err = eventFrame(name, ev); err == nil {
			err = emit(frame)
		}
	}
	send("response.created", &responsesLifecycleEvent{Response: resp, Type: "response.created"})
	send("response.in_progress", &responsesLifecycleEvent{Response: resp, Type: "response.in_progress"})
	var itemID string
	var text strings.Builder
	open := false
	for g.pending > 0 && err == nil {
		outs, nextErr := g.next(ctx)
		if nextErr != nil {
			return nil, nextErr
		}
		for _, out := range outs {
			delta := sim.Tokenizer{}.Decode([]uint32{out.Token})
			if delta == "" {
				continue
			}
			if !open {
				open, itemID = true, randomHex()
				send("response.output_item.added", &responsesItemEvent{Type: "response.output_item.added",
					Item: responsesMessage{ID: itemID, Content: []responsesOutputText{}, Role: "assistant",
						Status: "in_progress", Type: "message"}})
				send("response.content_part.added", &responsesPartEvent{Type: "response.content_part.added", ItemID: itemID,
					Part: responsesOutputText{Annotations: []any{}, Type: "output_text", Logprobs: emptyList}})
			}
			text.WriteString(delta)
			send("response.output_text.delta", &responsesDeltaEvent{Type: "response.output_text.delta", ItemID: itemID,
				Delta: delta, Logprobs: []any{}})
		}
	}
	if err != nil {
		g.abort()
		return nil, err
	}
	if open {
		part := responsesOutputText{Annotations: []any{}, Text: text.String(), Type: "output_text"}
		send("response.output_text.done", &responsesTextDoneEvent{Type: "response.output_text.done", ItemID: itemID,
			Text: part.Text, Logprobs: []any{}})
		send("response.content_part.done", &responsesPartEvent{Type: "response.content_part.done", ItemID: itemID, Part: part})
		send("response.output_item.done", &responsesItemEvent{Type: "response.output_item.done",
			Item: responsesMessage{ID: itemID, Content: []responsesOutputText{part}, Role: "assistant", Status: "completed",
				Type: "message", Summary: emptyList}})
	}
	// vLLM builds the completed response anew, its message under an id of
	// its own.
	c := g.choices[0]
	done := *resp
	done.complete(text.String(), c.finish, g.usage())
	send("response.completed", &responsesLifecycleEvent{Response: &done, Type: "response.completed"})
	return &done, nil
}

// emptyList is a JSON member that is an empty list.
var emptyList = json.RawMessage(`[]`)

// responsesObject is vLLM's response object (ResponsesResponse), with the
// request's members echoed back as sent.
type responsesObject struct {
	ID                 string               `json:"id"`
	CreatedAt          int64                `json:"created_at"`
	IncompleteDetails  *responsesIncomplete `json:"incomplete_details"`
	Instructions       json.RawMessage      `json:"instructions"`
	Metadata           json.RawMessage      `json:"metadata"`
	Model              string               `json:"model"`
	Object             string               `json:"object"`
	Output             []responsesMessage   `json:"output"`
	ParallelToolCalls  json.RawMessage      `json:"parallel_tool_calls"`
	Temperature        json.RawMessage      `json:"temperature"`
	ToolChoice         json.RawMessage      `json:"tool_choice"`
	Tools              json.RawMessage      `json:"tools"`
	TopP               json.RawMessage      `json:"top_p"`
	Background         bool                 `json:"background"`
	MaxOutputTokens    int                  `json:"max_output_tokens"`
	MaxToolCalls       json.RawMessage      `json:"max_tool_calls"`
	PreviousResponseID *string              `json:"previous_response_id"`
	Prompt             json.RawMessage      `json:"prompt"`
	Reasoning          json.RawMessage      `json:"reasoning"`
	ServiceTier        json.RawMessage      `json:"service_tier"`
	Status             string               `json:"status"`
	Text               json.RawMessage      `json:"text"`
	TopLogprobs        json.RawMessage      `json:"top_logprobs"`
	Truncation         json.RawMessage      `json:"truncation"`
	Usage              *responsesUsage      `json:"usage"`
	User               json.RawMessage      `json:"user"`
	PresencePenalty    json.RawMessage      `json:"presence_penalty"`
	FrequencyPenalty   json.RawMessage      `json:"frequency_penalty"`
	KVTransferParams   json.RawMessage      `json:"kv_transfer_params"`
	ECTransferParams   json.RawMessage      `json:"ec_transfer_params"`
	InputMessages      json.RawMessage      `json:"input_messages"`
	OutputMessages     json.RawMessage      `json:"output_messages"`
}

// newResponsesObject returns the in-progress response object of g for
// req, with vLLM's defaults for the members req leaves out: maxOutput is
// the output tokens the request may generate.
func newResponsesObject(g *generation, req *responsesRequest, maxOutput int) *responsesObject {
	or := func(v json.RawMessage, def string) json.RawMessage {
		if len(v) == 0 || string(v) == "null" {
			return json.RawMessage(def)
		}
		return v
	}
	tools := or(req.Tools, `[]`)
	toolChoice := or(req.ToolChoice, `"auto"`)
	// Without tools, vLLM reads tool_choice "auto" as "none".
	if string(tools) == "[]" && string(toolChoice) == `"auto"` {
		toolChoice = json.RawMessage(`"none"`)
	}
	return &responsesObject{
		ID: g.id, CreatedAt: g.created, Instructions: req.Instructions, Metadata: req.Metadata, Model: g.model,
		Object: "response", Output: []responsesMessage{}, ParallelToolCalls: or(req.ParallelToolCalls, `true`),
		Temperature: or(req.Temperature, `1.0`), ToolChoice: toolChoice, Tools: tools, TopP: or(req.TopP, `1.0`),
		Background: req.Background.or(false), MaxOutputTokens: maxOutput, MaxToolCalls: req.MaxToolCalls, PreviousResponseID: req.PreviousResponseID,
		Reasoning: req.Reasoning, ServiceTier: or(req.ServiceTier, `"auto"`), Status: "in_progress", Text: req.Text,
		Truncation: or(req.Truncation, `"disabled"`), User: req.User,
		PresencePenalty: or(req.PresencePenalty, `0.0`), FrequencyPenalty: or(req.FrequencyPenalty, `0.0`),
	}
}

// complete sets o to the finished response: its message holding text (no
// content when text is empty), its status ("incomplete" when the output
// tokens ran out) and usage.
func (o *responsesObject) complete(text string, finish sim.FinishReason, u *usage) {
	content := []responsesOutputText{}
	if text != "" {
		content = append(content, responsesOutputText{Annotations: []any{}, Text: text, Type: "output_text"})
	}
	o.Output = []responsesMessage{{ID: "msg_" + randomHex(), Content: content, Role: "assistant", Status: "completed", Type: "message"}}
	o.Status = "completed"
	if finish == sim.FinishLength {
		o.Status, o.IncompleteDetails = "incomplete", &responsesIncomplete{Reason: "max_output_tokens"}
	}
	o.Usage = &responsesUsage{
		InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens,
		InputTokensDetails: responsesInputDetails{CachedTokens: u.PromptTokensDetails.CachedTokens,
			InputTokensPerTurn: []int{}, CachedTokensPerTurn: []int{}},
		OutputTokensDetails: responsesOutputDetails{OutputTokensPerTurn: []int{}, ToolOutputTokensPerTurn: []int{}},
	}
}

type responsesIncomplete struct {
	Reason string `json:"reason"`
}

// responsesMessage is an output message item. Summary, which vLLM adds to
// the item of response.output_item.done, is left out when nil.
type responsesMessage struct {
	ID      string                `json:"id"`
	Content []responsesOutputText `json:"content"`
	Role    string                `json:"role"`
	Status  string                `json:"status"`
	Type    string                `json:"type"`
	Summary json.RawMessage       `json:"summary,omitempty"`
}

// responsesOutputText is an output_text content part; its logprobs are
// null unless set.
type responsesOutputText struct {
	Annotations []any           `json:"annotations"`
	Text        string          `json:"text"`
	Type        string          `json:"type"`
	Logprobs    json.RawMessage `json:"logprobs"`
}

// responsesUsage is the usage of vLLM's response object.
type responsesUsage struct {
	InputTokens         int                    `json:"input_tokens"`
	InputTokensDetails  responsesInputDetails  `json:"input_tokens_details"`
	OutputTokens        int                    `json:"output_tokens"`
	OutputTokensDetails responsesOutputDetails `json:"output_tokens_details"`
	TotalTokens         int                    `json:"total_tokens"`
}

type responsesInputDetails struct {
	CachedTokens        int   `json:"cached_tokens"`
	InputTokensPerTurn  []int `json:"input_tokens_per_turn"`
	CachedTokensPerTurn []int `json:"cached_tokens_per_turn"`
}

type responsesOutputDetails struct {
	ReasoningTokens         int   `json:"reasoning_tokens"`
	ToolOutputTokens        int   `json:"tool_output_tokens"`
	OutputTokensPerTurn     []int `json:"output_tokens_per_turn"`
	ToolOutputTokensPerTurn []int `json:"tool_output_tokens_per_turn"`
}

// responsesEvent is a streamed event, numbered when sent.
type responsesEvent interface{ setSequence(n int) }

type responsesLifecycleEvent struct {
	Response       *responsesObject `json:"response"`
	SequenceNumber int              `json:"sequence_number"`
	Type           string           `json:"type"`
}

type responsesItemEvent struct {
	Item           responsesMessage `json:"item"`
	OutputIndex    int              `json:"output_index"`
	SequenceNumber int              `json:"sequence_number"`
	Type           string           `json:"type"`
}

type responsesPartEvent struct {
	ContentIndex   int                 `json:"content_index"`
	ItemID         string              `json:"item_id"`
	OutputIndex    int                 `json:"output_index"`
	Part           responsesOutputText `json:"part"`
	SequenceNumber int                 `json:"sequence_number"`
	Type           string              `json:"type"`
}

type responsesDeltaEvent struct {
	ContentIndex   int    `json:"content_index"`
	Delta          string `json:"delta"`
	ItemID         string `json:"item_id"`
	Logprobs       []any  `json:"logprobs"`
	OutputIndex    int    `json:"output_index"`
	SequenceNumber int    `json:"sequence_number"`
	Type           string `json:"type"`
}

type responsesTextDoneEvent struct {
	ContentIndex   int    `json:"content_index"`
	ItemID         string `json:"item_id"`
	Logprobs       []any  `json:"logprobs"`
	OutputIndex    int    `json:"output_index"`
	SequenceNumber int    `json:"sequence_number"`
	Text           string `json:"text"`
	Type           string `json:"type"`
}

func (e *responsesLifecycleEvent) setSequence(n int) { e.SequenceNumber = n }
func (e *responsesItemEvent) setSequence(n int)      { e.SequenceNumber = n }
func (e *responsesPartEvent) setSequence(n int)      { e.SequenceNumber = n }
func (e *responsesDeltaEvent) setSequence(n int)     { e.SequenceNumber = n }
func (e *responsesTextDoneEvent) setSequence(n int)  { e.SequenceNumber = n }
