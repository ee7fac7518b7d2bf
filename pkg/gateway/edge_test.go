package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/routing"
)

// outcomes records how the attempts of a gateway's requests ended.
type outcomes struct {
	mu   sync.Mutex
	list []string // "outcome reason"
	// usage holds each attempt's usage as fmt prints it, "" for none.
	usage []string
}

func watchOutcomes(g *Gateway) *outcomes {
	o := &outcomes{}
	g.ledger.Observe(inflight.Observer{Closed: func(h *inflight.Handle) {
		outcome, reason := h.Outcome()
		o.mu.Lock()
		o.list = append(o.list, string(outcome)+" "+reason)
		if u, ok := h.Usage(); ok {
			o.usage = append(o.usage, fmt.Sprint(u))
		} else {
			o.usage = append(o.usage, "")
		}
		o.mu.Unlock()
	}})
	return o
}

// usageAt returns the usage of the i-th attempt to end, as fmt prints
// it, "" when it reported none.
func (o *outcomes) usageAt(i int) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.usage[i]
}

// wait waits for n attempts to have ended and returns how.
func (o *outcomes) wait(t *testing.T, n int) []string {
	t.Helper()
	var got []string
	testsupport.EventuallyWhy(t, fmt.Sprintf("%d attempts to end", n), func() (string, bool) {
		o.mu.Lock()
		defer o.mu.Unlock()
		got = append([]string(nil), o.list...)
		return fmt.Sprint(got), len(got) >= n
	})
	return got
}

// client is an HTTP client whose requests cannot outlive the tests' wait.
var client = &http.Client{Timeout: testsupport.WaitTimeout}

// TestADeadEngineLeavesTheTokenizerRotation: of three static engines, one
// stops serving HTTP while its KV events go on. Every request is still
// tokenized (by the live engines) and routed with its prompt's tokens.
func TestADeadEngineLeavesTheTokenizerRotation(t *testing.T) {
	f := startFleet(t, []string{"a", "b", "dead"}, fleetOptions{})
	f.engine("dead").srv.Close()
	// Its scrapes fail: routing prefers the others, so no request of its
	// own ejects it.
	testsupport.EventuallyWhy(t, "the dead engine's metrics to be stale", func() (string, bool) {
		for _, c := range f.match([]uint32{1}).Decisions[0].Candidates {
			if c.Pod == "static/dead" {
				return string(c.Scrape), c.Scrape == "stale"
			}
		}
		return "not a candidate", false
	})
	for i := range 48 {
		resp, body := post(t, f.url+"/v1/completions", completion(fmt.Sprintf("prompt %d: %s", i, sharedPrompt), ""),
			map[string]string{"routing-strategy": routing.KVAware})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if n := f.metric(`kvgate_gateway_tokenization_failures_total{reason="connection"}`); n != 0 {
		t.Errorf("%v tokenizations failed to connect, want none", n)
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="no_tokens"}`); n != 0 {
		t.Errorf("%v requests routed without tokens, want none", n)
	}
	if n := len(f.engine("a").tokenizedModels()) + len(f.engine("b").tokenizedModels()); n != 48 {
		t.Errorf("the live engines tokenized %d prompts, want 48", n)
	}
}

// TestRequestBodiesThatDoNotArriveAreCutOff holds 50 connections that
// send a request's headers and part of its body: each is answered 408 and
// closed once the body timeout passes.
func TestRequestBodiesThatDoNotArriveAreCutOff(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{"KVGATE_REQUEST_BODY_TIMEOUT": "300ms"}})
	addr := strings.TrimPrefix(f.url, "http://")
	const n = 50
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+
			"Content-Length: 1000\r\n\r\n{\"model\":\"llama\",\"prompt\":\""); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	start := time.Now()
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(testsupport.WaitTimeout))
		answer, err := io.ReadAll(c) // to the connection's end
		if err != nil || !strings.HasPrefix(string(answer), "HTTP/1.1 408 ") || !strings.Contains(string(answer), codeRequestTimeout) {
			t.Fatalf("connection %d after %v: %q, %v; want a 408 and the connection closed", i, time.Since(start), answer, err)
		}
	}
	if got := f.metric("kvgate_gateway_request_body_timeouts_total"); got != n {
		t.Errorf("body timeouts counted %v, want %d", got, n)
	}
	if got := len(f.engine("a").received()); got != 0 {
		t.Errorf("the engine received %d requests, want none", got)
	}
}

// postBounded posts body to url with a client that gives up after the
// tests' wait, and returns the response and its body.
func postBounded(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

// readStream reads a streamed response to its end and returns what it
// read and the error that ended it, nil for a proper end.
func readStream(resp *http.Response) (string, error) {
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return string(data), err
}

// streamError returns the code of the OpenAI error event in a stream, ""
// when it has none.
func streamError(data string) string {
	for line := range strings.SplitSeq(data, "\n") {
		var e struct {
			Error *apiErrorBody `json:"error"`
		}
		if p, ok := strings.CutPrefix(line, "data: "); ok && json.Unmarshal([]byte(p), &e) == nil && e.Error != nil {
			return e.Error.Code
		}
	}
	return ""
}

// TestAPodThatStopsAnsweringTimesOut: an engine that sends no response, one
// whose body stalls and one whose stream stalls are each cut off after the
// upstream timeouts, with errors in OpenAI's shape, and their attempts
// recorded as failed.
func TestAPodThatStopsAnsweringTimesOut(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{
		"KVGATE_UPSTREAM_FIRST_BYTE_TIMEOUT": "300ms", "KVGATE_UPSTREAM_IDLE_TIMEOUT": "300ms"}})
	seen := watchOutcomes(f.gw)
	release := make(chan struct{})
	defer close(release)
	hang := func(r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}
	e := f.engine("a")

	e.setAnswer(func(_ http.ResponseWriter, r *http.Request, _ []byte) { hang(r) })
	start := time.Now()
	resp, body := postBounded(t, f.url+"/v1/completions", completion("hi", ""))
	if e := decodeError(t, body); resp.StatusCode != http.StatusGatewayTimeout || e.Code != codeUpstreamTimeout ||
		e.Type != typeUpstream || time.Since(start) > testsupport.WaitTimeout/2 {
		t.Errorf("no response: %d %s after %v; want 504 %s", resp.StatusCode, body, time.Since(start), codeUpstreamTimeout)
	}

	e.setAnswer(func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Length", "100")
		_, _ = io.WriteString(w, `{"id":"cmpl`)
		w.(http.Flusher).Flush()
		hang(r)
	})
	resp, body = postBounded(t, f.url+"/v1/completions", completion("hi", ""))
	if e := decodeError(t, body); resp.StatusCode != http.StatusGatewayTimeout || e.Code != codeUpstreamTimeout {
		t.Errorf("body that stalls: %d %s; want 504 %s", resp.StatusCode, body, codeUpstreamTimeout)
	}

	e.setAnswer(func(w http.ResponseWriter, r *http.Request, _ []byte) {
		writeSSE(w, []string{"data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"})
		hang(r)
	})
	data, err := readStream(openStream(t, f.url+"/v1/completions", completion("hi", `,"stream":true`)))
	if err == nil || !strings.HasPrefix(data, "data: {\"choices\"") || streamError(data) != codeUpstreamTimeout {
		t.Errorf("stream that stalls: %q, %v; want its first event, an %s error event and a broken end", data,
			err, codeUpstreamTimeout)
	}

	got := seen.wait(t, 3)
	want := []string{"failed " + failFirstByteTimeout, "failed " + failIdleTimeout, "failed " + failIdleTimeout}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("attempts ended %q, want %q", got, want)
	}
	for reason, n := range map[string]float64{failFirstByteTimeout: 1, failIdleTimeout: 2} {
		if got := f.metric(`kvgate_gateway_upstream_failures_total{reason="` + reason + `"}`); got != n {
			t.Errorf("upstream failures %s = %v, want %v", reason, got, n)
		}
	}
}

