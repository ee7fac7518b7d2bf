package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/routing"
)

// testAPI is an API the gateway converts into a chat to route it
// (Anthropic's Messages, OpenAI's Responses), for the tests they run alike.
type testAPI struct {
	// name is the API's, as failures name it.
	name string
	path string
	// body is a request holding one user message, user, plus extra
	// members; promptTokens the test engines' tokens of the chat vLLM
	// converts it into.
	body         func(user, extra string) string
	promptTokens func(user string) []uint32
	// streamStart is what a stream of the test engines starts with.
	streamStart string
	// noUsage answers with a stream that carries no usage.
	noUsage func(http.ResponseWriter, *http.Request, []byte)
	// cached: the test engines' usage reports responsesCached cached
	// tokens.
	cached bool
	// errorCode returns the type and code of an error body in the API's
	// shape; codes: its errors have a code (else code is "").
	errorCode func(t *testing.T, body []byte) (typ, code string)
	codes     bool
}

var (
	messagesAPI = testAPI{
		name: "Messages", path: PathMessages, body: anthropicBody, promptTokens: anthropicPromptTokens,
		streamStart: "event: message_start\n",
		noUsage: func(w http.ResponseWriter, _ *http.Request, _ []byte) {
			events := messagesEvents("llama", 0)
			for i, ev := range events {
				if strings.Contains(ev, "message_delta") {
					events[i] = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"}}\n\n"
				}
			}
			writeSSE(w, events)
		},
		errorCode: func(t *testing.T, body []byte) (string, string) {
			return decodeAnthropicError(t, body).Type, ""
		},
	}
	responsesAPI = testAPI{
		name: "Responses", path: PathResponses, body: responsesBody, promptTokens: responsesPromptTokens,
		streamStart: "event: response.created\n",
		noUsage: func(w http.ResponseWriter, _ *http.Request, _ []byte) {
			writeSSE(w, responsesEvents("llama", "null"))
		},
		cached: true, codes: true,
		errorCode: func(t *testing.T, body []byte) (string, string) {
			e := decodeError(t, body)
			return e.Type, e.Code
		},
	}
)

// reportsFirstTokenAndUsageToTheLedger checks that api's responses, whole,
// streamed and streamed without usage, report their first token (a
// stream's) and usage to the ledger, the metrics and the output predictor.
func reportsFirstTokenAndUsageToTheLedger(t *testing.T, api testAPI) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	seen := watchAttempts(f.gw)
	e := f.engine("a")
	cases := []struct {
		name, extra string
		answer      func(http.ResponseWriter, *http.Request, []byte)
		// stream: the response streams, and its first output event is a
		// first token; usage: it reports one.
		stream, usage bool
	}{
		{name: "whole", usage: true},
		{name: "stream", extra: `,"stream":true`, stream: true, usage: true},
		{name: "stream without usage", extra: `,"stream":true`, answer: api.noUsage, stream: true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.setAnswer(c.answer)
			ttft := f.metric(`kvgate_gateway_time_to_first_token_seconds_count{model="llama"}`)
			missing := f.metric("kvgate_gateway_responses_without_usage_total")
			learned := predictedTraces(t, f, "llama")
			tokenized := len(e.tokenizedModels())
			body := api.body(strings.Repeat("tell me more about "+c.name+" ", 8), c.extra)
			resp, got := post(t, f.url+api.path, body, map[string]string{routing.HeaderRoutingStrategy: routing.KVAware})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, got)
			}
			if c.stream != strings.HasPrefix(string(got), api.streamStart) {
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
			case c.usage && api.cached && (!u.CachedReported || u.CachedTokens != responsesCached):
				t.Errorf("usage %+v; want %d cached tokens", u, responsesCached)
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

// goesToThePodHoldingItsConvertedPromptsPrefix checks that api's requests,
// whole and streamed, go kv-aware to the pod holding the prefix of the
// chat they convert into.
func goesToThePodHoldingItsConvertedPromptsPrefix(t *testing.T, api testAPI) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	tokens := api.promptTokens(sharedPrompt)
	b := f.engine("b")
	f.waitMatched(tokens, "b", len(b.storePrompt(tokens)))
	for _, extra := range []string{"", `,"stream":true`} {
		for range 3 {
			resp, body := post(t, f.url+api.path, api.body(sharedPrompt, extra), map[string]string{routing.HeaderRoutingStrategy: routing.KVAware})
			if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/b" {
				t.Fatalf("%d from %q: %s; want b, which holds the prompt", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), body)
			}
		}
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="prefix_hit"}`); n != 6 {
		t.Errorf("kv-aware prefix hits = %v, want 6", n)
	}
}

// routedOnLoadAloneAndCounted checks that bodies, requests to path whose
// prompt the gateway does not tokenize, are routed on load alone, none
// tokenized, their tokenization failures counted by reason as failures
// says.
func routedOnLoadAloneAndCounted(t *testing.T, path string, bodies []string, failures map[string]float64) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	for _, body := range bodies {
		resp, got := post(t, f.url+path, body, map[string]string{routing.HeaderRoutingStrategy: routing.KVAware})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/a" {
			t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), got)
		}
	}
	if n := len(f.engine("a").tokenizedModels()); n != 0 {
		t.Errorf("the engine was asked to tokenize %d prompts; want none", n)
	}
	for reason, want := range failures {
		if n := f.metric(`kvgate_gateway_tokenization_failures_total{reason="` + reason + `"}`); n != want {
			t.Errorf("tokenization failures for %s = %v, want %v", reason, n, want)
		}
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="no_tokens"}`); n != float64(len(bodies)) {
		t.Errorf("kv-aware no_tokens decisions = %v, want %d", n, len(bodies))
	}
}

