package gateway

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

// streamCase is a streamed request and what the engine answers it with.
type streamCase struct {
	name string
	path string
	body string
	// wantOptions is the stream_options the engine must receive.
	wantOptions string
	// events are the engine's events; usage marks the usage chunk.
	events []string
	usage  int
	// clientGetsUsage says whether the client asked for the usage chunk.
	clientGetsUsage bool
}

const usageChunk = `data: {"id":"c","object":"text_completion","created":1,"model":"llama","choices":[],` +
	`"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3}}` + "\n\n"

func streamCases() []streamCase {
	// Events a relay must keep intact: a comment, an event with an id
	// line, CRLF line endings, a chunk far larger than the relay's read
	// buffer, and an error event.
	big := strings.Repeat("x", 200<<10)
	completionEvents := []string{
		`data: {"id":"c","object":"text_completion","created":1,"model":"llama","choices":[{"index":0,"text":" a","finish_reason":null}]}` + "\n\n",
		": keep-alive\n\n",
		"id: 7\n" + `data: {"id":"c","object":"text_completion","created":1,"model":"llama","choices":[{"index":0,"text":" b","finish_reason":null}]}` + "\n\n",
		`data: {"id":"c","object":"text_completion","created":1,"model":"llama","choices":[{"index":0,"text":"` + big + `","finish_reason":"length"}]}` + "\r\n\r\n",
		usageChunk,
		"data: [DONE]\n\n",
	}
	chatEvents := []string{
		`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"llama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n",
		`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"llama","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}` + "\n\n",
		usageChunk,
		`data: {"error":{"message":"late error","type":"x","code":500}}` + "\n\n",
		"data: [DONE]\n\n",
	}
	return []streamCase{
		{name: "completion without stream_options", path: "/v1/completions",
			body:        `{"model":"llama","prompt":[1,2,3],"stream":true}`,
			wantOptions: `{"include_usage":true}`, events: completionEvents, usage: 4},
		// vLLM's include_usage defaults to true: stream_options without
		// it ask for usage, null does not.
		{name: "completion with stream_options but include_usage", path: "/v1/completions",
			body:        `{"model":"llama","prompt":[1,2,3],"stream":true,"stream_options":{"continuous_usage_stats":true}}`,
			wantOptions: `{"continuous_usage_stats":true}`, events: completionEvents, usage: 4, clientGetsUsage: true},
		{name: "completion with include_usage null", path: "/v1/completions",
			body:        `{"model":"llama","prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":null,"continuous_usage_stats":true}}`,
			wantOptions: `{"continuous_usage_stats":false,"include_usage":true}`, events: completionEvents, usage: 4},
		{name: "chat asking for usage", path: "/v1/chat/completions",
			body:        `{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
			wantOptions: `{"include_usage":true}`, events: chatEvents, usage: 2, clientGetsUsage: true},
		{name: "chat without stream_options", path: "/v1/chat/completions",
			body:        `{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true}`,
			wantOptions: `{"include_usage":true}`, events: chatEvents, usage: 2},
		// vLLM reads a boolean as pydantic's lax mode does: the gateway
		// reads these as streamed, and the second as asking for usage.
		{name: "completion streamed by a string", path: "/v1/completions",
			body:        `{"model":"llama","prompt":[1,2,3],"stream":"true","max_tokens":"16"}`,
			wantOptions: `{"include_usage":true}`, events: completionEvents, usage: 4},
		{name: "chat streamed by one asking for usage in a string", path: "/v1/chat/completions",
			body:        `{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":1,"stream_options":{"include_usage":"Yes"}}`,
			wantOptions: `{"include_usage":"Yes"}`, events: chatEvents, usage: 2, clientGetsUsage: true},
	}
}

func TestStreamsPassThroughByteForByteAsTheyCome(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	e := f.engine("a")
	for i, tc := range streamCases() {
		t.Run(tc.name, func(t *testing.T) {
			proceed := make(chan struct{})
			e.setAnswer(func(w http.ResponseWriter, r *http.Request, _ []byte) {
				writeSSE(w, tc.events[:1])
				select {
				case <-proceed:
				case <-r.Context().Done():
					return
				}
				writeSSE(w, tc.events[1:])
			})
			resp := openStream(t, f.url+tc.path, tc.body)
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream; charset=utf-8" {
				t.Fatalf("status %d, Content-Type %q", resp.StatusCode, ct)
			}
			if resp.Header.Get(HeaderTargetPodName) != "static/a" || resp.Header.Get("Content-Length") != "" {
				t.Errorf("headers %v: want target-pod-name static/a and no Content-Length", resp.Header)
			}
			// The first event reaches the client while the engine holds
			// back the rest: nothing is buffered.
			first := make([]byte, len(tc.events[0]))
			if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != tc.events[0] {
				t.Fatalf("first event %q, %v; want %q", first, err, tc.events[0])
			}
			close(proceed)
			rest, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			var want strings.Builder
			for j, ev := range tc.events[1:] {
				if j+1 != tc.usage || tc.clientGetsUsage {
					want.WriteString(ev)
				}
			}
			if string(rest) != want.String() {
				t.Errorf("client received %d bytes after the first event, want %d:\n got %.300q\nwant %.300q",
					len(rest), want.Len(), rest, want.String())
			}
			got := e.received()[i]
			var sent struct {
				StreamOptions json.RawMessage `json:"stream_options"`
			}
			if err := json.Unmarshal(got.body, &sent); err != nil || string(sent.StreamOptions) != tc.wantOptions {
				t.Errorf("engine received stream_options %s (%v), want %s; body %s", sent.StreamOptions, err, tc.wantOptions, got.body)
			}
		})
	}
	n := float64(len(streamCases()))
	if v := f.metric(`kvgate_gateway_time_to_first_token_seconds_count{model="llama"}`); v != n {
		t.Errorf("time to first token observed %v times, want %v", v, n)
	}
	if v := f.metric("kvgate_gateway_responses_without_usage_total"); v != 0 {
		t.Errorf("%v streams without usage, want 0", v)
	}
	if v := f.metric("kvgate_routing_inflight_prefills"); v != 0 {
		t.Errorf("%v prefills still in flight, want 0", v)
	}
}