// cutAfter makes the engine answer with head (status line aside: 200) and
// body, then close the connection, whatever the body's framing promised.
func cutAfter(e *testEngine, header http.Header, body string) {
	e.setAnswer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, body)
		w.(http.Flusher).Flush()
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close()
		}
	})
}

// TestAMessagesResponseCutByThePodIsReportedInAnthropicsShape: a
// Messages stream the engine cuts ends with an Anthropic error event, and
// a whole response cut before its end is answered 502 with an Anthropic
// error.
func TestAMessagesResponseCutByThePodIsReportedInAnthropicsShape(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	e := f.engine("a")
	first := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg-1\"}}\n\n"
	cutAfter(e, http.Header{"Content-Type": {"text/event-stream"}}, first+"event: content_block_delta\ndata: {\"ty")
	data, err := readStream(openStream(t, f.url+PathMessages, anthropicBody("hi", `,"stream":true`)))
	_, payload, isError := strings.Cut(data, "\n\nevent: error\ndata: ")
	if err == nil || !strings.HasPrefix(data, first) || !isError || !strings.HasSuffix(payload, "\n\n") {
		t.Fatalf("cut stream: %q, %v; want its first event, an Anthropic error event and a broken end", data, err)
	}
	if ev := decodeAnthropicError(t, []byte(payload)); ev.Type != typeUpstream {
		t.Errorf("the stream's error event is of type %q, want %q", ev.Type, typeUpstream)
	}
	if strings.Contains(data, "content_block_delta") {
		t.Errorf("cut stream: %q; the event the engine left incomplete reached the client", data)
	}

	cutAfter(e, http.Header{"Content-Type": {"application/json"}, "Content-Length": {"500"}}, `{"id":"msg-1","content":[`)
	resp, body := post(t, f.url+PathMessages, anthropicBody("hi", ""), nil)
	if ev := decodeAnthropicError(t, body); resp.StatusCode != http.StatusBadGateway || ev.Type != typeUpstream {
		t.Errorf("cut response: %d %s; want 502 %s in Anthropic's shape", resp.StatusCode, body, typeUpstream)
	}
}

// TestAResponseCutByThePodReachesTheClientBroken: a stream the engine cuts
// reaches the client with an error event and without a proper end; a
// response that is not streamed is answered 502. Each attempt is recorded
// as failed.
func TestAResponseCutByThePodReachesTheClientBroken(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	seen := watchOutcomes(f.gw)
	e := f.engine("a")
	first := "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"

	cutAfter(e, http.Header{"Content-Type": {"text/event-stream"}}, first+"data: {\"cho")
	data, err := readStream(openStream(t, f.url+"/v1/completions", completion("hi", `,"stream":true`)))
	if err == nil || !strings.HasPrefix(data, first) || streamError(data) != codeUpstreamFailed || strings.Contains(data, "[DONE]") {
		t.Errorf("cut stream: %q, %v; want its first event, an %s error event and a broken end", data, err, codeUpstreamFailed)
	}

	for name, header := range map[string]http.Header{
		"content-length": {"Content-Type": {"application/json"}, "Content-Length": {"500"}},
		"chunked":        {"Content-Type": {"application/json"}},
	} {
		cutAfter(e, header, `{"id":"cmpl-1","choices":[`)
		resp, body := post(t, f.url+"/v1/completions", completion("hi", ""), nil)
		if e := decodeError(t, body); resp.StatusCode != http.StatusBadGateway || e.Code != codeUpstreamFailed {
			t.Errorf("cut %s response: %d %s; want 502 %s", name, resp.StatusCode, body, codeUpstreamFailed)
		}
	}
	got := seen.wait(t, 3)
	for _, o := range got {
		if o != "failed "+failBody {
			t.Errorf("attempts ended %q, want each failed %s", got, failBody)
			break
		}
	}
	if n := f.metric(`kvgate_gateway_upstream_failures_total{reason="body"}`); n != 3 {
		t.Errorf("body failures = %v, want 3", n)
	}
}