// refusedBody is a body the gateway refuses before routing, and how.
type refusedBody struct {
	name, body string
	status     int
	code       string
}

// bodiesAreCheckedAsChatsAre checks that each of bodies, sent to api, is
// refused with its status, and with an error of the type a chat's is
// refused with, asChat(body) being the same body as a chat, refused with
// code (and so is api's, when its errors have one). The engine receives
// none of them.
func bodiesAreCheckedAsChatsAre(t *testing.T, api testAPI, asChat func(string) string, bodies []refusedBody) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	for _, c := range bodies {
		chat, chatGot := post(t, f.url+PathChatCompletions, asChat(c.body), nil)
		resp, got := post(t, f.url+api.path, c.body, nil)
		typ, code := api.errorCode(t, got)
		ce := decodeError(t, chatGot)
		if resp.StatusCode != c.status || (api.codes && code != c.code) || typ != ce.Type || chat.StatusCode != c.status || ce.Code != c.code {
			t.Errorf("%s: %d %s (a chat: %d %s); want %d %s in the %s API's shape", c.name, resp.StatusCode, got, chat.StatusCode,
				chatGot, c.status, c.code, api.name)
		}
	}
	if n := len(f.engine("a").received()); n != 0 {
		t.Errorf("the engine received %d refused requests", n)
	}
}

