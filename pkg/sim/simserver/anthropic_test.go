package simserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// convertAnthropic is simanthropic.Convert, which this package's tests
// cannot import: vLLM's conversion, by package tokenizer.
func convertAnthropic(body []byte, countTokens bool) (*AnthropicChat, error) {
	convert := tokenizer.ChatFromAnthropic
	if countTokens {
		convert = tokenizer.ChatFromAnthropicCountTokens
	}
	chat, err := convert(body)
	if err != nil {
		var te *tokenizer.Error
		if errors.As(err, &te) && te.Reason == tokenizer.ReasonUnsupported {
			return nil, fmt.Errorf("%w: %v", ErrAnthropicUnsupported, te.Err)
		}
		if errors.As(err, &te) {
			return nil, te.Err
		}
		return nil, err
	}
	out := &AnthropicChat{Model: chat.Model, Messages: chat.Messages, Tools: chat.Tools, ChatTemplateKwargs: chat.ChatTemplateKwargs,
		ReasoningEffort: chat.ReasoningEffort}
	if chat.MaxTokens != nil {
		out.MaxTokens = *chat.MaxTokens
	}
	return out, nil
}

// storedBlocks returns the BlockStored events published so far, without
// their times.
func (m *memSink) storedBlocks() []kvevent.BlockStoredEvent {
	var out []kvevent.BlockStoredEvent
	for _, b := range m.snapshot() {
		for _, ev := range b.Events {
			if st, ok := ev.(*kvevent.BlockStoredEvent); ok {
				c := *st
				c.Timestamp = time.Time{}
				out = append(out, c)
			}
		}
	}
	return out
}