// TestAnOversizedEventIsPassedOnUnreadAndTheStreamGoesOn: an event longer
// than KVGATE_MAX_STREAM_EVENT_BYTES, arriving in pieces, reaches the
// client whole, in its place, and the stream ends well; it is counted, and
// the events after it are read as any: a chat's usage after it is
// recorded. One the gateway cannot read is relayed even when it is the
// usage chunk the gateway asked for itself, and a Responses stream whose
// final event is oversized ends without its usage.
func TestAnOversizedEventIsPassedOnUnreadAndTheStreamGoesOn(t *testing.T) {
	const bound = 4 << 10
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{"KVGATE_MAX_STREAM_EVENT_BYTES": strconv.Itoa(bound)}})
	seen := watchOutcomes(f.gw)
	chatChunk := func(delta string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"llama","choices":[{"index":0,"delta":` +
			delta + `,"finish_reason":null}]}` + "\n\n"
	}
	usageChunk := func(pad int) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"llama","choices":[],` +
			`"system_fingerprint":"` + strings.Repeat("f", pad) + `",` +
			`"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3}}` + "\n\n"
	}
	chat := func(middle, usage string) []string {
		return []string{chatChunk(`{"role":"assistant","content":""}`), chatChunk(`{"content":" a"}`), middle,
			chatChunk(`{"content":" c"}`), usage, "data: [DONE]\n\n"}
	}
	bigText := strings.Repeat("long reasoning ", 2*bound/15)
	responses := responsesEvents("llama", responsesUsage(5))
	last := len(responses) - 1
	responses[last] = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":" +
		responsesObject("llama", "completed", `[{"id":"msg_1","content":[{"annotations":[],"text":`+strconv.Quote(bigText)+
			`,"type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message"}]`,
			responsesUsage(5)) + ",\"sequence_number\":" + strconv.Itoa(last) + "}\n\n"
	chatBody := `{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true}`
	cases := []struct {
		name, path, body string
		events           []string
		// oversized is the index of the oversized event, withheld that of
		// the usage chunk the client does not get (-1: none).
		oversized, withheld int
		usage               bool
	}{
		{"an oversized chat chunk in the middle", PathChatCompletions, chatBody,
			chat(chatChunk(`{"content":`+strconv.Quote(strings.Repeat("b", 2*bound))+`}`), usageChunk(0)), 2, 4, true},
		{"an oversized usage chunk the gateway asked for", PathChatCompletions, chatBody,
			chat(chatChunk(`{"content":" b"}`), usageChunk(2*bound)), 4, -1, false},
		{"an oversized response.completed", PathResponses, responsesBody("hi", `,"stream":true`), responses, last, -1, false},
	}
	want, unread := 0.0, 0.0
	for _, tc := range cases {
		if len(tc.events[tc.oversized]) <= bound {
			t.Fatalf("%s: event %d is %d bytes, want it beyond %d", tc.name, tc.oversized, len(tc.events[tc.oversized]), bound)
		}
		for _, crlf := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, CRLF %v", tc.name, crlf), func(t *testing.T) {
				var pieces []string
				var wantBody strings.Builder
				for i, ev := range tc.events {
					if crlf {
						ev = strings.ReplaceAll(ev, "\n", "\r\n")
					}
					if i != tc.withheld {
						wantBody.WriteString(ev)
					}
					if i == tc.oversized { // in pieces, each cut within a line
						pieces = append(pieces, ev[:bound/2], ev[bound/2:bound+bound/2], ev[bound+bound/2:])
						continue
					}
					pieces = append(pieces, ev)
				}
				f.engine("a").setAnswer(func(w http.ResponseWriter, _ *http.Request, _ []byte) { writeSSE(w, pieces) })
				before := int(want) // the attempts of the streams before
				data, err := readStream(openStream(t, f.url+tc.path, tc.body))
				if err != nil || data != wantBody.String() {
					t.Errorf("client received %d bytes, %v; want the %d bytes the pod sent (the usage withheld), a proper end:\n got %.400q\nwant %.400q",
						len(data), err, wantBody.Len(), data, wantBody.String())
				}
				if got := seen.wait(t, before+1)[before]; got != "done " {
					t.Errorf("attempt ended %q, want done", got)
				}
				wantUsage := ""
				if tc.usage {
					wantUsage = fmt.Sprint(inflight.Usage{PromptTokens: 12, CompletionTokens: 3})
				} else {
					unread++
				}
				if u := seen.usageAt(before); u != wantUsage {
					t.Errorf("attempt's usage %q, want %q", u, wantUsage)
				}
			})
			want++
		}
	}
	if n := f.metric("kvgate_gateway_oversized_events_total"); n != want {
		t.Errorf("oversized events counted %v, want %v (one a stream)", n, want)
	}
	if n := f.metric(`kvgate_gateway_time_to_first_token_seconds_count{model="llama"}`); n != want {
		t.Errorf("first tokens observed %v, want %v", n, want)
	}
	if n := f.metric("kvgate_gateway_responses_without_usage_total"); n != unread {
		t.Errorf("responses without usage %v, want %v", n, unread)
	}
}

