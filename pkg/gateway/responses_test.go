package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/routing"
)

// responsesInstructions are the instructions of the test Responses
// requests.
const responsesInstructions = "You answer in three words."

// responsesBody is a /v1/responses body with the instructions
// responsesInstructions and the input user, plus extra members.
func responsesBody(user, extra string) string {
	u, _ := json.Marshal(user)
	return `{"model":"llama","max_output_tokens":16,"store":false,"instructions":"` + responsesInstructions +
		`","input":` + string(u) + extra + `}`
}

// responsesPromptTokens are the test engines' tokens of the chat vLLM
// converts responsesBody(user, ...) into: the instructions as a system
// message, then the user's input.
func responsesPromptTokens(user string) []uint32 {
	return toyTokens(responsesInstructions + "\n" + user + "\n")
}

// predictedTraces returns how many responses the model's output predictor
// has learned from.
func predictedTraces(t *testing.T, f *testFleet, model string) int32 {
	t.Helper()
	p, err := f.gw.predictors.GetOutputPredictor(model)
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, c := range p.Histogram() {
		n += c
	}
	return n
}

func TestResponsesReportTheirFirstTokenAndUsageToTheLedger(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	seen := watchAttempts(f.gw)
	e := f.engine("a")
	noUsage := func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		writeSSE(w, responsesEvents("llama", "null"))
	}
	cases := []struct {
		name, extra string
		answer      func(http.ResponseWriter, *http.Request, []byte)
		// stream: the response streams, and its first output event is a
		// first token; usage: it reports one.
		stream, usage bool
	}{
		{name: "whole", usage: true},
		{name: "stream", extra: `,"stream":true`, stream: true, usage: true},
		{name: "stream without usage", extra: `,"stream":true`, answer: noUsage, stream: true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.setAnswer(c.answer)
			ttft := f.metric(`kvgate_gateway_time_to_first_token_seconds_count{model="llama"}`)
			missing := f.metric("kvgate_gateway_responses_without_usage_total")
			learned := predictedTraces(t, f, "llama")
			tokenized := len(e.tokenizedModels())
			body := responsesBody(strings.Repeat("tell me more about "+c.name+" ", 8), c.extra)
			resp, got := post(t, f.url+PathResponses, body, map[string]string{routing.HeaderRoutingStrategy: routing.KVAware})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, got)
			}
			if c.stream != strings.HasPrefix(string(got), "event: response.created\n") {
				t.Fatalf("the client received %q", got)
			}
			if c.usage && c.stream && !strings.Contains(string(got), `"usage":{"input_tokens":`+fmt.Sprint(len(body))) {
				t.Errorf("the client did not receive the stream's usage: %q", got)
			}
			if r := e.received(); string(r[len(r)-1].body) != body {
				t.Errorf("the engine received %s; want the client's body as sent", r[len(r)-1].body)
			}
			if n := len(e.tokenizedModels()); n != tokenized+1 {
				t.Errorf("the prompt was tokenized %d times, want once", n-tokenized)
			}
			h, first := seen.wait(t, i+1)
			if o, reason := h.Outcome(); o != inflight.Done {
				t.Errorf("the attempt closed %v (%s), want done", o, reason)
			}
			u, ok := h.Usage()
			switch {
			case c.usage && (!ok || u.PromptTokens != int64(len(body)) || u.CompletionTokens != 3 ||
				!u.CachedReported || u.CachedTokens != responsesCached):
				t.Errorf("usage %+v (reported %v); want input_tokens %d as the prompt's, output_tokens 3 as the completion's, "+
					"%d cached", u, ok, len(body), responsesCached)
			case !c.usage && ok:
				t.Errorf("usage %+v reported for a response without one", u)
			}
			wantMissing, wantLearned := missing, learned
			if c.usage {
				wantLearned++
			} else {
				wantMissing++
			}
			if n := f.metric("kvgate_gateway_responses_without_usage_total"); n != wantMissing {
				t.Errorf("responses without usage = %v, want %v", n, wantMissing)
			}
			if n := predictedTraces(t, f, "llama"); n != wantLearned {
				t.Errorf("the output predictor learned from %d responses, want %d", n, wantLearned)
			}
			wantFirst, wantTTFT := 0, ttft
			for _, c := range cases[:i+1] {
				if c.stream {
					wantFirst++
				}
			}
			if c.stream {
				wantTTFT++
				if h.FirstTokenAt().IsZero() {
					t.Error("the attempt has no first token")
				}
			}
			if first != wantFirst {
				t.Errorf("%d first tokens reported to the ledger, want %d", first, wantFirst)
			}
			if n := f.metric(`kvgate_gateway_time_to_first_token_seconds_count{model="llama"}`); n != wantTTFT {
				t.Errorf("time to first token observed %v times, want %v", n, wantTTFT)
			}
		})
	}
}