// messagesResp mirrors a whole Messages response.
type messagesResp struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Model   string `json:"model"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StopReason *string         `json:"stop_reason"`
	Usage      json.RawMessage `json:"usage"`
}

// anthropicEvent is one event of a streamed Messages response.
type anthropicEvent struct {
	name string
	data string
}

// anthropicEvents splits a Messages stream into its events, checking the
// framing: "event: <name>", "data: <json>", a blank line.
func anthropicEvents(t *testing.T, body []byte) []anthropicEvent {
	t.Helper()
	text := string(body)
	if !strings.HasSuffix(text, "\n\n") {
		t.Fatalf("stream does not end with a blank line: %q", text)
	}
	var out []anthropicEvent
	for _, ev := range strings.Split(strings.TrimSuffix(text, "\n\n"), "\n\n") {
		head, data, ok := strings.Cut(ev, "\n")
		name, okName := strings.CutPrefix(head, "event: ")
		data, okData := strings.CutPrefix(data, "data: ")
		if !ok || !okName || !okData || strings.Contains(data, "\n") {
			t.Fatalf("malformed event %q", ev)
		}
		out = append(out, anthropicEvent{name, data})
	}
	return out
}

// equivalentChat returns the chat completion request vLLM serves for an
// Anthropic Messages body.
func equivalentChat(t *testing.T, body string) map[string]any {
	t.Helper()
	chat, err := tokenizer.ChatFromAnthropic([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(chat)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

const (
	plainMessages = `{"model":"` + testModel + `","max_tokens":4,"system":"Be brief.",` +
		`"messages":[{"role":"user","content":"Why route requests by prefix?"}]}`
	toolMessages = `{"model":"` + testModel + `","max_tokens":4,` +
		`"system":[{"type":"text","text":"x-anthropic-billing-header: cc=1;"},{"type":"text","text":"You answer with tools."}],` +
		`"tools":[{"name":"weather","description":"Current weather","input_schema":{"properties":{"city":{"type":"string"}}}}],` +
		`"messages":[{"role":"user","content":"What is the weather in Paris?"},` +
		`{"role":"assistant","content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Paris"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"18 C, sunny"},{"type":"text","text":"Thanks!"}]}]}`
)

// plainChat is the chat vLLM builds from plainMessages, written out.
var plainChat = map[string]any{"model": testModel, "max_tokens": 4, "messages": []map[string]any{
	{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why route requests by prefix?"},
}}

func TestMessagesAnswerInAnthropicsFormWithTheEquivalentChatsUsage(t *testing.T) {
	ts := startServer(t, 1, nil)
	status, body := ts.post(t, "/v1/chat/completions", plainChat)
	if status != http.StatusOK {
		t.Fatalf("chat: status %d: %s", status, body)
	}
	chat := decode[completionResp](t, body)

	status, body = ts.postRaw(t, "/v1/messages", plainMessages)
	if status != http.StatusOK {
		t.Fatalf("messages: status %d: %s", status, body)
	}
	got := decode[messagesResp](t, body)
	if !strings.HasPrefix(got.ID, "chatcmpl-") || got.Type != "message" || got.Role != "assistant" || got.Model != testModel {
		t.Errorf("response %s: want a message of the assistant from %s with a chatcmpl- id", body, testModel)
	}
	if len(got.Content) != 1 || got.Content[0].Type != "text" || got.Content[0].Text != chat.Choices[0].Message.Content {
		t.Errorf("content %+v: want one text block holding the chat's answer %q", got.Content, chat.Choices[0].Message.Content)
	}
	if got.StopReason == nil || *got.StopReason != "max_tokens" {
		t.Errorf("stop_reason %v: want max_tokens for a chat finished by length", got.StopReason)
	}
	wantUsage := `{"input_tokens":` + itoa(chat.Usage.PromptTokens) + `,"output_tokens":4}`
	if string(got.Usage) != wantUsage {
		t.Errorf("usage %s, want %s (the chat's prompt and completion tokens)", got.Usage, wantUsage)
	}
	if strings.Contains(string(body), "stop_sequence") {
		t.Errorf("response %s: vLLM leaves the null stop_sequence out", body)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestMessagesStreamSendsAnthropicsEventsInOrder(t *testing.T) {
	ts := startServer(t, 1, nil)
	_, body := ts.post(t, "/v1/chat/completions", plainChat)
	chat := decode[completionResp](t, body)
	prompt := chat.Usage.PromptTokens

	for _, stream := range []string{`true`, `"yes"`, `1`} {
		t.Run("stream "+stream, func(t *testing.T) {
			status, body := ts.postRaw(t, "/v1/messages", strings.Replace(plainMessages, `{`, `{"stream":`+stream+`,`, 1))
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			events := anthropicEvents(t, body)
			var names []string
			var text strings.Builder
			for _, ev := range events {
				names = append(names, ev.name)
				var data struct {
					Type string `json:"type"`
				}
				if err := json.Unmarshal([]byte(ev.data), &data); err != nil || data.Type != ev.name {
					t.Errorf("event %s data %s: want its type to be the event's name", ev.name, ev.data)
				}
				if ev.name == "content_block_delta" {
					d := decode[struct {
						Index int `json:"index"`
						Delta struct {
							Type string `json:"type"`
							Text string `json:"text"`
						} `json:"delta"`
					}](t, []byte(ev.data))
					if d.Index != 0 || d.Delta.Type != "text_delta" || d.Delta.Text == "" {
						t.Errorf("delta %s: want text_delta of block 0", ev.data)
					}
					text.WriteString(d.Delta.Text)
				}
			}
			// A delta per token that decodes to text: 1 to max_tokens.
			deltas := min(max(strings.Count(string(body), "event: content_block_delta\n"), 1), 4)
			want := []string{"message_start", "content_block_start"}
			for range deltas {
				want = append(want, "content_block_delta")
			}
			want = append(want, "content_block_stop", "message_delta", "message_stop")
			if !reflect.DeepEqual(names, want) {
				t.Fatalf("events %q, want %q", names, want)
			}
			for _, tc := range []struct {
				i    int
				want string
			}{
				{0, `{"type":"message_start","message":{"id":"` + chatID(t, events[0].data) + `","content":[],"model":"` + testModel +
					`","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":` + itoa(prompt) + `,"output_tokens":0}}}`},
				{1, `{"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}`},
				{len(events) - 3, `{"type":"content_block_stop","index":0}`},
				{len(events) - 2, `{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":` + itoa(prompt) + `,"output_tokens":4}}`},
				{len(events) - 1, `{"type":"message_stop"}`},
			} {
				if events[tc.i].data != tc.want {
					t.Errorf("event %d %s: data %s, want %s", tc.i, events[tc.i].name, events[tc.i].data, tc.want)
				}
			}
			if text.String() != chat.Choices[0].Message.Content {
				t.Errorf("streamed text %q, the chat's answer %q", text.String(), chat.Choices[0].Message.Content)
			}
		})
	}
}

// chatID returns the id of a message_start event's message, checking its
// form.
func chatID(t *testing.T, data string) string {
	t.Helper()
	id := decode[struct {
		Message struct {
			ID string `json:"id"`
		} `json:"message"`
	}](t, []byte(data)).Message.ID
	if !strings.HasPrefix(id, "chatcmpl-") {
		t.Errorf("message_start id %q: want a chatcmpl- id", id)
	}
	return id
}

