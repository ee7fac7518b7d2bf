package simserver

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// storeMode runs a server in store mode, converting Responses bodies with
// convert (the tests' own conversion when nil).
func storeMode(convert ResponsesConverter) func(*Config) {
	return func(c *Config) {
		c.ResponsesStore = true
		if convert != nil {
			c.Responses = convert
		}
	}
}

// get sends GET path and returns the status and response body.
func (ts *testServer) get(t *testing.T, path string) (int, []byte) {
	t.Helper()
	return ts.send(t, http.MethodGet, path, "", nil)
}

// respond posts a Responses body and returns the response object it
// answers with, whole or, for a stream, as its response.completed event
// carries it, as written.
func respond(t *testing.T, ts *testServer, body map[string]any) json.RawMessage {
	t.Helper()
	status, out := ts.post(t, "/v1/responses", body)
	if status != http.StatusOK {
		t.Fatalf("responses %v: status %d: %s", body, status, out)
	}
	if body["stream"] != true {
		return json.RawMessage(strings.TrimSuffix(string(out), "\n"))
	}
	events := responsesStream(t, out)
	last := events[len(events)-1]
	if last.name != "response.completed" {
		t.Fatalf("stream ended with %s, want response.completed", last.name)
	}
	return decode[struct {
		Response json.RawMessage `json:"response"`
	}](t, []byte(last.data)).Response
}

// responseText returns the text of a response object's output.
func responseText(t *testing.T, resp json.RawMessage) string {
	t.Helper()
	var text strings.Builder
	for _, item := range decode[responsesResp](t, resp).Output {
		for _, part := range item.Content {
			text.WriteString(part.Text)
		}
	}
	return text.String()
}

func TestResponsesContinueAStoredConversationAsTheEquivalentChat(t *testing.T) {
	type turn struct{ instructions, input string }
	brief := turn{"Be brief.", "Why route requests by prefix?"}
	for _, tc := range []struct {
		name    string
		convert ResponsesConverter
		stream  bool
		turns   []turn
	}{
		{"follow-ups without instructions", nil, false, []turn{brief, {"", "And by load?"}, {"", "Thanks."}}},
		{"streamed", nil, true, []turn{brief, {"", "And by load?"}, {"", "Thanks."}}},
		// vLLM puts a follow-up's instructions before the conversation,
		// which keeps the earlier turns' own.
		{"follow-ups with instructions", nil, false, []turn{brief, {"Answer in French.", "And by load?"}, {"", "Thanks."}}},
		{"vLLM's conversion", convertResponsesAsVLLM, false, []turn{brief, {"", "And by load?"}, {"", "Thanks."}}},
		{"vLLM's conversion, streamed", convertResponsesAsVLLM, true, []turn{brief, {"", "And by load?"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, 1, storeMode(tc.convert))
			// The equivalent chats, sent in the same order to an engine of
			// their own, find the same prefixes cached.
			ref := startServer(t, 1, nil)
			var history []map[string]any
			prevID, prevPrompt := "", 0
			for i, tn := range tc.turns {
				var msgs []map[string]any
				if tn.instructions != "" {
					msgs = append(msgs, map[string]any{"role": "system", "content": tn.instructions})
				}
				msgs = append(append(msgs, history...), map[string]any{"role": "user", "content": tn.input})
				status, out := ref.post(t, "/v1/chat/completions", map[string]any{"model": testModel, "max_tokens": 4, "messages": msgs})
				if status != http.StatusOK {
					t.Fatalf("turn %d: chat: status %d: %s", i, status, out)
				}
				chat := decode[completionResp](t, out)
				answer := chat.Choices[0].Message.Content

				body := map[string]any{"model": testModel, "input": tn.input, "max_output_tokens": 4, "stream": tc.stream}
				if tn.instructions != "" {
					body["instructions"] = tn.instructions
				}
				if prevID != "" {
					body["previous_response_id"] = prevID
				}
				resp := respond(t, ts, body)
				got := decode[responsesResp](t, resp)
				u := chat.Usage
				if want := responsesUsageJSON(u.PromptTokens, u.PromptTokensDetails.CachedTokens, u.CompletionTokens); string(got.Usage) != want {
					t.Errorf("turn %d: usage %s, want the equivalent chat's %s", i, got.Usage, want)
				}
				if text := responseText(t, resp); text != answer {
					t.Errorf("turn %d: answer %q, want the equivalent chat's %q", i, text, answer)
				}
				// A follow-up's prompt begins with the previous turn's, whose
				// every full block the engine holds.
				if held := prevPrompt / testBS * testBS; i > 0 && tn.instructions == "" && u.PromptTokensDetails.CachedTokens < held {
					t.Errorf("turn %d: %d tokens cached, want at least the previous prompt's %d", i, u.PromptTokensDetails.CachedTokens, held)
				}
				prevPrompt = u.PromptTokens
				status, stored := ts.get(t, "/v1/responses/"+got.ID)
				if status != http.StatusOK || strings.TrimSuffix(string(stored), "\n") != string(resp) {
					t.Errorf("turn %d: GET %s: %d %s, want the response %s", i, got.ID, status, stored, resp)
				}
				history = append(msgs, map[string]any{"role": "assistant", "content": answer})
				prevID = got.ID
			}
		})
	}
}