// TestAnEventWithoutEndIsPassedOnUntilThePodGoesQuiet: an engine that
// sends a line without end has it relayed as it comes, beyond the bound
// the gateway holds, until the idle timeout cuts the stream off.
func TestAnEventWithoutEndIsPassedOnUntilThePodGoesQuiet(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{
		"KVGATE_MAX_STREAM_EVENT_BYTES": "4096", "KVGATE_UPSTREAM_IDLE_TIMEOUT": "300ms"}})
	seen := watchOutcomes(f.gw)
	first := "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"
	endless := "data: " + strings.Repeat("x", 64<<10)
	pieces := []string{first}
	for len(pieces) < 17 {
		pieces = append(pieces, endless[:len(endless)/2], endless[len(endless)/2:])
	}
	release := make(chan struct{})
	defer close(release)
	f.engine("a").setAnswer(func(w http.ResponseWriter, r *http.Request, _ []byte) {
		writeSSE(w, pieces)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	data, err := readStream(openStream(t, f.url+"/v1/completions", completion("hi", `,"stream":true`)))
	sent := strings.Join(pieces, "")
	if err == nil || !strings.HasPrefix(data, sent+"\n\n") || streamError(data) != codeUpstreamTimeout {
		t.Errorf("endless event: %d bytes (error event %q), %v; want the %d bytes sent, an %s error event and a broken end",
			len(data), streamError(data), err, len(sent), codeUpstreamTimeout)
	}
	if got := seen.wait(t, 1); got[0] != "failed "+failIdleTimeout {
		t.Errorf("attempt ended %q, want failed %s", got[0], failIdleTimeout)
	}
	if n := f.metric("kvgate_gateway_oversized_events_total"); n != 1 {
		t.Errorf("oversized events = %v, want 1", n)
	}
}

// TestAClientThatLeavesIsNoUpstreamFailure: a client that leaves a stream,
// or a response it is still waiting for, ends its attempt as cancelled and
// its request as 499; the engine's request is cancelled, and no upstream
// failure is counted.
func TestAClientThatLeavesIsNoUpstreamFailure(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	seen := watchOutcomes(f.gw)
	cancelled := make(chan struct{}, 2)
	f.engine("a").setAnswer(func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), `"stream":true`) {
			writeSSE(w, []string{"data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"})
		}
		<-r.Context().Done()
		cancelled <- struct{}{}
	})
	for _, stream := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		extra := ""
		if stream {
			extra = `,"stream":true`
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/completions", strings.NewReader(completion("hi", extra)))
		done := make(chan struct{})
		go func() {
			defer close(done)
			resp, err := client.Do(req)
			if err == nil {
				_, _ = bufio.NewReader(resp.Body).ReadString('\n')
				cancel()
				resp.Body.Close()
			}
		}()
		if !stream {
			testsupport.EventuallyWhy(t, "the engine to receive the request", func() (string, bool) {
				n := len(f.engine("a").received())
				return strconv.Itoa(n), n == 2
			})
			cancel()
		}
		<-done
		select {
		case <-cancelled:
		case <-time.After(testsupport.WaitTimeout):
			t.Fatalf("stream %v: the engine's request was not cancelled", stream)
		}
	}
	if got := seen.wait(t, 2); fmt.Sprint(got) != "[cancelled client went away cancelled client went away]" {
		t.Errorf("attempts ended %q, want both cancelled", got)
	}
	testsupport.EventuallyWhy(t, "both requests to count as 499", func() (string, bool) {
		n := f.metric(`kvgate_gateway_requests_total{algorithm="kv-aware",code="499",endpoint="/v1/completions",model="llama"}`)
		return fmt.Sprint(n), n == 2
	})
	for _, reason := range []string{failBody, failSend, failIdleTimeout} {
		if n := f.metric(`kvgate_gateway_upstream_failures_total{reason="` + reason + `"}`); n != 0 {
			t.Errorf("upstream failures %s = %v, want none", reason, n)
		}
	}
}

// TestAPodsNoContentIsRelayedAsASuccess: a pod's 204 has an empty body,
// whose relay is no write error: the client gets the 204, and the request
// counts as answered, not as a client gone (499).
func TestAPodsNoContentIsRelayedAsASuccess(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	seen := watchOutcomes(f.gw)
	f.engine("a").setAnswer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.WriteHeader(http.StatusNoContent)
	})
	// A connection of its own, read by leanhttp.
	c, br := dialGateway(t, f)
	body := completion("hi", "")
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+
		"Content-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get(HeaderTargetPodName) != "static/a" {
		t.Fatalf("got %d from %q, want 204 from static/a", resp.StatusCode, resp.Header.Get(HeaderTargetPodName))
	}
	if got := seen.wait(t, 1); got[0] != "done " {
		t.Fatalf("the attempt ended %q, want done", got[0])
	}
	testsupport.EventuallyWhy(t, "the request to count as 204", func() (string, bool) {
		n := f.metric(`kvgate_gateway_requests_total{algorithm="kv-aware",code="204",endpoint="/v1/completions",model="llama"}`)
		return fmt.Sprint(n), n == 1
	})
	if n := f.metric(`kvgate_gateway_requests_total{algorithm="kv-aware",code="499",endpoint="/v1/completions",model="llama"}`); n != 0 {
		t.Errorf("%v requests counted as 499", n)
	}
}

