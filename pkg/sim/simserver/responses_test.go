package simserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// convertResponses converts the Responses bodies these tests send, a
// string input, or a list of messages with string content, with optional
// instructions, as vLLM does: the instructions become a system message,
// a string input a user message and each input message a message of its
// role. It refuses a body without input, and reports other input as
// unsupported.
func convertResponses(body []byte) (*ResponsesChat, error) {
	var req struct {
		Input        json.RawMessage `json:"input"`
		Instructions *string         `json:"instructions"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("not valid JSON: %v", err)
	}
	if len(req.Input) == 0 {
		return nil, errors.New("input is required")
	}
	var msgs []map[string]string
	if req.Instructions != nil && *req.Instructions != "" {
		msgs = append(msgs, map[string]string{"role": "system", "content": *req.Instructions})
	}
	var input string
	var items []map[string]string
	switch {
	case json.Unmarshal(req.Input, &input) == nil:
		msgs = append(msgs, map[string]string{"role": "user", "content": input})
	case json.Unmarshal(req.Input, &items) == nil:
		for _, item := range items {
			msgs = append(msgs, map[string]string{"role": item["role"], "content": item["content"]})
		}
	default:
		return nil, fmt.Errorf("%w: input items", ErrResponsesUnsupported)
	}
	data, err := json.Marshal(msgs)
	if err != nil {
		return nil, err
	}
	return &ResponsesChat{Messages: data}, nil
}

// plainResponses asks what plainChat asks, bounded to 4 output tokens.
const plainResponses = `{"model":"` + testModel + `","max_output_tokens":4,"instructions":"Be brief.",` +
	`"input":"Why route requests by prefix?","store":false}`

// responsesResp mirrors the response object's members these tests read.
type responsesResp struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	CreatedAt         int64           `json:"created_at"`
	Model             string          `json:"model"`
	Status            string          `json:"status"`
	IncompleteDetails json.RawMessage `json:"incomplete_details"`
	Instructions      *string         `json:"instructions"`
	MaxOutputTokens   int             `json:"max_output_tokens"`
	ToolChoice        string          `json:"tool_choice"`
	Tools             json.RawMessage `json:"tools"`
	Output            []struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Role    string `json:"role"`
		Status  string `json:"status"`
		Content []struct {
			Type        string          `json:"type"`
			Text        string          `json:"text"`
			Annotations json.RawMessage `json:"annotations"`
			Logprobs    json.RawMessage `json:"logprobs"`
		} `json:"content"`
	} `json:"output"`
	Usage json.RawMessage `json:"usage"`
}

// responsesUsageJSON is the usage vLLM reports for a prompt of in tokens,
// cached of them cached, and out generated.
func responsesUsageJSON(in, cached, out int) string {
	return `{"input_tokens":` + itoa(in) + `,"input_tokens_details":{"cached_tokens":` + itoa(cached) +
		`,"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},"output_tokens":` + itoa(out) +
		`,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],` +
		`"tool_output_tokens_per_turn":[]},"total_tokens":` + itoa(in+out) + `}`
}

var responseIDForm = regexp.MustCompile(`^resp_[0-9a-f]{32}$`)

// chatAnswer returns the chat completion plainChat, with the given
// max_tokens (none when 0), gets from ts.
func chatAnswer(t *testing.T, ts *testServer, maxTokens int) completionResp {
	t.Helper()
	chat := map[string]any{"model": testModel, "messages": plainChat["messages"]}
	if maxTokens > 0 {
		chat["max_tokens"] = maxTokens
	}
	status, body := ts.post(t, "/v1/chat/completions", chat)
	if status != http.StatusOK {
		t.Fatalf("chat: status %d: %s", status, body)
	}
	return decode[completionResp](t, body)
}

func TestResponsesAnswerWithVLLMsResponseObjectAndTheEquivalentChatsUsage(t *testing.T) {
	for _, tc := range []struct {
		name       string
		body       string
		maxTokens  int
		status     string
		incomplete string
	}{
		{"max_output_tokens reached", plainResponses, 4, "incomplete", `{"reason":"max_output_tokens"}`},
		{"no max_output_tokens", strings.Replace(plainResponses, `"max_output_tokens":4,`, "", 1), 0, "completed", `null`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, 1, nil)
			first := chatAnswer(t, ts, tc.maxTokens)
			status, body := ts.postRaw(t, "/v1/responses", tc.body)
			if status != http.StatusOK {
				t.Fatalf("responses: status %d: %s", status, body)
			}
			// The chat repeated now finds its prompt cached, as the
			// Responses request did.
			again := chatAnswer(t, ts, tc.maxTokens)
			got := decode[responsesResp](t, body)
			prompt := first.Usage.PromptTokens
			if !responseIDForm.MatchString(got.ID) || got.Object != "response" || got.Model != testModel || got.CreatedAt == 0 {
				t.Errorf("response %s: want a response object of %s with a resp_ id", body, testModel)
			}
			if got.Status != tc.status || string(got.IncompleteDetails) != tc.incomplete {
				t.Errorf("status %q, incomplete_details %s; want %q, %s", got.Status, got.IncompleteDetails, tc.status, tc.incomplete)
			}
			wantMax := tc.maxTokens
			if wantMax == 0 {
				wantMax = 512 - prompt
			}
			if got.MaxOutputTokens != wantMax || got.Instructions == nil || *got.Instructions != "Be brief." ||
				got.ToolChoice != "none" || string(got.Tools) != "[]" {
				t.Errorf("response %s: want max_output_tokens %d, the instructions echoed, no tools and tool_choice none", body, wantMax)
			}
			answer := first.Choices[0].Message.Content
			if len(got.Output) != 1 {
				t.Fatalf("output %+v: want one message", got.Output)
			}
			msg := got.Output[0]
			if !strings.HasPrefix(msg.ID, "msg_") || msg.Type != "message" || msg.Role != "assistant" || msg.Status != "completed" ||
				len(msg.Content) != 1 || msg.Content[0].Type != "output_text" || msg.Content[0].Text != answer ||
				string(msg.Content[0].Annotations) != "[]" || string(msg.Content[0].Logprobs) != "null" {
				t.Errorf("output %s: want a completed assistant message holding the chat's answer %q", body, answer)
			}
			cached := again.Usage.PromptTokensDetails.CachedTokens
			if want := responsesUsageJSON(prompt, cached, first.Usage.CompletionTokens); cached == 0 || string(got.Usage) != want {
				t.Errorf("usage %s, want %s (the chat's prompt, cached and completion tokens)", got.Usage, want)
			}
		})
	}
}

// responsesEvt is one event of a streamed Responses answer.
type responsesEvt struct {
	name string
	data string
}

// responsesStream splits a Responses stream into its events, checking the
// framing ("event: <type>", "data: <json>", a blank line; no [DONE]) and
// that each event's type is its name and sequence_number its position.
func responsesStream(t *testing.T, body []byte) []responsesEvt {
	t.Helper()
	var out []responsesEvt
	for i, ev := range anthropicEvents(t, body) {
		var head struct {
			Type           string `json:"type"`
			SequenceNumber *int   `json:"sequence_number"`
		}
		if err := json.Unmarshal([]byte(ev.data), &head); err != nil || head.Type != ev.name ||
			head.SequenceNumber == nil || *head.SequenceNumber != i {
			t.Fatalf("event %d %s data %s: want its type to be its name and sequence_number %d", i, ev.name, ev.data, i)
		}
		out = append(out, responsesEvt(ev))
	}
	return out
}

func TestResponsesStreamSendsVLLMsEventsInOrder(t *testing.T) {
	ts := startServer(t, 1, nil)
	first := chatAnswer(t, ts, 4)
	answer, prompt := first.Choices[0].Message.Content, first.Usage.PromptTokens
	_, whole := ts.postRaw(t, "/v1/responses", plainResponses)
	wholeUsage := decode[responsesResp](t, whole).Usage

	for _, stream := range []string{`true`, `1`} {
		t.Run("stream "+stream, func(t *testing.T) {
			status, body := ts.postRaw(t, "/v1/responses", strings.Replace(plainResponses, `{`, `{"stream":`+stream+`,`, 1))
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			if strings.Contains(string(body), "[DONE]") {
				t.Errorf("stream %s: vLLM ends a Responses stream with response.completed, not [DONE]", body)
			}
			events := responsesStream(t, body)
			var names []string
			var text strings.Builder
			for _, ev := range events {
				names = append(names, ev.name)
				if ev.name == "response.output_text.delta" {
					text.WriteString(decode[struct {
						Delta string `json:"delta"`
					}](t, []byte(ev.data)).Delta)
				}
			}
			deltas := strings.Count(string(body), "event: response.output_text.delta\n")
			want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
			for range deltas {
				want = append(want, "response.output_text.delta")
			}
			want = append(want, "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed")
			if deltas < 1 || deltas > 4 || !reflect.DeepEqual(names, want) {
				t.Fatalf("events %q, want %q with a delta per token (1 to 4)", names, want)
			}
			if text.String() != answer {
				t.Errorf("streamed text %q, the chat's answer %q", text.String(), answer)
			}
			created := decode[struct {
				Response responsesResp `json:"response"`
			}](t, []byte(events[0].data)).Response
			if !responseIDForm.MatchString(created.ID) || created.Status != "in_progress" || len(created.Output) != 0 ||
				string(created.Usage) != "null" || created.MaxOutputTokens != 4 {
				t.Errorf("response.created %s: want the response in progress, with no output or usage", events[0].data)
			}
			if events[1].data != strings.Replace(strings.Replace(events[0].data, `"response.created"`, `"response.in_progress"`, 1),
				`"sequence_number":0`, `"sequence_number":1`, 1) {
				t.Errorf("response.in_progress %s: want the response of response.created %s", events[1].data, events[0].data)
			}
			item := decode[struct {
				Item struct {
					ID string `json:"id"`
				} `json:"item"`
			}](t, []byte(events[2].data)).Item.ID
			n := len(events)
			for _, tc := range []struct {
				i    int
				want string
			}{
				{2, `{"item":{"id":"` + item + `","content":[],"role":"assistant","status":"in_progress","type":"message"},` +
					`"output_index":0,"sequence_number":2,"type":"response.output_item.added"}`},
				{3, `{"content_index":0,"item_id":"` + item + `","output_index":0,"part":{"annotations":[],"text":"",` +
					`"type":"output_text","logprobs":[]},"sequence_number":3,"type":"response.content_part.added"}`},
				{n - 4, `{"content_index":0,"item_id":"` + item + `","logprobs":[],"output_index":0,"sequence_number":` + itoa(n-4) +
					`,"text":` + jsonString(answer) + `,"type":"response.output_text.done"}`},
				{n - 3, `{"content_index":0,"item_id":"` + item + `","output_index":0,"part":{"annotations":[],"text":` +
					jsonString(answer) + `,"type":"output_text","logprobs":null},"sequence_number":` + itoa(n-3) +
					`,"type":"response.content_part.done"}`},
				{n - 2, `{"item":{"id":"` + item + `","content":[{"annotations":[],"text":` + jsonString(answer) +
					`,"type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message","summary":[]},` +
					`"output_index":0,"sequence_number":` + itoa(n-2) + `,"type":"response.output_item.done"}`},
			} {
				if events[tc.i].data != tc.want {
					t.Errorf("event %d %s: data %s, want %s", tc.i, events[tc.i].name, events[tc.i].data, tc.want)
				}
			}
			if !strings.Contains(events[4].data, `"content_index":0,"delta":`) || !strings.Contains(events[4].data, `"item_id":"`+item+`"`) {
				t.Errorf("first delta %s: want content 0 of item %s", events[4].data, item)
			}
			completed := decode[struct {
				Response responsesResp `json:"response"`
			}](t, []byte(events[n-1].data)).Response
			if completed.ID != created.ID || completed.Status != "incomplete" || len(completed.Output) != 1 ||
				completed.Output[0].Content[0].Text != answer || !strings.HasPrefix(completed.Output[0].ID, "msg_") {
				t.Errorf("response.completed %s: want the whole response, incomplete at max_output_tokens", events[n-1].data)
			}
			if string(completed.Usage) != string(wholeUsage) || !strings.HasPrefix(string(completed.Usage), `{"input_tokens":`+itoa(prompt)+",") {
				t.Errorf("streamed usage %s, want the whole answer's %s", completed.Usage, wholeUsage)
			}
		})
	}
}

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

func TestResponsesStreamAnnouncesTheResponseBeforeTheFirstToken(t *testing.T) {
	// One request runs at a time: the second waits until the first ends.
	// vLLM sends response.created and response.in_progress before it
	// even submits the request to the engine.
	ts := startServer(t, 1, func(c *Config) {
		c.Ranks[0].Engine.MaxNumSeqs = 1
		c.Ranks[0].Engine.Latency.StepOverhead = 20 * time.Millisecond
	})
	stream := func(maxTokens string) string {
		return strings.Replace(strings.Replace(plainResponses, `"max_output_tokens":4`, `"max_output_tokens":`+maxTokens, 1),
			`{`, `{"stream":true,`, 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/v1/responses", strings.NewReader(stream("400")))
	if err != nil {
		t.Fatal(err)
	}
	first, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	testsupport.Eventually(t, "the first request to run", func() bool { return ts.queue(0).Running == 1 })

	second, err := http.Post(ts.url+"/v1/responses", "application/json", strings.NewReader(stream("2")))
	if err != nil {
		t.Fatal(err)
	}
	defer second.Body.Close()
	rd := bufio.NewReader(second.Body)
	var lines []string
	for range 4 {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v", lines, err)
		}
		lines = append(lines, line)
	}
	if q := ts.queue(0); q.Waiting != 1 {
		t.Errorf("queue %+v after the second stream began: want it still waiting behind the first", q)
	}
	if lines[0] != "event: response.created\n" || lines[2] != "\n" || lines[3] != "event: response.in_progress\n" {
		t.Errorf("the waiting stream began with %q, want response.created then response.in_progress", lines)
	}
}

// longResponses is plainResponses generating 400 tokens, streamed when
// stream is set.
func longResponses(stream bool) string {
	body := strings.Replace(plainResponses, `"max_output_tokens":4`, `"max_output_tokens":400`, 1)
	if stream {
		body = strings.Replace(body, `{`, `{"stream":true,`, 1)
	}
	return body
}

func TestHangingUpAResponsesRequestAbortsItsEngineRequest(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream %v", stream), func(t *testing.T) {
			ts := startServer(t, 1, func(c *Config) { c.Ranks[0].Engine.Latency.StepOverhead = 20 * time.Millisecond })
			body := longResponses(stream)
			ctx, hangUp := context.WithCancel(context.Background())
			defer hangUp()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/v1/responses", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			testsupport.Eventually(t, "the request to run", func() bool { return ts.queue(0).Running == 1 })
			hangUp()
			<-done
			testsupport.Eventually(t, "the engine request to be aborted", func() bool {
				q := ts.queue(0)
				return q.Running == 0 && q.Waiting == 0
			})
		})
	}
}