func TestResponsesNotKeptAreNotFound(t *testing.T) {
	notFound := func(t *testing.T, ts *testServer, id string) {
		t.Helper()
		status, body := ts.get(t, "/v1/responses/"+id)
		e := decode[apiError](t, body)
		if want := "Response with id '" + id + "' not found."; status != http.StatusNotFound || e.Error.Message != want ||
			e.Error.Type != "invalid_request_error" || e.Error.Param != "response_id" || e.Error.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d %s, want 404 %q", id, status, body, want)
		}
		status, body = ts.postRaw(t, "/v1/responses", strings.Replace(plainResponses, `{`, `{"previous_response_id":"`+id+`",`, 1))
		if e := decode[apiError](t, body); status != http.StatusNotFound || e.Error.Message != "Response with id '"+id+"' not found." {
			t.Errorf("continuing %s: %d %s, want 404", id, status, body)
		}
	}
	stored := func(t *testing.T, ts *testServer, body string) string {
		t.Helper()
		status, out := ts.postRaw(t, "/v1/responses", body)
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, out)
		}
		return decode[responsesResp](t, out).ID
	}
	storeTrue := strings.Replace(plainResponses, `"store":false`, `"store":true`, 1)
	storeDefault := strings.Replace(plainResponses, `,"store":false`, ``, 1)
	for _, tc := range []struct {
		name   string
		mod    func(*Config)
		body   string
		stream bool
	}{
		{"unknown", storeMode(nil), "", false},
		{"store false", storeMode(nil), plainResponses, false},
		{"store false, streamed", storeMode(nil), strings.Replace(plainResponses, `{`, `{"stream":true,`, 1), true},
		{"without store mode", nil, storeTrue, false},
		{"without store mode, store by default", nil, storeDefault, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, 1, tc.mod)
			id := "resp_0123456789abcdef0123456789abcdef"
			if tc.body != "" && !tc.stream {
				id = stored(t, ts, tc.body)
			}
			if tc.stream {
				_, out := ts.postRaw(t, "/v1/responses", tc.body)
				events := responsesStream(t, out)
				id = decode[struct {
					Response responsesResp `json:"response"`
				}](t, []byte(events[len(events)-1].data)).Response.ID
			}
			notFound(t, ts, id)
		})
	}
}

func TestResponsesStoreForgetsTheOldestBeyondItsBound(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) { c.ResponsesStore, c.ResponsesStoreMax = true, 2 })
	var ids []string
	for range 3 {
		status, out := ts.postRaw(t, "/v1/responses", strings.Replace(plainResponses, `"store":false`, `"store":true`, 1))
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, out)
		}
		ids = append(ids, decode[responsesResp](t, out).ID)
	}
	for i, id := range ids {
		status, _ := ts.get(t, "/v1/responses/"+id)
		if want := map[bool]int{true: http.StatusNotFound, false: http.StatusOK}[i == 0]; status != want {
			t.Errorf("response %d of 3 kept at most 2: GET status %d, want %d", i, status, want)
		}
	}
	if n := ts.store.len(); n != 2 {
		t.Errorf("%d responses kept, want the bound, 2", n)
	}
}

