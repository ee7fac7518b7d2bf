package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/routing"
)

// messagesSystem is the system prompt of the test Messages requests.
const messagesSystem = "You answer in three words."

// anthropicBody is a /v1/messages body with the system prompt
// messagesSystem and one user message, user, plus extra members.
func anthropicBody(user, extra string) string {
	u, _ := json.Marshal(user)
	return `{"model":"llama","max_tokens":16,"system":"` + messagesSystem + `","messages":[{"role":"user","content":` +
		string(u) + `}]` + extra + `}`
}

// anthropicPromptTokens are the test engines' tokens of the chat vLLM
// converts anthropicBody(user, ...) into: the system message, then the
// user's.
func anthropicPromptTokens(user string) []uint32 {
	return toyTokens(messagesSystem + "\n" + user + "\n")
}

// attempts records the attempts of a gateway's requests as they close,
// and those that reported a first token.
type attempts struct {
	mu     sync.Mutex
	closed []*inflight.Handle
	first  int
}

func watchAttempts(g *Gateway) *attempts {
	a := &attempts{}
	g.ledger.Observe(inflight.Observer{
		FirstToken: func(*inflight.Handle) {
			a.mu.Lock()
			a.first++
			a.mu.Unlock()
		},
		Closed: func(h *inflight.Handle) {
			a.mu.Lock()
			a.closed = append(a.closed, h)
			a.mu.Unlock()
		}})
	return a
}

// wait waits for n attempts to have closed and returns the last, and how
// many first tokens were reported.
func (a *attempts) wait(t *testing.T, n int) (*inflight.Handle, int) {
	t.Helper()
	testsupport.Eventually(t, fmt.Sprintf("%d attempts to close", n), func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.closed) >= n
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed[n-1], a.first
}