func TestMessagesPublishTheEquivalentChatsKVEvents(t *testing.T) {
	qwen3 := qwen3Template(t)
	for _, tc := range []struct {
		name      string
		tokenizer func(*Config)
		messages  string
		chat      map[string]any // nil for the ChatFromAnthropic conversion
	}{
		{"system and user, simulator's tokenizer", nil, plainMessages, plainChat},
		{"tools, tool use and tool result, simulator's tokenizer", nil, toolMessages, nil},
		{"system and user, Qwen3's template", qwen3, plainMessages, plainChat},
		{"tools, tool use and tool result, Qwen3's template", qwen3, toolMessages, nil},
		{"streamed, Qwen3's template", qwen3, strings.Replace(toolMessages, `{`, `{"stream":true,`, 1), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chat := tc.chat
			if chat == nil {
				chat = equivalentChat(t, tc.messages)
			}
			publishesTheEquivalentChatsKVEvents(t, tc.tokenizer, "/v1/messages", tc.messages, chat)
		})
	}
}

// qwen3Template configures a server to render with Qwen3's tokenizer and
// chat template.
func qwen3Template(t *testing.T) func(*Config) {
	return func(c *Config) {
		tk, err := hf.Load(filepath.Join(testsupport.TokenizerModels(t), "qwen3"))
		if err != nil {
			t.Fatal(err)
		}
		c.Tokenizer = tk
	}
}

// publishesTheEquivalentChatsKVEvents checks that body, posted to path on
// a server configured by tokenizer, stores the blocks chat, its equivalent
// chat completion request, stores on another such server.
func publishesTheEquivalentChatsKVEvents(t *testing.T, tokenizer func(*Config), path, body string, chat map[string]any) {
	t.Helper()
	viaChat := startServer(t, 1, tokenizer)
	if status, out := viaChat.post(t, "/v1/chat/completions", chat); status != http.StatusOK {
		t.Fatalf("chat: status %d: %s", status, out)
	}
	viaPath := startServer(t, 1, tokenizer)
	if status, out := viaPath.postRaw(t, path, body); status != http.StatusOK {
		t.Fatalf("%s: status %d: %s", path, status, out)
	}
	want, got := viaChat.sinks[0].storedBlocks(), viaPath.sinks[0].storedBlocks()
	if len(want) == 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("%s request stored blocks\n%+v\nthe equivalent chat\n%+v", path, got, want)
	}
}

func TestCountTokensGivesTheEquivalentChatsPromptLength(t *testing.T) {
	ts := startServer(t, 1, nil)
	for _, body := range []string{plainMessages, toolMessages} {
		_, out := ts.post(t, "/tokenize", map[string]any{"messages": equivalentChat(t, body)["messages"]})
		n := decode[tokenizeResponse](t, out).Count
		status, out := ts.postRaw(t, "/v1/messages/count_tokens", body)
		want := `{"input_tokens":` + itoa(n) + `,"context_management":{"original_input_tokens":` + itoa(n) + `}}` + "\n"
		if status != http.StatusOK || string(out) != want {
			t.Errorf("count_tokens: status %d %s, want %s", status, out, want)
		}
	}
}

func TestMessagesRequestsTheSimulatorCannotServeGetAnthropicErrors(t *testing.T) {
	ts := startServer(t, 1, nil)
	image := `{"model":"` + testModel + `","max_tokens":4,"messages":[{"role":"user","content":[` +
		`{"type":"image","source":{"type":"url","url":"https://example.com/cat.png"}},{"type":"text","text":"What is this?"}]}]}`
	for _, tc := range []struct {
		name, path, body string
		status           int
		kind, message    string
	}{
		{"image", "/v1/messages", image, http.StatusBadRequest, "BadRequestError", "the simulator cannot render this request"},
		{"image counted", "/v1/messages/count_tokens", strings.Replace(image, `"max_tokens":4,`, "", 1),
			http.StatusBadRequest, "BadRequestError", "the simulator cannot render this request"},
		{"no max_tokens", "/v1/messages", strings.Replace(plainMessages, `"max_tokens":4,`, "", 1),
			http.StatusBadRequest, "BadRequestError", "max_tokens is required"},
		{"max_tokens 0", "/v1/messages", strings.Replace(plainMessages, `"max_tokens":4`, `"max_tokens":0`, 1),
			http.StatusBadRequest, "BadRequestError", "max_tokens must be positive"},
		{"stream maybe", "/v1/messages", strings.Replace(plainMessages, `{`, `{"stream":"maybe",`, 1),
			http.StatusBadRequest, "BadRequestError", "stream"},
		{"not JSON", "/v1/messages", `{"model":`, http.StatusBadRequest, "BadRequestError", "not valid JSON"},
		{"unknown model", "/v1/messages", strings.Replace(plainMessages, testModel, "other-model", 1),
			http.StatusNotFound, "NotFoundError", "`other-model` does not exist"},
		{"unknown model counted", "/v1/messages/count_tokens", strings.Replace(plainMessages, testModel, "other-model", 1),
			http.StatusNotFound, "NotFoundError", "`other-model` does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := ts.postRaw(t, tc.path, tc.body)
			e := decode[anthropicError](t, body)
			if status != tc.status || e.Type != "error" || e.Error.Type != tc.kind || !strings.Contains(e.Error.Message, tc.message) {
				t.Errorf("status %d %s, want %d with an Anthropic error of type %s saying %q", status, body, tc.status, tc.kind, tc.message)
			}
		})
	}
}