func TestResponsesFollowUpWithoutInputIsRefused(t *testing.T) {
	ts := startServer(t, 1, storeMode(nil))
	first := decode[responsesResp](t, respond(t, ts, map[string]any{"model": testModel, "input": "hi", "max_output_tokens": 2}))
	status, body := ts.post(t, "/v1/responses", map[string]any{"model": testModel, "previous_response_id": first.ID})
	if e := decode[apiError](t, body); status != http.StatusBadRequest || e.Error.Message != "input is required" {
		t.Errorf("follow-up without input: %d %s, want 400 %q", status, body, "input is required")
	}
}

// backgroundResp mirrors the members of a background response these
// tests read.
type backgroundResp struct {
	responsesResp
	Background bool `json:"background"`
}

// storedStatus returns the status of the response kept under id.
func storedStatus(t *testing.T, ts *testServer, id string) backgroundResp {
	t.Helper()
	status, body := ts.get(t, "/v1/responses/"+id)
	if status != http.StatusOK {
		t.Fatalf("GET %s: status %d: %s", id, status, body)
	}
	return decode[backgroundResp](t, body)
}

func TestResponsesInBackgroundAnswerQueuedThenKeepTheirEnd(t *testing.T) {
	ts := startServer(t, 1, storeMode(nil))
	answer := chatAnswer(t, ts, 4)
	status, body := ts.postRaw(t, "/v1/responses", strings.Replace(plainResponses, `"store":false`, `"background":true`, 1))
	queued := decode[backgroundResp](t, body)
	if status != http.StatusOK || queued.Status != "queued" || len(queued.Output) != 0 || string(queued.Usage) != "null" ||
		!queued.Background || !responseIDForm.MatchString(queued.ID) {
		t.Fatalf("background request: %d %s, want the response queued, with no output or usage", status, body)
	}
	testsupport.Eventually(t, "the background response to end", func() bool {
		return storedStatus(t, ts, queued.ID).Status != "queued"
	})
	done := storedStatus(t, ts, queued.ID)
	u := answer.Usage
	if done.Status != "incomplete" || !done.Background || len(done.Output) != 1 ||
		done.Output[0].Content[0].Text != answer.Choices[0].Message.Content ||
		string(done.Usage) != responsesUsageJSON(u.PromptTokens, (u.PromptTokens-1)/testBS*testBS, u.CompletionTokens) {
		t.Errorf("kept response %+v, want the chat's answer %q, incomplete at max_output_tokens, its prompt cached",
			done, answer.Choices[0].Message.Content)
	}
	if status, body := ts.post(t, "/v1/responses/"+queued.ID+"/cancel", nil); status != http.StatusBadRequest ||
		decode[apiError](t, body).Error.Message != "Cannot cancel a synchronous response." {
		t.Errorf("cancelling the ended response: %d %s, want 400", status, body)
	}
}

func TestCancellingABackgroundResponseAbortsItsGeneration(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) {
		c.ResponsesStore = true
		c.Ranks[0].Engine.Latency.StepOverhead = 20 * time.Millisecond
	})
	status, body := ts.postRaw(t, "/v1/responses", strings.Replace(longResponses(false), `"store":false`, `"background":true`, 1))
	id := decode[responsesResp](t, body).ID
	if status != http.StatusOK {
		t.Fatalf("background request: %d %s", status, body)
	}
	testsupport.Eventually(t, "the background generation to run", func() bool { return ts.queue(0).Running == 1 })
	status, body = ts.post(t, "/v1/responses/"+id+"/cancel", nil)
	if got := decode[backgroundResp](t, body); status != http.StatusOK || got.ID != id || got.Status != "cancelled" {
		t.Fatalf("cancel: %d %s, want the response cancelled", status, body)
	}
	if q := ts.queue(0); q.Running != 0 || q.Waiting != 0 {
		t.Errorf("queue %+v once cancelled, want the generation aborted", q)
	}
	if got := storedStatus(t, ts, id); got.Status != "cancelled" || len(got.Output) != 0 {
		t.Errorf("kept response %+v, want it cancelled", got)
	}
	status, body = ts.post(t, "/v1/responses/"+id+"/cancel", nil)
	if e := decode[apiError](t, body); status != http.StatusBadRequest || e.Error.Type != "invalid_request_error" ||
		e.Error.Message != "Cannot cancel a synchronous response." {
		t.Errorf("cancelling again: %d %s, want 400", status, body)
	}
}