// pickerReadsShapes feeds the Picker's Response the bodies vLLM answers
// api's requests with, whole and streamed, in pieces that cut the events
// apart, as a front end relays them, and checks the client receives them
// as they are, with their usage (41 prompt tokens, 3 completion tokens)
// read, and the stream's first token found: not within its first opening
// bytes, and by the time its startEvent passed when that is not empty.
func pickerReadsShapes(t *testing.T, api testAPI, whole, stream string, opening int, startEvent string) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	seen := watchAttempts(f.gw)
	p := f.gw.Picker()
	for i, c := range []struct {
		name, extra, contentType, body string
	}{
		{"whole", "", "application/json", whole},
		{"stream", `,"stream":true`, "text/event-stream; charset=utf-8", stream},
	} {
		k, err := p.Pick(context.Background(), PickRequest{Path: api.path, Body: []byte(api.body("hello", c.extra)),
			Strategy: routing.KVAware})
		if err != nil {
			t.Fatalf("%s: Pick: %v", c.name, err)
		}
		if body, changed := k.Body(); changed || string(body) != api.body("hello", c.extra) {
			t.Errorf("%s: the body to forward is %s (changed %v); want the client's", c.name, body, changed)
		}
		r := k.Response(http.StatusOK, c.contentType)
		var out []byte
		startedFirst := false
		for rest := []byte(c.body); len(rest) > 0; {
			n := min(len(rest), 29)
			out = append(out, r.Body(nil, rest[:n], n == len(rest))...)
			if startEvent != "" && strings.Contains(string(out), startEvent) && !startedFirst {
				startedFirst = true
				if c.extra != "" && !r.FirstToken() {
					t.Errorf("%s: %s passed without a first token", c.name, startEvent)
				}
			}
			rest = rest[n:]
			if sent := len(c.body) - len(rest); c.extra != "" && sent <= opening && r.FirstToken() {
				t.Fatalf("%s: a first token after the first %d bytes, within the stream's opening events", c.name, sent)
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
		u, ok := h.Usage()
		if !ok || u.PromptTokens != 41 || u.CompletionTokens != 3 {
			t.Errorf("%s: usage %+v (reported %v); want 41 prompt and 3 completion tokens", c.name, u, ok)
		}
		if api.cached && u.CachedTokens != responsesCached {
			t.Errorf("%s: usage %+v; want %d cached tokens", c.name, u, responsesCached)
		}
	}
	if n := f.metric("kvgate_gateway_responses_without_usage_total"); n != 0 {
		t.Errorf("responses without usage = %v, want 0", n)
	}
}

// usageCase is a usage object and what reading it gives.
type usageCase struct {
	usage string
	want  usage
	ok    bool
}

// readsUsage checks what responseUsage reads of each usage case as the
// usage member of a whole response to a request of kind k, object its
// other members.
func readsUsage(t *testing.T, k kind, object string, cases []usageCase) {
	t.Helper()
	for _, c := range cases {
		got, ok := responseUsage([]byte(`{`+object+`,"usage":`+c.usage+`}`), k)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("usage %s read as %+v (%v); want %+v (%v)", c.usage, got, ok, c.want, c.ok)
		}
	}
}

// jsonString is s as a JSON string.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// agentConversation is an agent's two-turn conversation in one API's
// shape: a system prompt, a first user message, the model's reply and a
// second user message.
type agentConversation struct {
	api testAPI
	// seeds are those of the simPrompts of the first and second user
	// messages.
	seeds [2]int
	// turn1 is the first turn's body, as the client sends it.
	turn1 func(system, first string) string
	// reply reads the text of the first turn's answer, failing t when it
	// has none.
	reply func(t *testing.T, body []byte) string
	// turn2 is the second turn's body, as the client sends it: the
	// history and the second user message, streamed (its members include
	// `"stream":true,`).
	turn2 func(system, first, reply, second string) string
	// inputTokens reads the input tokens of an answer, whole or streamed.
	inputTokens func(t *testing.T, body []byte) int
}

