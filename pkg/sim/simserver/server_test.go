package simserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/sim"
)

const (
	testModel = "sim-model"
	testBS    = 4
)

// memSink records published batches for tests.
type memSink struct {
	mu      sync.Mutex
	batches []*kvevent.EventBatch
}

func (m *memSink) Publish(b *kvevent.EventBatch) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches = append(m.batches, b)
	return nil
}

func (m *memSink) snapshot() []*kvevent.EventBatch {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.batches)
}

// storedTokens returns the token ids of every BlockStored event published so
// far, concatenated in order.
func (m *memSink) storedTokens() []uint32 {
	var out []uint32
	for _, b := range m.snapshot() {
		for _, ev := range b.Events {
			if st, ok := ev.(*kvevent.BlockStoredEvent); ok {
				out = append(out, st.TokenIDs...)
			}
		}
	}
	return out
}

type testServer struct {
	*Server
	url   string
	sinks []*memSink
}

// fastLatency keeps steps short but nonzero.
var fastLatency = sim.LatencyModel{StepOverhead: 500 * time.Microsecond, PrefillPerToken: time.Microsecond, DecodePerToken: 10 * time.Microsecond}

// startServer runs a server with ranks engines until the test ends.
func startServer(t *testing.T, ranks int, mod func(*Config)) *testServer {
	t.Helper()
	ts := &testServer{}
	cfg := Config{Model: testModel, LoRAModules: []LoRAModule{{Name: "sql-lora", Path: "/adapters/sql"}, {Name: "chat-lora"}},
		Anthropic: convertAnthropic, Responses: convertResponses}
	for range ranks {
		sink := &memSink{}
		ts.sinks = append(ts.sinks, sink)
		cfg.Ranks = append(cfg.Ranks, Rank{
			Engine: sim.EngineConfig{BlockSize: testBS, NumGPUBlocks: 256, MaxModelLen: 512, HashSeed: "t",
				DefaultOutputTokens: 5, Latency: fastLatency},
			Sink: sink,
		})
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts.Server = s
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	hs := httptest.NewServer(s.Handler())
	ts.url = hs.URL
	t.Cleanup(func() {
		hs.Close()
		cancel()
		<-done
	})
	return ts
}

// queue returns the queue state of rank's engine.
func (ts *testServer) queue(rank int) sim.QueueState {
	r := ts.runners[rank]
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.engine.QueueState()
}

// post sends body as JSON and returns the status and response body.
func (ts *testServer) post(t *testing.T, path string, body any) (int, []byte) {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return ts.postRaw(t, path, string(data))
}

func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	return v
}

// completionResp mirrors the fields tests read from completion objects.
type completionResp struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// sseEvents splits a server-sent event stream into its data payloads,
// checking the framing: every event is one "data: " line followed by a
// blank line.
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	text := string(body)
	if !strings.HasSuffix(text, "\n\n") {
		t.Fatalf("stream does not end with a blank line: %q", text)
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(text, "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("malformed event %q", ev)
		}
		out = append(out, data)
	}
	return out
}

func TestCompletionReportsUsageWithCachedTokens(t *testing.T) {
	ts := startServer(t, 1, nil)
	req := map[string]any{"model": testModel, "prompt": "The KV cache of this prompt is reused by the second request.", "max_tokens": 6}
	want := sim.Tokenizer{}.Encode(req["prompt"].(string), true)

	status, body := ts.post(t, "/v1/completions", req)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	first := decode[completionResp](t, body)
	if first.Object != "text_completion" || !strings.HasPrefix(first.ID, "cmpl-") || first.Model != testModel {
		t.Errorf("response %+v: want a text_completion of %s with a cmpl- id", first, testModel)
	}
	if len(first.Choices) != 1 || first.Choices[0].Text == "" || *first.Choices[0].FinishReason != "length" {
		t.Fatalf("choices %+v: want one choice of text finished by length", first.Choices)
	}
	if u := first.Usage; u.PromptTokens != len(want) || u.CompletionTokens != 6 || u.TotalTokens != len(want)+6 ||
		u.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("first usage %+v, want %d prompt tokens (BOS included), 6 completion, none cached", u, len(want))
	}

	_, body = ts.post(t, "/v1/completions", req)
	second := decode[completionResp](t, body)
	if got, wantCached := second.Usage.PromptTokensDetails.CachedTokens, (len(want)-1)/testBS*testBS; got != wantCached {
		t.Errorf("second request cached %d tokens, want %d (every full block but the last token's)", got, wantCached)
	}
	if second.Choices[0].Text != first.Choices[0].Text {
		t.Errorf("same prompt generated %q then %q", first.Choices[0].Text, second.Choices[0].Text)
	}
}