func TestABackgroundResponseWhoseEngineStopsFails(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) {
		c.ResponsesStore = true
		c.Ranks[0].Engine.Latency.StepOverhead = 50 * time.Millisecond
	})
	_, body := ts.postRaw(t, "/v1/responses", strings.Replace(longResponses(false), `"store":false`, `"background":true`, 1))
	id := decode[responsesResp](t, body).ID
	testsupport.Eventually(t, "the background generation to run", func() bool { return ts.queue(0).Running == 1 })
	ts.runners[0].stop()
	testsupport.Eventually(t, "the background response to fail", func() bool { return storedStatus(t, ts, id).Status == "failed" })
}

func TestCancellingResponsesNotInBackground(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mod     func(*Config)
		stored  bool
		status  int
		message string
	}{
		{"unknown", storeMode(nil), false, http.StatusNotFound, "Response with id '%s' not found."},
		{"without store mode", nil, false, http.StatusNotFound, "Response with id '%s' not found."},
		{"stored", storeMode(nil), true, http.StatusBadRequest, "Cannot cancel a synchronous response."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, 1, tc.mod)
			id := "resp_0123456789abcdef0123456789abcdef"
			if tc.stored {
				_, body := ts.postRaw(t, "/v1/responses", strings.Replace(plainResponses, `"store":false`, `"store":true`, 1))
				id = decode[responsesResp](t, body).ID
			}
			status, body := ts.post(t, "/v1/responses/"+id+"/cancel", nil)
			e := decode[apiError](t, body)
			if want := strings.Replace(tc.message, "%s", id, 1); status != tc.status || e.Error.Message != want ||
				e.Error.Type != "invalid_request_error" || e.Error.Param != "response_id" {
				t.Errorf("cancel: %d %s, want %d %q", status, body, tc.status, want)
			}
		})
	}
}

func TestBackgroundNeedsStore(t *testing.T) {
	ts := startServer(t, 1, storeMode(nil))
	status, body := ts.postRaw(t, "/v1/responses", strings.Replace(plainResponses, `{`, `{"background":true,`, 1))
	if e := decode[apiError](t, body); status != http.StatusBadRequest || e.Error.Message != "background can only be used when `store` is true" {
		t.Errorf("background with store false: %d %s, want 400", status, body)
	}
}

// backgroundStream is plainResponses as a background stream generating
// maxTokens tokens.
func backgroundStream(maxTokens int) string {
	return strings.Replace(strings.Replace(plainResponses, `"store":false`, `"background":true,"stream":true`, 1),
		`"max_output_tokens":4`, `"max_output_tokens":`+itoa(maxTokens), 1)
}

// completedResponse returns the response of a stream's last event, which
// must be response.completed.
func completedResponse(t *testing.T, events []responsesEvt) backgroundResp {
	t.Helper()
	last := events[len(events)-1]
	if last.name != "response.completed" {
		t.Fatalf("stream ended with %s, want response.completed", last.name)
	}
	return decode[struct {
		Response backgroundResp `json:"response"`
	}](t, []byte(last.data)).Response
}

func TestBackgroundStreamsAreStreamedAndReplayed(t *testing.T) {
	ts := startServer(t, 1, storeMode(nil))
	answer := chatAnswer(t, ts, 4).Choices[0].Message.Content
	status, body := ts.postRaw(t, "/v1/responses", backgroundStream(4))
	if status != http.StatusOK {
		t.Fatalf("background stream: %d %s", status, body)
	}
	events := responsesStream(t, body)
	done := completedResponse(t, events)
	if events[0].name != "response.created" || done.Status != "incomplete" || !done.Background ||
		responseText(t, json.RawMessage(mustJSON(done.responsesResp))) != answer {
		t.Fatalf("background stream %s: want vLLM's events, ending with the chat's answer %q", body, answer)
	}
	status, replay := ts.get(t, "/v1/responses/"+done.ID+"?stream=true")
	if status != http.StatusOK || string(replay) != string(body) {
		t.Errorf("replay: %d %s, want the stream's events %s", status, replay, body)
	}
	var rest strings.Builder
	for _, ev := range events[3:] {
		rest.WriteString("event: " + ev.name + "\ndata: " + ev.data + "\n\n")
	}
	if _, after := ts.get(t, "/v1/responses/"+done.ID+"?stream=true&starting_after=2"); string(after) != rest.String() {
		t.Errorf("replay after 2: %s, want the events from 3 on %s", after, rest.String())
	}
	if kept := storedStatus(t, ts, done.ID); kept.Status != "incomplete" || kept.Usage == nil ||
		string(kept.Usage) != string(done.Usage) {
		t.Errorf("kept response %+v, want the completed one %+v", kept, done)
	}
}