func TestStoppingTheEnginesFailsOpenMessagesRequestsInAnthropicsForm(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream bool
	}{{"whole", false}, {"streamed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, 1, func(c *Config) { c.Ranks[0].Engine.Latency.StepOverhead = 50 * time.Millisecond })
			body := strings.Replace(plainMessages, `"max_tokens":4`, `"max_tokens":400`, 1)
			if tc.stream {
				body = strings.Replace(body, `{`, `{"stream":true,`, 1)
			}
			done := make(chan struct{})
			var status int
			var out []byte
			go func() {
				defer close(done)
				status, out = ts.postRaw(t, "/v1/messages", body)
			}()
			testsupport.Eventually(t, "the request to start", func() bool { return ts.queue(0).Running == 1 })
			ts.runners[0].stop()
			<-done
			if !tc.stream {
				e := decode[anthropicError](t, out)
				if status != http.StatusServiceUnavailable || e.Type != "error" || e.Error.Type != "ServiceUnavailableError" ||
					e.Error.Message != errStopped.Error() {
					t.Errorf("open request got %d %s, want 503 with an Anthropic error %q", status, out, errStopped)
				}
				return
			}
			events := anthropicEvents(t, out)
			last := events[len(events)-1]
			want := `{"type":"error","error":{"type":"internal_error","message":"` + errStopped.Error() + `"}}`
			// message_start comes with the first token, which the engine
			// may have stopped before.
			if status != http.StatusOK || (events[0].name != "message_start" && len(events) > 1) || last.name != "error" || last.data != want {
				t.Errorf("open stream got %d with events %+v, want message_start first (if a token came) and the error event %s last",
					status, events, want)
			}
		})
	}
}

func TestHangingUpAMessagesStreamAbortsItsEngineRequest(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) { c.Ranks[0].Engine.Latency.StepOverhead = 20 * time.Millisecond })
	body := strings.Replace(strings.Replace(plainMessages, `"max_tokens":4`, `"max_tokens":400`, 1), `{`, `{"stream":true,`, 1)
	ctx, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/v1/messages", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "event: message_start\n" {
		t.Fatalf("first line %q: %v", line, err)
	}
	testsupport.Eventually(t, "the request to start", func() bool { return ts.queue(0).Running == 1 })
	hangUp()
	testsupport.Eventually(t, "the engine request to be aborted", func() bool {
		q := ts.queue(0)
		return q.Running == 0 && q.Waiting == 0
	})
}

func TestMessagesStreamStartsWithTheFirstToken(t *testing.T) {
	// One request runs at a time: the second waits until the first ends,
	// and vLLM sends message_start with the chat stream's first chunk, once
	// the request has run and generated its first token.
	ts := startServer(t, 1, func(c *Config) {
		c.Ranks[0].Engine.MaxNumSeqs = 1
		c.Ranks[0].Engine.Latency.StepOverhead = 20 * time.Millisecond
	})
	stream := func(maxTokens string) string {
		return strings.Replace(strings.Replace(plainMessages, `"max_tokens":4`, `"max_tokens":`+maxTokens, 1), `{`, `{"stream":true,`, 1)
	}
	first, err := http.Post(ts.url+"/v1/messages", "application/json", strings.NewReader(stream("100")))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	testsupport.Eventually(t, "the first request to run", func() bool { return ts.queue(0).Running == 1 })

	type start struct {
		line    string
		waiting int
		err     error
	}
	started := make(chan start, 1)
	go func() {
		resp, err := http.Post(ts.url+"/v1/messages", "application/json", strings.NewReader(stream("2")))
		if err != nil {
			started <- start{err: err}
			return
		}
		defer resp.Body.Close()
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		started <- start{line: line, waiting: ts.queue(0).Waiting, err: err}
	}()
	select {
	case s := <-started:
		if s.err != nil || s.line != "event: message_start\n" {
			t.Fatalf("the second stream began with %q: %v", s.line, s.err)
		}
		if s.waiting != 0 {
			t.Errorf("message_start came while the request waited for the engine (%d waiting); vLLM sends it with the first token", s.waiting)
		}
	case <-time.After(testsupport.WaitTimeout):
		t.Fatal("the second stream never started")
	}
}