// TestAResponsesStreamsFirstTokenIsItsFirstOutputEvent: vLLM sends
// response.created and response.in_progress before anything is generated;
// the first token is the event that follows them.
func TestAResponsesStreamsFirstTokenIsItsFirstOutputEvent(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	seen := watchAttempts(f.gw)
	events := responsesEvents("llama", responsesUsage(5))
	release := make(chan struct{})
	f.engine("a").setAnswer(func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i, ev := range events {
			if i == 2 {
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			_, _ = w.Write([]byte(ev))
			w.(http.Flusher).Flush()
		}
	})
	resp := openStream(t, f.url+PathResponses, responsesBody("hello", `,"stream":true`))
	defer resp.Body.Close()
	// Both opening events reach the client before the engine generates.
	want := events[0] + events[1]
	got := make([]byte, len(want))
	if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != want {
		t.Fatalf("the stream began with %q, %v; want %q", got, err, want)
	}
	seen.mu.Lock()
	first := seen.first
	seen.mu.Unlock()
	if first != 0 {
		t.Fatal("a first token was reported before the engine generated one")
	}
	close(release)
	if rest, err := readStream(resp); err != nil || rest != strings.Join(events[2:], "") {
		t.Fatalf("the rest of the stream: %q, %v", rest, err)
	}
	if _, first := seen.wait(t, 1); first != 1 {
		t.Errorf("%d first tokens reported, want 1", first)
	}
}