func TestCompletionStreamFramesTokensAsServerSentEvents(t *testing.T) {
	ts := startServer(t, 1, nil)
	_, whole := ts.post(t, "/v1/completions", map[string]any{"prompt": "stream me", "max_tokens": 4})
	status, body := ts.post(t, "/v1/completions", map[string]any{
		"prompt": "stream me", "max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true},
	})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	events := sseEvents(t, body)
	if len(events) != 6 || events[5] != "[DONE]" {
		t.Fatalf("events %q: want 4 token chunks, a usage chunk and [DONE]", events)
	}
	var text strings.Builder
	for i, ev := range events[:4] {
		c := decode[completionResp](t, []byte(ev))
		if c.Object != "text_completion" || len(c.Choices) != 1 || c.Usage != nil {
			t.Fatalf("chunk %d %s: want one choice and no usage", i, ev)
		}
		if fin := c.Choices[0].FinishReason; (fin != nil) != (i == 3) || (i == 3 && *fin != "length") {
			t.Errorf("chunk %d finish_reason %v: only the last token's chunk finishes, by length", i, fin)
		}
		text.WriteString(c.Choices[0].Text)
	}
	u := decode[completionResp](t, []byte(events[4]))
	if len(u.Choices) != 0 || u.Usage == nil || u.Usage.CompletionTokens != 4 {
		t.Errorf("usage chunk %s: want no choices and 4 completion tokens", events[4])
	}
	if want := decode[completionResp](t, whole).Choices[0].Text; text.String() != want {
		t.Errorf("streamed text %q, whole response %q", text.String(), want)
	}
}

func TestChatStreamOpensWithTheAssistantRole(t *testing.T) {
	ts := startServer(t, 1, nil)
	status, body := ts.post(t, "/v1/chat/completions", map[string]any{
		"model":    testModel,
		"messages": []map[string]any{{"role": "user", "content": "Hello"}},
		"stream":   true,
	})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	events := sseEvents(t, body)
	// Role chunk, 5 tokens (the default output, the last one EOS), [DONE].
	if len(events) != 7 || events[6] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	first := decode[completionResp](t, []byte(events[0]))
	if first.Object != "chat.completion.chunk" || first.Choices[0].Delta == nil || first.Choices[0].Delta.Role == nil ||
		*first.Choices[0].Delta.Role != "assistant" || *first.Choices[0].Delta.Content != "" {
		t.Errorf("first chunk %s: want the assistant role and empty content", events[0])
	}
	last := decode[completionResp](t, []byte(events[5]))
	if fin := last.Choices[0].FinishReason; fin == nil || *fin != "stop" || *last.Choices[0].Delta.Content != "" {
		t.Errorf("last chunk %s: want finish_reason stop with the EOS token rendered empty", events[5])
	}
}

func TestChatCompletionAnswersWithAMessage(t *testing.T) {
	ts := startServer(t, 1, nil)
	status, body := ts.post(t, "/v1/chat/completions", map[string]any{
		"messages":              []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "Hi"}}}},
		"max_completion_tokens": 3,
		"n":                     2,
	})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	r := decode[completionResp](t, body)
	if r.Object != "chat.completion" || !strings.HasPrefix(r.ID, "chatcmpl-") || len(r.Choices) != 2 {
		t.Fatalf("response %s: want a chat.completion with 2 choices", body)
	}
	for i, c := range r.Choices {
		if c.Index != i || c.Message == nil || c.Message.Role != "assistant" || c.Message.Content == "" {
			t.Errorf("choice %d %+v: want an assistant message", i, c)
		}
	}
	if r.Choices[0].Message.Content == r.Choices[1].Message.Content {
		t.Error("the two choices generated the same text")
	}
	prompt := sim.Tokenizer{}.EncodeChat([]sim.ChatMessage{{Role: "user", Content: "Hi"}}, true)
	if u := r.Usage; u.PromptTokens != len(prompt) || u.CompletionTokens != 6 {
		t.Errorf("usage %+v: want the prompt counted once (%d) and 3 tokens per choice", u, len(prompt))
	}
}