func TestStoppingTheEnginesFailsOpenResponsesRequests(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream %v", stream), func(t *testing.T) {
			ts := startServer(t, 1, func(c *Config) { c.Ranks[0].Engine.Latency.StepOverhead = 50 * time.Millisecond })
			body := longResponses(stream)
			type result struct {
				status  int
				out     []byte
				readErr error
			}
			done := make(chan result, 1)
			go func() {
				resp, err := http.Post(ts.url+"/v1/responses", "application/json", strings.NewReader(body))
				if err != nil {
					done <- result{readErr: err}
					return
				}
				defer resp.Body.Close()
				out, err := io.ReadAll(resp.Body)
				done <- result{resp.StatusCode, out, err}
			}()
			testsupport.Eventually(t, "the request to run", func() bool { return ts.queue(0).Running == 1 })
			ts.runners[0].stop()
			r := <-done
			if !stream {
				e := decode[apiError](t, r.out)
				if r.status != http.StatusServiceUnavailable || e.Error.Type != "ServiceUnavailableError" || e.Error.Message != errStopped.Error() {
					t.Errorf("open request got %d %s (%v), want 503 %q", r.status, r.out, r.readErr, errStopped)
				}
				return
			}
			// vLLM's stream breaks off when its engine dies: no
			// response.completed, and the body ends short.
			if r.status != http.StatusOK || r.readErr == nil || strings.Contains(string(r.out), "response.completed") ||
				!strings.HasPrefix(string(r.out), "event: response.created\n") {
				t.Errorf("open stream got %d %q (read error %v), want it broken off after it began", r.status, r.out, r.readErr)
			}
		})
	}
}