// TestDebugMatchIsBounded: a prompt beyond the bound is refused at once,
// and requests beyond those served at once are answered 429.
func TestDebugMatchIsBounded(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	var b strings.Builder
	b.WriteString(`{"model":"llama","tokens":[`)
	for i := range maxMatchTokens + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('7')
	}
	b.WriteString(`]}`)
	start := time.Now()
	resp, data := post(t, f.adminURL+"/debug/match", b.String(), nil)
	if e := decodeError(t, data); resp.StatusCode != http.StatusRequestEntityTooLarge || e.Code != codeRequestTooLarge {
		t.Errorf("%d tokens: %d %s after %v; want 413", maxMatchTokens+1, resp.StatusCode, data, time.Since(start))
	}

	held, release := f.engine("a").holdTokenize()
	results := make(chan int, maxConcurrentMatches)
	for i := range maxConcurrentMatches {
		go func() {
			resp, _, err := tryPost(f.adminURL+"/debug/match", fmt.Sprintf(`{"model":"llama","prompt":"held %d"}`, i), nil)
			status := 0
			if err == nil {
				status = resp.StatusCode
			}
			results <- status
		}()
	}
	for range maxConcurrentMatches {
		<-held
	}
	resp, data = post(t, f.adminURL+"/debug/match", `{"model":"llama","tokens":[1,2,3]}`, nil)
	if e := decodeError(t, data); resp.StatusCode != http.StatusTooManyRequests || e.Code != codeTooManyRequests ||
		resp.Header.Get("Retry-After") == "" {
		t.Errorf("a match beyond %d at once: %d %s; want 429 with Retry-After", maxConcurrentMatches, resp.StatusCode, data)
	}
	release()
	for range maxConcurrentMatches {
		if status := <-results; status != http.StatusOK {
			t.Errorf("a held match ended %d, want 200", status)
		}
	}
	for reason, n := range map[string]float64{"busy": 1, "too_large": 1} {
		if got := f.metric(`kvgate_gateway_debug_match_refusals_total{reason="` + reason + `"}`); got != n {
			t.Errorf("refusals %s = %v, want %v", reason, got, n)
		}
	}
}

// TestReadinessAnswers503ThroughTheDefaultShutdownDelay: with the shutdown
// delay at its default, a gateway told to stop answers /readyz with 503,
// rather than refusing connections, long enough for load balancers to see
// it draining.
func TestReadinessAnswers503ThroughTheDefaultShutdownDelay(t *testing.T) {
	e := newTestEngine(t, "a")
	env := map[string]string{"KVGATE_POD_DISCOVERY": "static", "KVGATE_STATIC_ENDPOINTS_FILE": writeEndpoints(t, "endpoints:\n"+e.endpointYAML(nil))}
	cfg := LoadConfig(config.NewEnv(func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}))
	if cfg.ShutdownDelay < 2*time.Second {
		t.Fatalf("default shutdown delay %v, want some seconds", cfg.ShutdownDelay)
	}
	_, url, stop := serveGateway(t, cfg)
	testsupport.EventuallyWhy(t, "the gateway to be ready", func() (string, bool) {
		status, body := get(t, url+"/readyz")
		return body, status == http.StatusOK
	})
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	testsupport.EventuallyWhy(t, "readiness to fail", func() (string, bool) {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			t.Fatalf("/readyz refused as shutdown began: %v", err)
		}
		resp.Body.Close()
		return resp.Status, resp.StatusCode == http.StatusServiceUnavailable
	})
	// A load balancer probing every second sees the 503 several times.
	for deadline := time.Now().Add(cfg.ShutdownDelay / 2); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			t.Fatalf("/readyz refused %v into a shutdown delay of %v: %v", time.Since(deadline.Add(-cfg.ShutdownDelay/2)),
				cfg.ShutdownDelay, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("/readyz answered %s while shutting down", resp.Status)
		}
	}
	waitStopped(t, stopped)
}

// TestInferenceRequestsAreServedWhicheverServerReadsThem: on one
// connection, completions with a Content-Length (read by leanhttp), one
// with a chunked body (which takes the connection to net/http's server) and
// one after it are each routed, forwarded whole and answered.
func TestInferenceRequestsAreServedWhicheverServerReadsThem(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	c, br := dialGateway(t, f)
	bodies := []string{completion("one", ""), completion("two", ""), completion("three", "")}
	for i, body := range bodies {
		framing := "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
		if i == 1 {
			framing = "Transfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n"
		}
		if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+framing); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/a" {
			t.Fatalf("request %d: %d from %q, %v; want 200 from static/a", i, resp.StatusCode, resp.Header.Get(HeaderTargetPodName), err)
		}
	}
	got := f.engine("a").received()
	if len(got) != len(bodies) {
		t.Fatalf("the engine received %d requests, want %d", len(got), len(bodies))
	}
	for i, r := range got {
		if string(r.body) != bodies[i] {
			t.Errorf("request %d reached the engine as %q, want %q", i, r.body, bodies[i])
		}
	}
}