func TestTokenizeGivesTheIDsTheEventsCarry(t *testing.T) {
	ts := startServer(t, 1, nil)
	prompt := "Routing by prefix needs the engine's own token ids, block by block."
	status, body := ts.post(t, "/tokenize", map[string]any{"model": testModel, "prompt": prompt})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	tok := decode[tokenizeResponse](t, body)
	if tok.Count != len(tok.Tokens) || tok.MaxModelLen != 512 || tok.Tokens[0] != sim.BOSID {
		t.Fatalf("tokenize %+v: want count, max_model_len 512 and a BOS first", tok)
	}
	ts.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
	full := len(tok.Tokens) / testBS * testBS
	if got := ts.sinks[0].storedTokens(); !slices.Equal(got, tok.Tokens[:full]) {
		t.Errorf("events stored %v, /tokenize gave %v", got, tok.Tokens[:full])
	}

	msgs := []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why route by prefix?"}}
	_, body = ts.post(t, "/tokenize", map[string]any{"messages": msgs})
	chat := decode[tokenizeResponse](t, body)
	before := len(ts.sinks[0].storedTokens())
	ts.post(t, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 1})
	full = len(chat.Tokens) / testBS * testBS
	if got := ts.sinks[0].storedTokens()[before:]; !slices.Equal(got, chat.Tokens[:full]) {
		t.Errorf("chat events stored %v, /tokenize of the messages gave %v", got, chat.Tokens[:full])
	}
	if chat.Tokens[0] != sim.IMStartID {
		t.Errorf("chat tokens start with %d, want <|im_start|> and no BOS", chat.Tokens[0])
	}
}

func TestTokenizeOptions(t *testing.T) {
	ts := startServer(t, 1, nil)
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	for _, tc := range []struct {
		name string
		body map[string]any
		want []uint32
	}{
		{"prompt without special tokens", map[string]any{"prompt": "hi there", "add_special_tokens": false},
			sim.Tokenizer{}.Encode("hi there", false)},
		{"messages without generation prompt", map[string]any{"messages": msgs, "add_generation_prompt": false},
			sim.Tokenizer{}.EncodeChat([]sim.ChatMessage{{Role: "user", Content: "hi"}}, false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := ts.post(t, "/tokenize", tc.body)
			if got := decode[tokenizeResponse](t, body); status != http.StatusOK || !slices.Equal(got.Tokens, tc.want) {
				t.Errorf("status %d tokens %v, want %v", status, got.Tokens, tc.want)
			}
		})
	}
}

func TestBadRequestsGetOpenAIErrors(t *testing.T) {
	ts := startServer(t, 1, nil)
	for _, tc := range []struct {
		name   string
		path   string
		body   any
		status int
	}{
		{"unknown model", "/v1/completions", map[string]any{"model": "gpt-9", "prompt": "x"}, 404},
		{"prompt too long", "/v1/completions", map[string]any{"prompt": strings.Repeat("word ", 600)}, 400},
		{"max tokens beyond the model length", "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 600}, 400},
		{"missing prompt", "/v1/completions", map[string]any{"max_tokens": 2}, 400},
		{"token id out of vocabulary", "/v1/completions", map[string]any{"prompt": []int{1, 99999}}, 400},
		{"negative token id", "/v1/completions", map[string]any{"prompt": []int{1, -2}}, 400},
		{"zero choices", "/v1/completions", map[string]any{"prompt": "x", "n": 0}, 400},
		{"zero max tokens", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "x"}}, "max_tokens": 0}, 400},
		{"no messages", "/v1/chat/completions", map[string]any{"messages": []any{}}, 400},
		{"image content", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user",
			"content": []map[string]any{{"type": "image_url", "image_url": map[string]any{"url": "x"}}}}}}, 400},
		{"tokenize both prompt and messages", "/tokenize", map[string]any{"prompt": "x", "messages": []map[string]any{{"role": "user", "content": "x"}}}, 400},
		{"not JSON", "/v1/completions", "{", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := ts.post(t, tc.path, tc.body)
			if status != tc.status {
				t.Fatalf("status %d (%s), want %d", status, body, tc.status)
			}
			e := decode[apiError](t, body)
			if e.Error.Code != tc.status || e.Error.Message == "" || e.Error.Type == "" {
				t.Errorf("error body %s", body)
			}
		})
	}
	if q := ts.queue(0); q.Waiting+q.Running != 0 {
		t.Errorf("rejected requests left work behind: %+v", q)
	}
}

