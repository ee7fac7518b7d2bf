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
	reportsFirstTokenAndUsageToTheLedger(t, messagesAPI)
}

func TestMessagesGoToThePodHoldingTheirConvertedPromptsPrefix(t *testing.T) {
	goesToThePodHoldingItsConvertedPromptsPrefix(t, messagesAPI)
}

func TestMessagesWhosePromptCannotBeReproducedAreRoutedOnLoadAloneAndCounted(t *testing.T) {
	// vLLM renders an image into the prompt in a way the gateway does not
	// reproduce: the conversion refuses it as unsupported.
	image := `{"model":"llama","max_tokens":16,"messages":[{"role":"user","content":[{"type":"image",` +
		`"source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"text","text":"what is this?"}]}]}`
	// vLLM refuses a body without max_tokens: the engine answers it.
	noMax := `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`
	routedOnLoadAloneAndCounted(t, PathMessages, []string{image, noMax}, map[string]float64{"unsupported": 1, "input": 1})
}

func TestMessagesBodiesAreCheckedAsChatsAre(t *testing.T) {
	asChat := func(body string) string { return strings.Replace(body, `"max_tokens"`, `"max_completion_tokens"`, 1) }
	bodiesAreCheckedAsChatsAre(t, messagesAPI, asChat, []refusedBody{
		{"no model", `{"max_tokens":16,"messages":[]}`, http.StatusBadRequest, codeMissingField},
		{"model of another type", `{"model":7,"max_tokens":16,"messages":[]}`, http.StatusBadRequest, codeInvalidJSON},
		{"stream of another type", `{"model":"llama","max_tokens":16,"stream":"maybe","messages":[]}`, http.StatusBadRequest, codeInvalidJSON},
		{"max_tokens of another type", `{"model":"llama","max_tokens":[16],"messages":[]}`, http.StatusBadRequest, codeInvalidJSON},
		{"not an object", `["llama"]`, http.StatusBadRequest, codeInvalidJSON},
		{"unknown model", `{"model":"nope","max_tokens":16,"messages":[]}`, http.StatusNotFound, codeModelNotFound},
	})
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
	whole := `{"id":"msg-1","type":"message","role":"assistant","content":[{"type":"text","text":" a b c"}],"model":"llama",` +
		`"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":41,"output_tokens":3}}`
	pickerReadsShapes(t, messagesAPI, whole, strings.Join(messagesEvents("llama", 41), ""), 0, "message_start")
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
	readsUsage(t, kindMessages, `"type":"message"`, []usageCase{
		{`{"input_tokens":12,"output_tokens":3}`, usage{PromptTokens: 12, CompletionTokens: 3}, true},
		{`{"input_tokens":12,"output_tokens":3,"cache_read_input_tokens":null}`, usage{PromptTokens: 12, CompletionTokens: 3}, true},
		{`{"output_tokens":3}`, usage{CompletionTokens: 3}, true},
		{`{}`, usage{}, false},
		{`null`, usage{}, false},
		{`{"input_tokens":-1,"output_tokens":3}`, usage{}, false},
		{`{"input_tokens":12,"output_tokens":1.5}`, usage{}, false},
		// OpenAI's names are no Messages usage.
		{`{"prompt_tokens":12,"completion_tokens":3}`, usage{}, false},
	})
}