// TestAClientThatReadsNothingIsCutAfterTheWriteTimeout: a client that
// sends a request and reads nothing of its response, streamed or whole,
// has its connection closed once a write to it blocks for the write
// timeout; its attempt ends and the engine's request is cancelled.
func TestAClientThatReadsNothingIsCutAfterTheWriteTimeout(t *testing.T) {
	_, written := cutClientsThatReadNothing(t, map[string]string{"KVGATE_CLIENT_WRITE_TIMEOUT": "300ms"},
		"cancelled client went away", "kvgate_gateway_client_write_timeouts_total")
	if n := written.Load(); n >= clientCutAfter {
		t.Errorf("the engine wrote %d bytes, want its writes to fail well before %d", n, clientCutAfter)
	}
}

// clientCutAfter is the most bytes the engine of cutClientsThatReadNothing
// writes of one response.
const clientCutAfter = 1 << 30

// cutClientsThatReadNothing runs a gateway configured by env in front of an
// engine that answers each request with up to clientCutAfter bytes, sends a
// streamed then a whole request on connections that read nothing of their
// responses, and wants each cut: the engine's request cancelled, the
// attempt ended as outcome and the counter named counted. It returns the
// fleet and the bytes the engine wrote.
func cutClientsThatReadNothing(t *testing.T, env map[string]string, outcome, counter string) (*testFleet, *atomic.Int64) {
	t.Helper()
	f := startFleet(t, []string{"a"}, fleetOptions{env: env})
	seen := watchOutcomes(f.gw)
	written := new(atomic.Int64)
	cancelled := make(chan struct{}, 2)
	f.engine("a").setAnswer(func(w http.ResponseWriter, r *http.Request, body []byte) {
		defer func() { cancelled <- struct{}{} }()
		chunk := []byte("data: {\"choices\":[{\"index\":0,\"text\":\"" + strings.Repeat("x", 16<<10) + "\"}]}\n\n")
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Length", strconv.Itoa(clientCutAfter))
		}
		for written.Load() < clientCutAfter {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			written.Add(int64(len(chunk)))
		}
	})
	addr := strings.TrimPrefix(f.url, "http://")
	for i, extra := range []string{`,"stream":true`, ""} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
		body := completion("hi", extra)
		if _, err := fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			len(body), body); err != nil {
			t.Fatal(err)
		}
		select {
		case <-cancelled:
		case <-time.After(testsupport.WaitTimeout):
			t.Fatalf("request %d: the engine's request was not cancelled (%d bytes written)", i, written.Load())
		}
		if got := seen.wait(t, i+1); got[i] != outcome {
			t.Errorf("request %d: attempt ended %q, want %s", i, got[i], outcome)
		}
		testsupport.EventuallyWhy(t, counter+" to count the cut", func() (string, bool) {
			n := f.metric(counter)
			return fmt.Sprint(n), n == float64(i+1)
		})
	}
	return f, written
}

// responseTimeoutEnv bounds responses to 1 s, the headers among them,
// while an engine that sends something every 100 ms never meets the idle
// timeout.
var responseTimeoutEnv = map[string]string{"KVGATE_UPSTREAM_FIRST_BYTE_TIMEOUT": "1s",
	"KVGATE_UPSTREAM_IDLE_TIMEOUT": "10s", "KVGATE_UPSTREAM_RESPONSE_TIMEOUT": "1s"}

// TestAResponseLongerThanItsBoundIsCut: an engine that streams an event
// every 100 ms, and one that sends a whole response a byte every 100 ms,
// each well within the idle timeout, are cut once the response timeout
// passes: the stream with an error event and a broken end, the response
// nothing was relayed of with 504. The pod's connection is closed, the
// attempts fail and are counted.
func TestAResponseLongerThanItsBoundIsCut(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{env: responseTimeoutEnv})
	seen := watchOutcomes(f.gw)
	// Without the bound, the engine would end each response properly
	// after 15 s.
	const drips = 150
	ended := make(chan string, 2)
	first := "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"
	f.engine("a").setAnswer(func(w http.ResponseWriter, r *http.Request, body []byte) {
		stream := strings.Contains(string(body), `"stream":true`)
		if stream {
			writeSSE(w, nil)
		} else {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(drips))
		}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for range drips {
			drip := "x"
			if stream {
				drip = first
			}
			if _, err := io.WriteString(w, drip); err != nil {
				ended <- "write failed"
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-tick.C:
			case <-r.Context().Done():
				ended <- "cancelled"
				return
			}
		}
		ended <- "ended"
	})
	engineEnd := func(what string) {
		t.Helper()
		select {
		case how := <-ended:
			if how == "ended" {
				t.Errorf("%s: the engine sent its whole response, want its connection closed", what)
			}
		case <-time.After(testsupport.WaitTimeout):
			t.Fatalf("%s: the engine's connection was not closed", what)
		}
	}

	start := time.Now()
	data, err := readStream(openStream(t, f.url+"/v1/completions", completion("hi", `,"stream":true`)))
	took := time.Since(start)
	if err == nil || !strings.HasPrefix(data, first) || streamError(data) != codeUpstreamTimeout {
		t.Errorf("slow stream after %v: %q, %v; want its first events, an %s error event and a broken end", took, data,
			err, codeUpstreamTimeout)
	}
	engineEnd("stream")
	if got := seen.wait(t, 1); got[0] != "failed "+failResponseTimeout {
		t.Errorf("stream: attempt ended %q, want failed %s", got[0], failResponseTimeout)
	}
	if n := f.metric(`kvgate_gateway_upstream_failures_total{reason="response_timeout"}`); n != 1 {
		t.Errorf("stream: response timeouts = %v, want 1", n)
	}

	resp, body := postBounded(t, f.url+"/v1/completions", completion("hi", ""))
	if e := decodeError(t, body); resp.StatusCode != http.StatusGatewayTimeout || e.Code != codeUpstreamTimeout ||
		!strings.Contains(e.Message, "did not end its response within 1s") {
		t.Errorf("slow whole response: %d %s; want 504 %s", resp.StatusCode, body, codeUpstreamTimeout)
	}
	engineEnd("whole response")
	if got := seen.wait(t, 2); got[1] != "failed "+failResponseTimeout {
		t.Errorf("whole response: attempt ended %q, want failed %s", got[1], failResponseTimeout)
	}
	for reason, n := range map[string]float64{failResponseTimeout: 2, failIdleTimeout: 0, failFirstByteTimeout: 0} {
		if got := f.metric(`kvgate_gateway_upstream_failures_total{reason="` + reason + `"}`); got != n {
			t.Errorf("upstream failures %s = %v, want %v", reason, got, n)
		}
	}
}