func TestResponsesPublishTheEquivalentChatsKVEvents(t *testing.T) {
	qwen3 := qwen3Template(t)
	for _, tc := range []struct {
		name      string
		tokenizer func(*Config)
		body      string
	}{
		{"simulator's tokenizer", nil, plainResponses},
		{"Qwen3's template", qwen3, plainResponses},
		{"streamed, Qwen3's template", qwen3, strings.Replace(plainResponses, `{`, `{"stream":true,`, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			publishesTheEquivalentChatsKVEvents(t, tc.tokenizer, "/v1/responses", tc.body, plainChat)
		})
	}
}

func TestResponsesRequestsVLLMRefusesGetItsErrors(t *testing.T) {
	ts := startServer(t, 1, nil)
	long := strings.Replace(plainResponses, `"Why route requests by prefix?"`, jsonString(strings.Repeat("route ", 600)), 1)
	for _, tc := range []struct {
		name, body string
		status     int
		kind       string
		param      any
		message    string
	}{
		{"not JSON", `{"model":`, http.StatusBadRequest, "BadRequestError", nil, "not valid JSON"},
		{"no input", strings.Replace(plainResponses, `"input":"Why route requests by prefix?",`, "", 1),
			http.StatusBadRequest, "BadRequestError", nil, "input is required"},
		{"input the simulator cannot render", strings.Replace(plainResponses, `"Why route requests by prefix?"`,
			`[{"role":"user","content":[{"type":"input_image","image_url":"https://x.example/a.png"}]}]`, 1), http.StatusBadRequest, "BadRequestError", nil,
			"the simulator cannot render this request as vLLM would"},
		{"unknown model", strings.Replace(plainResponses, testModel, "other-model", 1),
			http.StatusNotFound, "NotFoundError", nil, "The model `other-model` does not exist."},
		{"a previous response", strings.Replace(plainResponses, `{`, `{"previous_response_id":"resp_123",`, 1),
			http.StatusNotFound, "invalid_request_error", "response_id", "Response with id 'resp_123' not found."},
		{"stream maybe", strings.Replace(plainResponses, `{`, `{"stream":"maybe",`, 1),
			http.StatusBadRequest, "BadRequestError", nil, "stream"},
		{"max_output_tokens 0", strings.Replace(plainResponses, `"max_output_tokens":4`, `"max_output_tokens":0`, 1),
			http.StatusBadRequest, "BadRequestError", nil, "max_tokens must be at least 1, got 0."},
		{"max_output_tokens beyond the model length", strings.Replace(plainResponses, `"max_output_tokens":4`, `"max_output_tokens":600`, 1),
			http.StatusBadRequest, "BadRequestError", nil, "max_output_tokens=600cannot be greater than max_model_len=max_total_tokens=512."},
		{"a prompt beyond the model length", long, http.StatusBadRequest, "BadRequestError", nil,
			"However, the model's context length is only 512 tokens, resulting in a maximum input length of 508 tokens."},
		{"background", strings.Replace(plainResponses, `"store":false`, `"background":true`, 1),
			http.StatusBadRequest, "invalid_request_error", "background", "does not support the background mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := ts.postRaw(t, "/v1/responses", tc.body)
			e := decode[apiError](t, body)
			if status != tc.status || e.Error.Code != tc.status || e.Error.Type != tc.kind || e.Error.Param != tc.param ||
				!strings.Contains(e.Error.Message, tc.message) {
				t.Errorf("status %d %s, want %d with an OpenAI error of type %s, param %v, saying %q",
					status, body, tc.status, tc.kind, tc.param, tc.message)
			}
		})
	}
}

func TestResponsesIgnoreStoreAsVLLMDoesByDefault(t *testing.T) {
	ts := startServer(t, 1, nil)
	status, body := ts.postRaw(t, "/v1/responses", strings.Replace(plainResponses, `"store":false`, `"store":true`, 1))
	if status != http.StatusOK || decode[responsesResp](t, body).Status != "incomplete" {
		t.Fatalf("store true: status %d %s, want the response", status, body)
	}
	id := decode[responsesResp](t, body).ID
	status, body = ts.postRaw(t, "/v1/responses", strings.Replace(plainResponses, `{`, `{"previous_response_id":"`+id+`",`, 1))
	if status != http.StatusNotFound {
		t.Errorf("continuing %s: status %d %s, want 404: the response was not stored", id, status, body)
	}
}

func TestResponsesNeedAConverter(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) { c.Responses = nil })
	if status, body := ts.postRaw(t, "/v1/responses", plainResponses); status != http.StatusNotFound {
		t.Errorf("status %d %s, want 404 without Config.Responses", status, body)
	}
}