// staysOnThePodHoldingItsPrefix runs c against simulated vLLM engines
// publishing their KV events: its second turn goes kv-aware to the pod
// that served the first, and the gateway tokenizes it exactly as the
// engine renders it, and as it tokenizes the same conversation sent as a
// chat.
func staysOnThePodHoldingItsPrefix(t *testing.T, c agentConversation) {
	f := startLivenessFleet(t, newSimEngine(t, "a"), newSimEngine(t, "b"))
	seen := watchRoutes(f.gw)
	kvAware := map[string]string{routing.HeaderRoutingStrategy: routing.KVAware}
	system, first, second := "You are a coding agent.", simPrompt(c.seeds[0], 80), simPrompt(c.seeds[1], 20)
	path, name := c.api.path, c.api.name

	// The first turn goes to either pod: neither holds any of it.
	resp, body := post(t, f.url+path, c.turn1(system, first), kvAware)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("turn 1: %d %s", resp.StatusCode, body)
	}
	served := resp.Header.Get(HeaderTargetPodName)
	reply := c.reply(t, body)
	input1 := c.inputTokens(t, body)
	if got := seen.last().PromptTokens; got != input1 {
		t.Errorf("turn 1: the gateway routed %d prompt tokens; the engine rendered %d", got, input1)
	}

	// The second turn: what a client sends next, and the same conversation
	// as a chat.
	chatMessages := `[{"role":"system","content":` + jsonString(system) + `},{"role":"user","content":` + jsonString(first) +
		`},{"role":"assistant","content":` + jsonString(reply) + `},{"role":"user","content":` + jsonString(second) + `}]`
	turn2 := c.turn2(system, first, reply, second)
	chat := `{"model":"llama","max_tokens":8,"messages":` + chatMessages + `}`
	other := "static/a"
	if served == other {
		other = "static/b"
	}
	var match matchResponse
	testsupport.EventuallyWhy(t, "the index to credit "+served+" with the first turn's prompt", func() (string, bool) {
		r, data := post(t, f.adminURL+"/debug/match", `{"model":"llama","messages":`+chatMessages+`}`, nil)
		match = matchResponse{}
		if r.StatusCode != http.StatusOK || json.Unmarshal(data, &match) != nil {
			return string(data), false
		}
		got := map[string]int{}
		for _, p := range match.Pods {
			got[p.Pod] = p.MatchedTokens
		}
		// The first turn's prompt but for its last, partial block.
		return mustJSON(match.Pods), got[served] >= input1-input1%testBlockSize-testBlockSize && got[other] == 0
	})

	resp, body = post(t, f.url+path, turn2, kvAware)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != served {
		t.Fatalf("turn 2: %d from %q, want %s, which served turn 1: %s", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), served, body)
	}
	input2 := c.inputTokens(t, body)
	// Once the whole second turn is tokenized, both forms are routed with
	// the ids the engine renders.
	testsupport.EventuallyWhy(t, "the whole second turn to be tokenized", func() (string, bool) {
		r, data := post(t, f.adminURL+"/debug/match", `{"model":"llama","messages":`+chatMessages+`}`, nil)
		match = matchResponse{}
		if r.StatusCode != http.StatusOK || json.Unmarshal(data, &match) != nil {
			return string(data), false
		}
		return fmt.Sprintf("%d prompt tokens, want %d", match.PromptTokens, input2), match.PromptTokens == input2
	})
	resp, body = post(t, f.url+PathChatCompletions, chat, kvAware)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != served {
		t.Fatalf("turn 2 as a chat: %d from %q, want %s: %s", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), served, body)
	}
	var chatUsage struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &chatUsage); err != nil || chatUsage.Usage.PromptTokens != input2 {
		t.Fatalf("turn 2 as a chat answered %s; want %d prompt tokens, as the %s form had", body, input2, name)
	}
	asChat := seen.last()
	resp, body = post(t, f.url+path, strings.Replace(turn2, `"stream":true,`, "", 1), kvAware)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != served {
		t.Fatalf("turn 2 again: %d from %q, want %s: %s", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), served, body)
	}
	asAPI := seen.last()
	if asAPI.PromptTokens != input2 || asChat.PromptTokens != input2 {
		t.Errorf("turn 2 routed with %d prompt tokens as %s, %d as a chat; the engine rendered %d",
			asAPI.PromptTokens, name, asChat.PromptTokens, input2)
	}
	if len(asAPI.PromptBlocks) == 0 || !slices.Equal(asAPI.PromptBlocks, asChat.PromptBlocks) {
		t.Errorf("turn 2's blocks: %d as %s, %d as a chat; want the same blocks", len(asAPI.PromptBlocks), name, len(asChat.PromptBlocks))
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="prefix_hit"}`); n != 3 {
		t.Errorf("kv-aware prefix hits = %v, want 3 (turn 2: twice as %s, once as a chat)", n, name)
	}
	if n := f.metric("kvgate_gateway_responses_without_usage_total"); n != 0 {
		t.Errorf("responses without usage = %v, want 0", n)
	}
	if n := f.metric(`kvgate_gateway_time_to_first_token_seconds_count{model="llama"}`); n != 1 {
		t.Errorf("first tokens observed %v times, want 1 (turn 2's stream)", n)
	}
	if n := f.metric(`kvgate_gateway_tokenization_failures_total{reason="unsupported"}`); n != 0 {
		t.Errorf("unsupported tokenizations = %v, want 0", n)
	}
}