// TestAClientThatReadsTooSlowlyIsCutAtTheResponseTimeout: a client that
// reads nothing of its response, streamed or whole, has its connection
// closed once the response timeout passes, well before the write timeout;
// the pod's connection is closed, and the attempt fails and is counted.
func TestAClientThatReadsTooSlowlyIsCutAtTheResponseTimeout(t *testing.T) {
	env := map[string]string{"KVGATE_CLIENT_WRITE_TIMEOUT": "10m"}
	for k, v := range responseTimeoutEnv {
		env[k] = v
	}
	f, _ := cutClientsThatReadNothing(t, env, "failed "+failResponseTimeout,
		`kvgate_gateway_upstream_failures_total{reason="response_timeout"}`)
	if n := f.metric("kvgate_gateway_client_write_timeouts_total"); n != 0 {
		t.Errorf("write timeouts = %v, want none", n)
	}
}

// TestTheResponseTimeoutBoundsOnlyItsResponse: once a response has ended,
// its bound passing does not cut the next answer on the same connection,
// though that answer never reaches a pod.
func TestTheResponseTimeoutBoundsOnlyItsResponse(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{env: responseTimeoutEnv})
	c, br := dialGateway(t, f)
	ask := func(body string) (int, string) {
		t.Helper()
		if _, err := fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			len(body), body); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return resp.StatusCode, string(data)
	}
	if status, data := ask(completion("hi", "")); status != http.StatusOK {
		t.Fatalf("first request: %d %s", status, data)
	}
	// Not a synchronization: the first response's bound is to pass.
	time.Sleep(1500 * time.Millisecond)
	if status, data := ask(`{"model":"llama","prompt":`); status != http.StatusBadRequest || !strings.Contains(data, codeInvalidJSON) {
		t.Errorf("request after the first one's bound: %d %s; want 400 %s", status, data, codeInvalidJSON)
	}
	if n := f.metric(`kvgate_gateway_upstream_failures_total{reason="response_timeout"}`); n != 0 {
		t.Errorf("response timeouts = %v, want none", n)
	}
}

