package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeVLLM serves POST /tokenize like vLLM's OpenAI server: it tells the
// completion form from the chat form, checks the model and the fields as
// vLLM's request models do, renders chat messages with a ChatML-like
// template that reads every variable vLLM passes to chat templates, and
// tokenizes with a byte-level vocabulary plus special tokens. Errors use
// vLLM's ErrorResponse shape.
type fakeVLLM struct {
	*httptest.Server
	models      map[string]bool // served model and adapter names
	maxModelLen int

	calls atomic.Int64 // /tokenize requests received

	mu     sync.Mutex
	bodies [][]byte // request bodies, in arrival order

	// arrived is closed when the first request has been read.
	arrived chan struct{}
	once    sync.Once
	// block, when set, holds every answer until it is closed or the
	// client goes away.
	block chan struct{}
	// handle, when set, answers instead of the fake.
	handle http.HandlerFunc
}

// Token ids of the fake vocabulary: byte b is id b+byteBase.
const (
	bosID    = 1
	byteBase = 10
)

var specialTokens = map[string]uint32{
	"<|im_start|>": 1000,
	"<|im_end|>":   1001,
	"<think>":      1002,
}

func newFakeVLLM(t testing.TB, models ...string) *fakeVLLM {
	t.Helper()
	f := &fakeVLLM{models: map[string]bool{}, maxModelLen: 4096, arrived: make(chan struct{})}
	for _, m := range models {
		f.models[m] = true
	}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeVLLM) requestBodies() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.bodies...)
}

func (f *fakeVLLM) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/tokenize" || r.Method != http.MethodPost {
		vllmError(w, http.StatusNotFound, "NotFoundError", "Not Found")
		return
	}
	f.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.mu.Unlock()
	f.once.Do(func() { close(f.arrived) })
	if f.block != nil {
		select {
		case <-f.block:
		case <-r.Context().Done():
			return
		}
	}
	if f.handle != nil {
		f.handle(w, r)
		return
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		vllmError(w, http.StatusUnsupportedMediaType, "Unsupported Media Type", "Only 'application/json' is allowed")
		return
	}
	text, addSpecial, status, msg := f.render(body)
	if status != http.StatusOK {
		vllmError(w, status, "BadRequestError", msg)
		return
	}
	tokens := fakeEncode(text, addSpecial)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"count": len(tokens), "max_model_len": f.maxModelLen, "tokens": tokens, "token_strs": nil,
	})
}

// vllmError writes vLLM's ErrorResponse.
func vllmError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status},
	})
}

// tokenizeRequest is the union of vLLM's TokenizeCompletionRequest and
// TokenizeChatRequest.
type tokenizeRequest struct {
	Model                *string          `json:"model"`
	Prompt               *string          `json:"prompt"`
	Messages             []fakeMessage    `json:"messages"`
	AddSpecialTokens     *bool            `json:"add_special_tokens"`
	AddGenerationPrompt  *bool            `json:"add_generation_prompt"`
	ContinueFinalMessage *bool            `json:"continue_final_message"`
	ChatTemplate         *string          `json:"chat_template"`
	ChatTemplateKwargs   map[string]any   `json:"chat_template_kwargs"`
	Tools                []map[string]any `json:"tools"`
	MMProcessorKwargs    map[string]any   `json:"mm_processor_kwargs"`
	MediaIOKwargs        map[string]any   `json:"media_io_kwargs"`
}

type fakeMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// render returns the text vLLM would tokenize for body and whether to add
// special tokens, or an error status and message.
func (f *fakeVLLM) render(body []byte) (text string, addSpecial bool, status int, msg string) {
	var req tokenizeRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&req); err != nil {
		return "", false, http.StatusBadRequest, "invalid request: " + err.Error()
	}
	if req.Model != nil && !f.models[*req.Model] {
		return "", false, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", *req.Model)
	}
	switch {
	case req.Messages != nil:
		agp, cfm := boolOr(req.AddGenerationPrompt, true), boolOr(req.ContinueFinalMessage, false)
		if agp && cfm {
			return "", false, http.StatusBadRequest, "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
		}
		text, err := renderChat(&req, agp, cfm)
		if err != nil {
			return "", false, http.StatusBadRequest, err.Error()
		}
		return text, boolOr(req.AddSpecialTokens, false), http.StatusOK, ""
	case req.Prompt != nil:
		return *req.Prompt, boolOr(req.AddSpecialTokens, true), http.StatusOK, ""
	}
	return "", false, http.StatusBadRequest, "request has neither prompt nor messages"
}

// renderChat is the fake's chat template. It reads the variables vLLM
// passes to templates, so that a test can see each one arrive: the
// chat_template override, tools, documents, reasoning_effort,
// enable_thinking, add_generation_prompt and continue_final_message.
func renderChat(req *tokenizeRequest, agp, cfm bool) (string, error) {
	kw := req.ChatTemplateKwargs
	var b strings.Builder
	if req.ChatTemplate != nil && *req.ChatTemplate != "" {
		fmt.Fprintf(&b, "[template %s]\n", *req.ChatTemplate)
	}
	if req.Tools != nil {
		tools, _ := json.Marshal(req.Tools)
		fmt.Fprintf(&b, "<tools>%s</tools>\n", tools)
	}
	if docs, ok := kw["documents"]; ok {
		d, _ := json.Marshal(docs)
		fmt.Fprintf(&b, "<docs>%s</docs>\n", d)
	}
	if effort, ok := kw["reasoning_effort"]; ok {
		fmt.Fprintf(&b, "<effort>%v</effort>\n", effort)
	}
	for i, m := range req.Messages {
		content, err := messageText(m.Content)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "<|im_start|>%s\n%s", m.Role, content)
		if !(cfm && i == len(req.Messages)-1) {
			b.WriteString("<|im_end|>\n")
		}
	}
	if agp {
		b.WriteString("<|im_start|>assistant\n")
		if kw["enable_thinking"] == true {
			b.WriteString("<think>\n")
		}
	}
	return b.String(), nil
}

// messageText returns a message's content: a string or a list of text parts.
func messageText(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("message content is neither a string nor parts: %w", err)
	}
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// fakeEncode tokenizes text with the fake vocabulary.
func fakeEncode(text string, addSpecial bool) []uint32 {
	ids := []uint32{}
	if addSpecial {
		ids = append(ids, bosID)
	}
next:
	for len(text) > 0 {
		for s, id := range specialTokens {
			if strings.HasPrefix(text, s) {
				ids = append(ids, id)
				text = text[len(s):]
				continue next
			}
		}
		ids = append(ids, uint32(text[0])+byteBase)
		text = text[1:]
	}
	return ids
}