func TestMessagesResponsesReportTheirFirstTokenAndUsageToTheLedger(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	seen := watchAttempts(f.gw)
	e := f.engine("a")
	noUsage := func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		events := messagesEvents("llama", 0)
		for i, ev := range events {
			if strings.Contains(ev, "message_delta") {
				events[i] = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"}}\n\n"
			}
		}
		writeSSE(w, events)
	}
	cases := []struct {
		name, extra string
		answer      func(http.ResponseWriter, *http.Request, []byte)
		// stream: the response streams, and its first event is a first
		// token; usage: it reports one.
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
			tokenized := len(e.tokenizedModels())
			body := anthropicBody(strings.Repeat("tell me more about "+c.name+" ", 8), c.extra)
			resp, got := post(t, f.url+PathMessages, body, map[string]string{routing.HeaderRoutingStrategy: routing.KVAware})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, got)
			}
			if c.stream != strings.HasPrefix(string(got), "event: message_start\n") {
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
			case c.usage && (!ok || u.PromptTokens != int64(len(body)) || u.CompletionTokens != 3):
				t.Errorf("usage %+v (reported %v); want input_tokens %d as the prompt's, output_tokens 3 as the completion's", u, ok, len(body))
			case !c.usage && ok:
				t.Errorf("usage %+v reported for a response without one", u)
			}
			wantMissing := missing
			if !c.usage {
				wantMissing++
			}
			if n := f.metric("kvgate_gateway_responses_without_usage_total"); n != wantMissing {
				t.Errorf("responses without usage = %v, want %v", n, wantMissing)
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

func TestMessagesGoToThePodHoldingTheirConvertedPromptsPrefix(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	tokens := anthropicPromptTokens(sharedPrompt)
	b := f.engine("b")
	f.waitMatched(tokens, "b", len(b.storePrompt(tokens)))
	for _, extra := range []string{"", `,"stream":true`} {
		for range 3 {
			resp, body := post(t, f.url+PathMessages, anthropicBody(sharedPrompt, extra), map[string]string{routing.HeaderRoutingStrategy: routing.KVAware})
			if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/b" {
				t.Fatalf("%d from %q: %s; want b, which holds the prompt", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), body)
			}
		}
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="prefix_hit"}`); n != 6 {
		t.Errorf("kv-aware prefix hits = %v, want 6", n)
	}
}

func TestMessagesWhosePromptCannotBeReproducedAreRoutedOnLoadAloneAndCounted(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	// vLLM renders an image into the prompt in a way the gateway does not
	// reproduce: the conversion refuses it as unsupported.
	image := `{"model":"llama","max_tokens":16,"messages":[{"role":"user","content":[{"type":"image",` +
		`"source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"text","text":"what is this?"}]}]}`
	// vLLM refuses a body without max_tokens: the engine answers it.
	noMax := `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`
	for _, body := range []string{image, noMax} {
		resp, got := post(t, f.url+PathMessages, body, map[string]string{routing.HeaderRoutingStrategy: routing.KVAware})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/a" {
			t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), got)
		}
	}
	if n := len(f.engine("a").tokenizedModels()); n != 0 {
		t.Errorf("the engine was asked to tokenize %d prompts; want none", n)
	}
	for reason, want := range map[string]float64{"unsupported": 1, "input": 1} {
		if n := f.metric(`kvgate_gateway_tokenization_failures_total{reason="` + reason + `"}`); n != want {
			t.Errorf("tokenization failures for %s = %v, want %v", reason, n, want)
		}
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="no_tokens"}`); n != 2 {
		t.Errorf("kv-aware no_tokens decisions = %v, want 2", n)
	}
}

func TestMessagesBodiesAreCheckedAsChatsAre(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	for _, c := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"no model", `{"max_tokens":16,"messages":[]}`, http.StatusBadRequest, codeMissingField},
		{"model of another type", `{"model":7,"max_tokens":16,"messages":[]}`, http.StatusBadRequest, codeInvalidJSON},
		{"stream of another type", `{"model":"llama","max_tokens":16,"stream":"maybe","messages":[]}`, http.StatusBadRequest, codeInvalidJSON},
		{"max_tokens of another type", `{"model":"llama","max_tokens":[16],"messages":[]}`, http.StatusBadRequest, codeInvalidJSON},
		{"not an object", `["llama"]`, http.StatusBadRequest, codeInvalidJSON},
		{"unknown model", `{"model":"nope","max_tokens":16,"messages":[]}`, http.StatusNotFound, codeModelNotFound},
	} {
		chat, chatBody := post(t, f.url+PathChatCompletions, strings.Replace(c.body, `"max_tokens"`, `"max_completion_tokens"`, 1), nil)
		resp, body := post(t, f.url+PathMessages, c.body, nil)
		e, ce := decodeAnthropicError(t, body), decodeError(t, chatBody)
		if resp.StatusCode != c.status || e.Type != ce.Type || chat.StatusCode != c.status || ce.Code != c.code {
			t.Errorf("%s: %d %s (a chat: %d %s); want %d %s", c.name, resp.StatusCode, body, chat.StatusCode, chatBody, c.status, c.code)
		}
	}
	if n := len(f.engine("a").received()); n != 0 {
		t.Errorf("the engine received %d refused requests", n)
	}
}

func TestMessagesCountTokensIsRoutedOnLoadAlone(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	resp, body := post(t, f.url+"/v1/messages/count_tokens", `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{routing.HeaderRoutingStrategy: routing.KVAware})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n := len(f.engine("a").tokenizedModels()); n != 0 {
		t.Errorf("a token count was tokenized %d times; it is routed on load alone", n)
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="no_tokens"}`); n != 1 {
		t.Errorf("kv-aware no_tokens decisions = %v, want 1", n)
	}
}

// TestThePickerReadsMessagesResponsesInAnthropicsShapes feeds the Picker's
// Response the bodies vLLM answers Messages requests with, in pieces that
// cut the events apart, as a front end relays them.
func TestThePickerReadsMessagesResponsesInAnthropicsShapes(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	seen := watchAttempts(f.gw)
	p := f.gw.Picker()
	whole := `{"id":"msg-1","type":"message","role":"assistant","content":[{"type":"text","text":" a b c"}],"model":"llama",` +
		`"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":41,"output_tokens":3}}`
	stream := strings.Join(messagesEvents("llama", 41), "")
	for i, c := range []struct {
		name, extra, contentType, body string
	}{
		{"whole", "", "application/json", whole},
		{"stream", `,"stream":true`, "text/event-stream; charset=utf-8", stream},
	} {
		k, err := p.Pick(context.Background(), PickRequest{Path: PathMessages, Body: []byte(anthropicBody("hello", c.extra)),
			Strategy: routing.KVAware})
		if err != nil {
			t.Fatalf("%s: Pick: %v", c.name, err)
		}
		if body, changed := k.Body(); changed || string(body) != anthropicBody("hello", c.extra) {
			t.Errorf("%s: the body to forward is %s (changed %v); want the client's", c.name, body, changed)
		}
		r := k.Response(http.StatusOK, c.contentType)
		var out []byte
		startedFirst := false
		for rest := []byte(c.body); len(rest) > 0; {
			n := min(len(rest), 29)
			out = append(out, r.Body(nil, rest[:n], n == len(rest))...)
			if strings.Contains(string(out), "message_start") && !startedFirst {
				startedFirst = true
				if c.extra != "" && !r.FirstToken() {
					t.Errorf("%s: message_start passed without a first token", c.name)
				}
			}
			rest = rest[n:]
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
		if u, ok := h.Usage(); !ok || u.PromptTokens != 41 || u.CompletionTokens != 3 {
			t.Errorf("%s: usage %+v (reported %v); want 41 prompt and 3 completion tokens", c.name, u, ok)
		}
	}
	if n := f.metric("kvgate_gateway_responses_without_usage_total"); n != 0 {
		t.Errorf("responses without usage = %v, want 0", n)
	}
}

func TestThePickerHoldsMessagesInTheSLOQueueAsChats(t *testing.T) {
	holdsInTheSLOQueue(t, PathMessages, anthropicBody(simPrompt(99, 20), ""))
}

// holdsInTheSLOQueue checks that a request to path with body, picked on a
// fleet full of completions, waits in the SLO queue as a chat would, and
// is picked once a completion ends.
func holdsInTheSLOQueue(t *testing.T, path, body string) {
	t.Helper()
	f, q := startQuarterPodFleet(t)
	p := f.gw.Picker()
	type result struct {
		k   *Pick
		err *Error
	}
	pick := func(path, body string) chan result {
		ch := make(chan result, 1)
		go func() {
			k, err := p.Pick(context.Background(), PickRequest{Path: path, Body: []byte(body)})
			ch <- result{k, err}
		}()
		return ch
	}
	// Completions fill the fleet until one waits.
	var held []*Pick
	defer func() {
		for _, k := range held {
			k.End()
		}
	}()
	var waiting []chan result
	for i := 0; len(waiting) == 0; i++ {
		if i > 16 {
			t.Fatalf("%d requests were picked at once: the fleet did not fill", len(held))
		}
		ch := pick(PathCompletions, completion(simPrompt(i, 20), `,"max_tokens":40`))
		testsupport.Eventually(t, fmt.Sprintf("request %d to be picked or queued", i), func() bool { return len(ch) == 1 || q.Len() == 1 })
		if q.Len() == 1 {
			waiting = append(waiting, ch)
			continue
		}
		r := <-ch
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
		held = append(held, r.k)
	}
	msg := pick(path, body)
	testsupport.Eventually(t, "the "+path+" request to wait or be picked", func() bool { return q.Len() == 2 || len(msg) == 1 })
	if len(msg) == 1 {
		if r := <-msg; r.k != nil {
			held = append(held, r.k)
		}
		t.Fatalf("a %s request was picked on a full fleet without waiting in the queue", path)
	}
	waiting = append(waiting, msg)
	for _, ch := range waiting {
		held[0].End()
		held = held[1:]
		r := <-ch
		if r.err != nil || r.k.Endpoint() == nil {
			t.Fatalf("a waiting request ended with %v, want a pod", r.err)
		}
		held = append(held, r.k)
	}
}

func TestMessagesUsageIsReadOnlyWhenAnEngineCouldMeanIt(t *testing.T) {
	for _, c := range []struct {
		usage string
		want  usage
		ok    bool
	}{
		{`{"input_tokens":12,"output_tokens":3}`, usage{PromptTokens: 12, CompletionTokens: 3}, true},
		{`{"input_tokens":12,"output_tokens":3,"cache_read_input_tokens":null}`, usage{PromptTokens: 12, CompletionTokens: 3}, true},
		{`{"output_tokens":3}`, usage{CompletionTokens: 3}, true},
		{`{}`, usage{}, false},
		{`null`, usage{}, false},
		{`{"input_tokens":-1,"output_tokens":3}`, usage{}, false},
		{`{"input_tokens":12,"output_tokens":1.5}`, usage{}, false},
		// OpenAI's names are no Messages usage.
		{`{"prompt_tokens":12,"completion_tokens":3}`, usage{}, false},
	} {
		got, ok := responseUsage([]byte(`{"type":"message","usage":`+c.usage+`}`), kindMessages)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("usage %s read as %+v (%v); want %+v (%v)", c.usage, got, ok, c.want, c.ok)
		}
	}
}