// TestRequestBytesHeldAtOnceAreBounded: bodies on their way hold the
// gateway's budget of request bytes; a request that would pass it, with a
// length declared or in chunks, is refused with 503 and a Retry-After,
// and the bytes come back when the requests end.
func TestRequestBytesHeldAtOnceAreBounded(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{
		"KVGATE_MAX_REQUEST_BODY_BYTES": "40000", "KVGATE_MAX_HELD_REQUEST_BYTES": "65536"}})
	addr := strings.TrimPrefix(f.url, "http://")
	send := func(head, body string) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+head+"\r\n"+body); err != nil {
			t.Fatal(err)
		}
		return c
	}
	answer := func(c net.Conn) *http.Response {
		_ = c.SetReadDeadline(time.Now().Add(testsupport.WaitTimeout))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	prompt := strings.Repeat("a ", 14000)
	whole := completion(prompt, "")
	declared := fmt.Sprintf("Content-Length: %d\r\n", len(whole))
	// Two bodies on their way hold 2 x 28 KB of the 64 KiB.
	first, second := send(declared, whole[:100]), send(declared, whole[:100])
	testsupport.EventuallyWhy(t, "both bodies to be held", func() (string, bool) {
		n := f.metric("kvgate_gateway_held_request_bytes")
		return fmt.Sprint(n), n == float64(2*len(whole))
	})
	for _, c := range []net.Conn{
		send(declared, ""),
		send("Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(whole), whole)),
	} {
		resp := answer(c)
		data, _ := io.ReadAll(resp.Body)
		if e := decodeError(t, data); resp.StatusCode != http.StatusServiceUnavailable || e.Code != codeOverloaded ||
			resp.Header.Get("Retry-After") != "1" {
			t.Errorf("a third body: %d %s (Retry-After %q), want 503 %s with Retry-After 1", resp.StatusCode, data,
				resp.Header.Get("Retry-After"), codeOverloaded)
		}
	}
	if n := f.metric("kvgate_gateway_held_request_bytes_refusals_total"); n != 2 {
		t.Errorf("refusals counted %v, want 2", n)
	}
	for _, c := range []net.Conn{first, second} {
		if _, err := io.WriteString(c, whole[100:]); err != nil {
			t.Fatal(err)
		}
		if resp := answer(c); resp.StatusCode != http.StatusOK {
			t.Errorf("a held body once whole: %d, want 200", resp.StatusCode)
		}
	}
	testsupport.EventuallyWhy(t, "the held bytes to come back", func() (string, bool) {
		n := f.metric("kvgate_gateway_held_request_bytes")
		return fmt.Sprint(n), n == 0
	})
	if resp, data := postBounded(t, f.url+"/v1/completions", whole); resp.StatusCode != http.StatusOK {
		t.Errorf("after the others ended: %d %s, want 200", resp.StatusCode, data)
	}
}

// TestClientConnectionsHeldAtOnceAreBounded: with the API listener holding
// as many client connections as it may, the next client's connection
// waits unanswered, the wait counted, until one of them closes; then it is
// served.
func TestClientConnectionsHeldAtOnceAreBounded(t *testing.T) {
	const most = 4
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{
		"KVGATE_MAX_CLIENT_CONNECTIONS": strconv.Itoa(most),
		// The metrics are read there: the API listener has no connection
		// to spare.
		"KVGATE_ADMIN_LISTEN_ADDRESS": fmt.Sprintf("127.0.0.1:%d", testsupport.FreePorts(t, 1)[0])}})
	http.DefaultClient.CloseIdleConnections() // the readiness checks' connection
	addr := strings.TrimPrefix(f.url, "http://")
	body := completion("hi", "")
	request := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(body), body)
	send := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, request); err != nil {
			t.Fatal(err)
		}
		return c, bufio.NewReader(c)
	}
	answered := func(c net.Conn, r *bufio.Reader, within time.Duration) (*http.Response, error) {
		_ = c.SetReadDeadline(time.Now().Add(within))
		resp, err := http.ReadResponse(r, nil)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	connections := func(want float64) {
		t.Helper()
		testsupport.EventuallyWhy(t, fmt.Sprintf("%v client connections to be counted open", want), func() (string, bool) {
			n := f.metric("kvgate_gateway_client_connections")
			return fmt.Sprint(n), n == want
		})
	}
	// Each held connection was answered and stays open, idle.
	held := make([]net.Conn, most)
	for i := range held {
		c, r := send()
		if resp, err := answered(c, r, testsupport.WaitTimeout); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("held connection %d: %v, %v; want 200", i, resp, err)
		}
		held[i] = c
	}
	connections(most)
	next, r := send()
	testsupport.EventuallyWhy(t, "the listener to wait at the bound", func() (string, bool) {
		n := f.metric("kvgate_gateway_client_connection_limit_waits_total")
		return fmt.Sprint(n), n >= 1
	})
	if resp, err := answered(next, r, 300*time.Millisecond); err == nil {
		t.Fatalf("a connection beyond the bound was answered %d while %d others were held", resp.StatusCode, most)
	} else if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection beyond the bound: %v, want no answer yet", err)
	}
	connections(most)
	_ = held[0].Close()
	if resp, err := answered(next, r, testsupport.WaitTimeout); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("once a held connection closed, the waiting one got %v, %v; want 200", resp, err)
	}
	connections(most)
	for _, c := range append(held[1:], next) {
		_ = c.Close()
	}
	connections(0)
}

// TestShutdownEndsTheWaitForAConnectionSlot: a gateway holding as many
// client connections as it may, its listener waiting for one to close,
// shuts down, through leanhttp and net/http alike.
func TestShutdownEndsTheWaitForAConnectionSlot(t *testing.T) {
	for _, disableProxy := range []bool{false, true} {
		t.Run(fmt.Sprintf("DisableProxy=%v", disableProxy), func(t *testing.T) {
			f := startFleet(t, []string{"a"}, fleetOptions{
				env: map[string]string{"KVGATE_MAX_CLIENT_CONNECTIONS": "1",
					"KVGATE_ADMIN_LISTEN_ADDRESS": fmt.Sprintf("127.0.0.1:%d", testsupport.FreePorts(t, 1)[0])},
				configure: func(c *Config) { c.DisableProxy = disableProxy }})
			http.DefaultClient.CloseIdleConnections() // the readiness checks' connection
			held := &http.Client{Timeout: testsupport.WaitTimeout, Transport: &http.Transport{}}
			defer held.CloseIdleConnections()
			if resp, err := held.Get(f.url + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /healthz: %v, %v; want 200", resp, err)
			} else {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			testsupport.EventuallyWhy(t, "the listener to wait at the bound", func() (string, bool) {
				n := f.metric("kvgate_gateway_client_connection_limit_waits_total")
				return fmt.Sprint(n), n >= 1
			})
			// stop fails the test when Serve does not return.
			if err := f.stop(); err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
}

// dialGateway opens a connection to f's gateway, closed when the test
// ends, whose reads and writes fail after testsupport.WaitTimeout, and a
// reader of it.
func dialGateway(t *testing.T, f *testFleet) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(testsupport.WaitTimeout))
	return c, bufio.NewReader(c)
}

// TestAnHTTP10ExpectContinueIsIgnored: HTTP/1.0 has no 100 Continue; a
// server that receives that expectation in an HTTP/1.0 request must ignore
// it (RFC 9110 10.1.1). The request is served, its body read without a 100
// response, not refused with 417.
func TestAnHTTP10ExpectContinueIsIgnored(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	c, br := dialGateway(t, f)
	body := completion("one point oh", "")
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.0\r\nHost: gw\r\nContent-Type: application/json\r\n"+
		"Expect: 100-continue\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/a" {
		t.Fatalf("got %d from %q (%v): %s; want 200 from static/a", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), err, data)
	}
	if got := f.engine("a").received(); len(got) != 1 || string(got[0].body) != body {
		t.Errorf("the engine received %d requests, want the one sent", len(got))
	}
}