func TestBatchedPromptsGetOneChoiceEach(t *testing.T) {
	ts := startServer(t, 1, nil)
	status, body := ts.post(t, "/v1/completions", map[string]any{
		"prompt": []any{"first prompt", "second prompt"}, "max_tokens": 2, "n": 2,
	})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	r := decode[completionResp](t, body)
	want := len(sim.Tokenizer{}.Encode("first prompt", true)) + len(sim.Tokenizer{}.Encode("second prompt", true))
	if len(r.Choices) != 4 || r.Usage.PromptTokens != want || r.Usage.CompletionTokens != 8 {
		t.Errorf("%d choices, usage %+v: want 4 choices, %d prompt tokens, 8 completion tokens", len(r.Choices), r.Usage, want)
	}
	status, body = ts.post(t, "/v1/completions", map[string]any{"prompt": [][]int{{5, 6, 7}, {8, 9}}, "max_tokens": 1})
	if r := decode[completionResp](t, body); status != http.StatusOK || len(r.Choices) != 2 || r.Usage.PromptTokens != 5 {
		t.Errorf("token-id prompts: status %d, %s", status, body)
	}
}

// models reads /v1/models.
func (ts *testServer) models(t *testing.T) []modelCard {
	t.Helper()
	resp, err := http.Get(ts.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	list := decode[struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}](t, body)
	if resp.StatusCode != http.StatusOK || list.Object != "list" {
		t.Fatalf("/v1/models: %d %s", resp.StatusCode, body)
	}
	return list.Data
}

// cardSummary describes a model card as "id root parent max_model_len".
func cardSummary(c modelCard) string {
	parent, maxLen := "null", "null"
	if c.Parent != nil {
		parent = *c.Parent
	}
	if c.MaxModelLen != nil {
		maxLen = fmt.Sprint(*c.MaxModelLen)
	}
	return strings.Join([]string{c.ID, c.Root, parent, maxLen}, " ")
}

func TestModelsListsTheModelAndItsAdaptersAsVLLMDoes(t *testing.T) {
	ts := startServer(t, 1, nil)
	var got []string
	for _, c := range ts.models(t) {
		got = append(got, cardSummary(c))
		if c.Object != "model" || c.OwnedBy != "vllm" || len(c.Permission) != 1 || c.Permission[0].Object != "model_permission" {
			t.Errorf("card %+v: want vLLM's object, owner and one permission", c)
		}
	}
	// vLLM's root is an adapter's path; an adapter given without one is
	// rooted at its name.
	want := []string{testModel + " " + testModel + " null 512", "sql-lora /adapters/sql " + testModel + " null",
		"chat-lora chat-lora " + testModel + " null"}
	if !slices.Equal(got, want) {
		t.Errorf("model cards %q, want %q", got, want)
	}
	hr, err := http.Get(ts.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	hr.Body.Close()
	if hr.StatusCode != http.StatusOK {
		t.Errorf("/health %d", hr.StatusCode)
	}
}

func TestModelsListsTheModelsPathAsRootWhenItIsServedUnderAnotherName(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) { c.ModelPath = "/models/Llama-3.1-8B" })
	var got []string
	for _, c := range ts.models(t) {
		got = append(got, cardSummary(c))
	}
	// As vLLM's --served-model-name: the card's id is the served name, its
	// root the model's path, and adapters name the served name as parent.
	want := []string{testModel + " /models/Llama-3.1-8B null 512", "sql-lora /adapters/sql " + testModel + " null",
		"chat-lora chat-lora " + testModel + " null"}
	if !slices.Equal(got, want) {
		t.Errorf("model cards %q, want %q", got, want)
	}
}