func TestStreamHeadersReachTheClientBeforeTheFirstEvent(t *testing.T) {
	// The engine answers with its headers alone and holds its events back
	// until the client has the headers: a relay that waited for the first
	// event to send the headers with it would wait out the deadline.
	f := startFleet(t, []string{"a"}, fleetOptions{})
	events := []string{"data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n", usageChunk, "data: [DONE]\n\n"}
	proceed := make(chan struct{})
	f.engine("a").setAnswer(func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-proceed:
		case <-r.Context().Done():
			return
		}
		for _, ev := range events {
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), testsupport.WaitTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/completions",
		strings.NewReader(`{"model":"llama","prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true}}`))
	resp, err := http.DefaultClient.Do(req)
	close(proceed)
	if err != nil {
		t.Fatalf("no headers while the engine held its events back: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if want := strings.Join(events, ""); err != nil || string(body) != want {
		t.Errorf("client received %q, %v; want %q", body, err, want)
	}
}

func TestBodyWithoutStreamOptionsGetsOnlyTheMemberInserted(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	body := " {\n  \"model\" : \"llama\",\t\"prompt\":[5,6],\"stream\":true, \"x\":{\"y\":[1,2]}}\n"
	resp := openStream(t, f.url+"/v1/completions", body)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	want := " {" + usageOption + ",\n  \"model\" : \"llama\",\t\"prompt\":[5,6],\"stream\":true, \"x\":{\"y\":[1,2]}}\n"
	if got := string(f.engine("a").received()[0].body); got != want {
		t.Errorf("engine received\n%q\nwant\n%q", got, want)
	}
}

func TestClientLeavingAStreamReleasesItsRequest(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	e := f.engine("a")
	engineSawCancel := make(chan struct{})
	e.setAnswer(func(w http.ResponseWriter, r *http.Request, _ []byte) {
		writeSSE(w, []string{"data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"})
		<-r.Context().Done()
		close(engineSawCancel)
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/completions",
		strings.NewReader(`{"model":"llama","prompt":"hello","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-engineSawCancel:
	case <-time.After(testsupport.WaitTimeout):
		t.Fatal("the engine's request was not cancelled after the client left")
	}
	testsupport.EventuallyWhy(t, "the request to be released", func() (string, bool) {
		inFlight := f.metric("kvgate_gateway_requests_in_flight")
		prefills := f.metric("kvgate_routing_inflight_prefills")
		running := f.match([]uint32{1}).Decisions[0].Candidates[0].Running
		return mustJSON([]float64{inFlight, prefills, running}), inFlight == 0 && prefills == 0 && running == 0
	})
}

// openStream posts body and returns the response, its body unread.
func openStream(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