func TestResponsesGoToThePodHoldingTheirConvertedPromptsPrefix(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	tokens := responsesPromptTokens(sharedPrompt)
	b := f.engine("b")
	f.waitMatched(tokens, "b", len(b.storePrompt(tokens)))
	for _, extra := range []string{"", `,"stream":true`} {
		for range 3 {
			resp, body := post(t, f.url+PathResponses, responsesBody(sharedPrompt, extra),
				map[string]string{routing.HeaderRoutingStrategy: routing.KVAware})
			if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/b" {
				t.Fatalf("%d from %q: %s; want b, which holds the prompt", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), body)
			}
		}
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="prefix_hit"}`); n != 6 {
		t.Errorf("kv-aware prefix hits = %v, want 6", n)
	}
}

func TestResponsesWhosePromptCannotBeReproducedAreRoutedOnLoadAloneAndCounted(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	// vLLM renders an image into the prompt in a way the gateway does not
	// reproduce: the conversion refuses it as unsupported.
	image := `{"model":"llama","input":[{"type":"message","role":"user","content":[` +
		`{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo="},{"type":"input_text","text":"what is this?"}]}]}`
	for _, extra := range []string{"", `,"stream":true`} {
		body := strings.Replace(image, `}]}]}`, `}]}]`+extra+`}`, 1)
		resp, got := post(t, f.url+PathResponses, body, map[string]string{routing.HeaderRoutingStrategy: routing.KVAware})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/a" {
			t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), got)
		}
	}
	if n := len(f.engine("a").tokenizedModels()); n != 0 {
		t.Errorf("the engine was asked to tokenize %d prompts; want none", n)
	}
	if n := f.metric(`kvgate_gateway_tokenization_failures_total{reason="unsupported"}`); n != 2 {
		t.Errorf("unsupported tokenizations = %v, want 2", n)
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="no_tokens"}`); n != 2 {
		t.Errorf("kv-aware no_tokens decisions = %v, want 2", n)
	}
}

func TestResponsesBodiesAreCheckedAsChatsAre(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	for _, c := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"no model", `{"input":"hi"}`, http.StatusBadRequest, codeMissingField},
		{"model of another type", `{"model":7,"input":"hi"}`, http.StatusBadRequest, codeInvalidJSON},
		{"stream of another type", `{"model":"llama","stream":"maybe","input":"hi"}`, http.StatusBadRequest, codeInvalidJSON},
		{"max_output_tokens of another type", `{"model":"llama","max_output_tokens":[16],"input":"hi"}`, http.StatusBadRequest, codeInvalidJSON},
		{"not an object", `["llama"]`, http.StatusBadRequest, codeInvalidJSON},
		{"unknown model", `{"model":"nope","input":"hi"}`, http.StatusNotFound, codeModelNotFound},
	} {
		chatBody := strings.Replace(strings.Replace(c.body, `"max_output_tokens"`, `"max_tokens"`, 1), `"input":"hi"`, `"messages":[]`, 1)
		chat, chatGot := post(t, f.url+PathChatCompletions, chatBody, nil)
		resp, got := post(t, f.url+PathResponses, c.body, nil)
		e, ce := decodeError(t, got), decodeError(t, chatGot)
		if resp.StatusCode != c.status || e.Code != c.code || e.Type != ce.Type || chat.StatusCode != c.status || ce.Code != c.code {
			t.Errorf("%s: %d %s (a chat: %d %s); want %d %s in OpenAI's shape", c.name, resp.StatusCode, got, chat.StatusCode,
				chatGot, c.status, c.code)
		}
	}
	if n := len(f.engine("a").received()); n != 0 {
		t.Errorf("the engine received %d refused requests", n)
	}
}

// TestAResponsesStreamCutByThePodEndsWithAnErrorEvent: a Responses stream
// the engine cuts ends with an event named error whose data is an OpenAI
// error object, which OpenAI's SDKs raise, and a whole response cut
// before its end is answered 502 with an OpenAI error.
func TestAResponsesStreamCutByThePodEndsWithAnErrorEvent(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	e := f.engine("a")
	events := responsesEvents("llama", responsesUsage(5))
	first := events[0] + events[1] + events[2]
	cutAfter(e, http.Header{"Content-Type": {"text/event-stream"}}, first+"event: response.content_part.added\ndata: {\"ty")
	data, err := readStream(openStream(t, f.url+PathResponses, responsesBody("hi", `,"stream":true`)))
	_, payload, isError := strings.Cut(data, "\n\nevent: error\ndata: ")
	if err == nil || !strings.HasPrefix(data, first) || !isError || !strings.HasSuffix(payload, "\n\n") {
		t.Fatalf("cut stream: %q, %v; want its first events, an error event and a broken end", data, err)
	}
	if ev := decodeError(t, []byte(payload)); ev.Type != typeUpstream || ev.Code != codeUpstreamFailed {
		t.Errorf("the stream's error event is %+v, want an OpenAI error of type %q", ev, typeUpstream)
	}

	cutAfter(e, http.Header{"Content-Type": {"application/json"}, "Content-Length": {"500"}}, `{"id":"resp_1","output":[`)
	resp, body := post(t, f.url+PathResponses, responsesBody("hi", ""), nil)
	if ev := decodeError(t, body); resp.StatusCode != http.StatusBadGateway || ev.Type != typeUpstream {
		t.Errorf("cut response: %d %s; want 502 %s in OpenAI's shape", resp.StatusCode, body, typeUpstream)
	}
}

// TestThePickerReadsResponsesInTheResponsesAPIShapes feeds the Picker's
// Response the bodies vLLM answers Responses requests with, in pieces
// that cut the events apart, as a front end relays them.
func TestThePickerReadsResponsesInTheResponsesAPIShapes(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	seen := watchAttempts(f.gw)
	p := f.gw.Picker()
	events := responsesEvents("llama", responsesUsage(41))
	opening := len(events[0] + events[1])
	for i, c := range []struct {
		name, extra, contentType, body string
	}{
		{"whole", "", "application/json", responsesObject("llama", "completed", responsesOutput, responsesUsage(41))},
		{"stream", `,"stream":true`, "text/event-stream; charset=utf-8", strings.Join(events, "")},
	} {
		k, err := p.Pick(context.Background(), PickRequest{Path: PathResponses, Body: []byte(responsesBody("hello", c.extra)),
			Strategy: routing.KVAware})
		if err != nil {
			t.Fatalf("%s: Pick: %v", c.name, err)
		}
		if body, changed := k.Body(); changed || string(body) != responsesBody("hello", c.extra) {
			t.Errorf("%s: the body to forward is %s (changed %v); want the client's", c.name, body, changed)
		}
		r := k.Response(http.StatusOK, c.contentType)
		var out []byte
		for rest := []byte(c.body); len(rest) > 0; {
			n := min(len(rest), 29)
			out = append(out, r.Body(nil, rest[:n], n == len(rest))...)
			rest = rest[n:]
			if sent := len(c.body) - len(rest); c.extra != "" && sent <= opening && r.FirstToken() {
				t.Fatalf("%s: a first token after the first %d bytes, within response.created and response.in_progress", c.name, sent)
			}
		}
		if string(out) != c.body {
			t.Errorf("%s: the client receives %q; want the engine's body", c.name, out)
		}
		if r.FirstToken() != (c.extra != "") {
			t.Errorf("%s: first token %v", c.name, r.FirstToken())
		}
		r.Done()
		k.End()
		h, _ := seen.wait(t, i+1)
		if u, ok := h.Usage(); !ok || u.PromptTokens != 41 || u.CompletionTokens != 3 || u.CachedTokens != responsesCached {
			t.Errorf("%s: usage %+v (reported %v); want 41 prompt, 3 completion and %d cached tokens", c.name, u, ok, responsesCached)
		}
	}
	if n := f.metric("kvgate_gateway_responses_without_usage_total"); n != 0 {
		t.Errorf("responses without usage = %v, want 0", n)
	}
}

func TestThePickerHoldsResponsesInTheSLOQueueAsChats(t *testing.T) {
	holdsInTheSLOQueue(t, PathResponses, responsesBody(simPrompt(99, 20), ""))
}

func TestResponsesUsageIsReadOnlyWhenAnEngineCouldMeanIt(t *testing.T) {
	for _, c := range []struct {
		usage string
		want  usage
		ok    bool
	}{
		{responsesUsage(12), usage{PromptTokens: 12, CompletionTokens: 3, CachedTokens: responsesCached, CachedReported: true}, true},
		{`{"input_tokens":12,"output_tokens":3,"input_tokens_details":null}`, usage{PromptTokens: 12, CompletionTokens: 3}, true},
		{`{"input_tokens":12,"output_tokens":3,"input_tokens_details":{"cached_tokens":null}}`,
			usage{PromptTokens: 12, CompletionTokens: 3}, true},
		{`{"output_tokens":3}`, usage{CompletionTokens: 3}, true},
		{`{}`, usage{}, false},
		{`null`, usage{}, false},
		{`{"input_tokens":-1,"output_tokens":3}`, usage{}, false},
		{`{"input_tokens":12,"output_tokens":1.5}`, usage{}, false},
		{`{"input_tokens":12,"output_tokens":3,"input_tokens_details":{"cached_tokens":-2}}`, usage{}, false},
		// OpenAI's chat names are no Responses usage.
		{`{"prompt_tokens":12,"completion_tokens":3}`, usage{}, false},
	} {
		got, ok := responseUsage([]byte(`{"object":"response","usage":`+c.usage+`}`), kindResponses)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("usage %s read as %+v (%v); want %+v (%v)", c.usage, got, ok, c.want, c.ok)
		}
	}
}

func TestDecodeReadsMaxOutputTokensAsAResponsesBound(t *testing.T) {
	var in inference
	for _, c := range []struct {
		body   string
		max    int
		stream bool
	}{
		{`{"model":"llama","input":"hi","max_output_tokens":"12","stream":1}`, 12, true},
		// max_tokens is no member of a Responses body.
		{`{"model":"llama","input":"hi","max_tokens":12}`, 0, false},
		{`{"model":"llama","input":"hi","max_output_tokens":null}`, 0, false},
	} {
		if err := in.decode(kindResponses, []byte(c.body)); err != nil {
			t.Fatalf("decode(%s): %v", c.body, err)
		}
		if in.model() != "llama" || in.maxTokens() != c.max || in.stream().Stream != c.stream {
			t.Errorf("decode(%s): model %q, max tokens %d, stream %v; want llama, %d, %v", c.body, in.model(), in.maxTokens(),
				in.stream().Stream, c.max, c.stream)
		}
	}
}