func TestLoRAAdaptersLoadAndUnloadAtRuntime(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) { c.AllowRuntimeLoRAUpdating = true })
	steps := []struct {
		path   string
		body   map[string]any
		status int
		answer string
	}{
		{"/v1/load_lora_adapter", map[string]any{"lora_name": "runtime-lora", "lora_path": "/adapters/runtime"}, http.StatusOK,
			"Success: LoRA adapter 'runtime-lora' added successfully."},
		{"/v1/load_lora_adapter", map[string]any{"lora_name": "runtime-lora", "lora_path": "/elsewhere"}, http.StatusBadRequest,
			"has already been loaded"},
		{"/v1/load_lora_adapter", map[string]any{"lora_name": "no-path"}, http.StatusBadRequest, "must be provided"},
		{"/v1/load_lora_adapter", map[string]any{"lora_name": testModel, "lora_path": "/x"}, http.StatusBadRequest, "differ from the model"},
		{"/v1/unload_lora_adapter", map[string]any{}, http.StatusBadRequest, "needs to be provided"},
		{"/v1/unload_lora_adapter", map[string]any{"lora_name": "unknown"}, http.StatusNotFound, "cannot be found"},
	}
	for _, st := range steps {
		if status, body := ts.post(t, st.path, st.body); status != st.status || !strings.Contains(string(body), st.answer) {
			t.Errorf("%s %v: %d %s; want %d and %q", st.path, st.body, status, body, st.status, st.answer)
		}
	}
	cards := ts.models(t)
	if got := cardSummary(cards[len(cards)-1]); got != "runtime-lora /adapters/runtime "+testModel+" null" {
		t.Fatalf("card of the loaded adapter: %s", got)
	}

	// The adapter serves requests, with the next engine id after the two
	// adapters loaded at start.
	status, body := ts.post(t, "/v1/completions", map[string]any{"model": "runtime-lora", "prompt": "a prompt of a few blocks", "max_tokens": 1})
	if status != http.StatusOK {
		t.Fatalf("completion with the loaded adapter: %d %s", status, body)
	}
	batches := ts.sinks[0].snapshot()
	if st := batches[len(batches)-1].Events[0].(*kvevent.BlockStoredEvent); st.LoraName != "runtime-lora" || st.LoraID != 3 {
		t.Errorf("the loaded adapter's event names %q id %d, want runtime-lora id 3", st.LoraName, st.LoraID)
	}

	if status, body := ts.post(t, "/v1/unload_lora_adapter", map[string]any{"lora_name": "runtime-lora"}); status != http.StatusOK {
		t.Fatalf("unload: %d %s", status, body)
	}
	if n := len(ts.models(t)); n != 3 {
		t.Errorf("%d models listed after unloading, want the model and its two adapters", n)
	}
	if status, _ := ts.post(t, "/v1/completions", map[string]any{"model": "runtime-lora", "prompt": "x"}); status != http.StatusNotFound {
		t.Errorf("completion with the unloaded adapter: %d, want 404", status)
	}
}

func TestRuntimeLoRAEndpointsNeedTheOption(t *testing.T) {
	ts := startServer(t, 1, nil)
	status, _ := ts.post(t, "/v1/load_lora_adapter", map[string]any{"lora_name": "a", "lora_path": "/a"})
	if status != http.StatusNotFound {
		t.Errorf("load without the option: %d, want 404", status)
	}
}

func TestLoRARequestsAreHashedApartAndNamedInEvents(t *testing.T) {
	ts := startServer(t, 1, nil)
	prompt := "an adapter request shares no blocks with the base model"
	ts.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
	status, body := ts.post(t, "/v1/completions", map[string]any{"model": "chat-lora", "prompt": prompt, "max_tokens": 1})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	if r := decode[completionResp](t, body); r.Usage.PromptTokensDetails.CachedTokens != 0 || r.Model != "chat-lora" {
		t.Errorf("adapter request %s: want no cache hits on base-model blocks", body)
	}
	batches := ts.sinks[0].snapshot()
	st := batches[len(batches)-1].Events[0].(*kvevent.BlockStoredEvent)
	if st.LoraName != "chat-lora" || st.LoraID != 2 {
		t.Errorf("adapter event names %q id %d, want chat-lora id 2", st.LoraName, st.LoraID)
	}
}

// TestStreamOptionsAskForUsageUnlessIncludeUsageIsFalse follows vLLM's
// StreamOptions, whose include_usage defaults to true: stream_options
// without it ask for the usage chunk, and false or null do not.
func TestStreamOptionsAskForUsageUnlessIncludeUsageIsFalse(t *testing.T) {
	ts := startServer(t, 1, nil)
	for _, tt := range []struct {
		name    string
		options any
		usage   bool
	}{
		{"no stream_options", nil, false},
		{"empty stream_options", map[string]any{}, true},
		{"continuous_usage_stats only", map[string]any{"continuous_usage_stats": false}, true},
		{"include_usage true", map[string]any{"include_usage": true}, true},
		{"include_usage false", map[string]any{"include_usage": false}, false},
		{"include_usage null", map[string]any{"include_usage": nil}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := map[string]any{"prompt": "stream me", "max_tokens": 2, "stream": true}
			if tt.options != nil {
				req["stream_options"] = tt.options
			}
			status, body := ts.post(t, "/v1/completions", req)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			events := sseEvents(t, body)
			usage := len(events) > 1 && decode[completionResp](t, []byte(events[len(events)-2])).Usage != nil
			if usage != tt.usage {
				t.Errorf("events %q: usage chunk %v, want %v", events, usage, tt.usage)
			}
		})
	}
}