func TestABackgroundStreamOutlivesItsClientAndIsReplayedAsItGoes(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) {
		c.ResponsesStore = true
		c.Ranks[0].Engine.Latency.StepOverhead = 10 * time.Millisecond
	})
	ctx, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/v1/responses", strings.NewReader(backgroundStream(30)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	var first string
	for range 2 {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		first += line
	}
	hangUp()
	resp.Body.Close()
	data, _ := strings.CutPrefix(strings.Split(first, "\n")[1], "data: ")
	id := decode[struct {
		Response responsesResp `json:"response"`
	}](t, []byte(data)).Response.ID

	status, replay := ts.get(t, "/v1/responses/"+id+"?stream=true&starting_after=1")
	if status != http.StatusOK {
		t.Fatalf("replay: %d %s", status, replay)
	}
	// The replayed events keep their sequence numbers, from 2 on.
	events := anthropicEvents(t, replay)
	for i, ev := range events {
		if n := decode[struct {
			SequenceNumber int `json:"sequence_number"`
		}](t, []byte(ev.data)).SequenceNumber; n != i+2 {
			t.Fatalf("replayed event %d %s: sequence_number %d, want %d", i, ev.name, n, i+2)
		}
	}
	done := completedResponse(t, []responsesEvt{responsesEvt(events[len(events)-1])})
	if !strings.Contains(string(done.Usage), `"output_tokens":30,`) {
		t.Errorf("completed response %+v, want all 30 tokens generated after the client left", done)
	}
}

func TestCancellingABackgroundStreamEndsItsReplay(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) {
		c.ResponsesStore = true
		c.Ranks[0].Engine.Latency.StepOverhead = 20 * time.Millisecond
	})
	type result struct {
		body []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.Post(ts.url+"/v1/responses", "application/json", strings.NewReader(backgroundStream(400)))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		done <- result{body, err}
	}()
	testsupport.Eventually(t, "the background stream to run", func() bool { return ts.queue(0).Running == 1 })
	var id string
	ts.store.mu.Lock()
	for k := range ts.store.entries {
		id = k
	}
	ts.store.mu.Unlock()
	if status, body := ts.post(t, "/v1/responses/"+id+"/cancel", nil); status != http.StatusOK {
		t.Fatalf("cancel: %d %s", status, body)
	}
	r := <-done
	if r.err != nil || strings.Contains(string(r.body), "response.completed") || !strings.HasPrefix(string(r.body), "event: response.created\n") {
		t.Errorf("cancelled stream: %q (%v), want it ended without response.completed", r.body, r.err)
	}
	if got := storedStatus(t, ts, id); got.Status != "cancelled" {
		t.Errorf("kept response %+v, want it cancelled", got)
	}
}

func TestReplayingAResponseThatWasNotABackgroundStream(t *testing.T) {
	ts := startServer(t, 1, storeMode(nil))
	_, body := ts.postRaw(t, "/v1/responses", strings.Replace(plainResponses, `"store":false`, `"store":true`, 1))
	id := decode[responsesResp](t, body).ID
	resp, err := http.Get(ts.url + "/v1/responses/" + id + "?stream=true")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out, err := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK || err == nil {
		t.Errorf("replaying a response without events: %d %q (%v), want the stream broken off, as vLLM's", resp.StatusCode, out, err)
	}
	if status, _ := ts.get(t, "/v1/responses/resp_0123456789abcdef0123456789abcdef?stream=true"); status != http.StatusNotFound {
		t.Errorf("replaying an unknown response: status %d, want 404", status)
	}
	if status, _ := ts.get(t, "/v1/responses/"+id+"?stream=maybe"); status != http.StatusBadRequest {
		t.Errorf("stream=maybe: status %d, want 400", status)
	}
}
