package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/routing"
)

// routes records the route of each attempt the gateway opens, in order.
type routes struct {
	mu   sync.Mutex
	list []inflight.Route
}

func watchRoutes(g *Gateway) *routes {
	r := &routes{}
	g.ledger.Observe(inflight.Observer{Opened: func(h *inflight.Handle) {
		r.mu.Lock()
		r.list = append(r.list, h.Route())
		r.mu.Unlock()
	}})
	return r
}

func (r *routes) last() inflight.Route {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.list[len(r.list)-1]
}

// messagesUsage reads the usage of a Messages response, whole or streamed
// (its message_delta event's).
func messagesUsage(t *testing.T, body []byte) (input, output int) {
	t.Helper()
	var u struct {
		Usage struct {
			Input  int `json:"input_tokens"`
			Output int `json:"output_tokens"`
		} `json:"usage"`
	}
	data := string(body)
	if strings.HasPrefix(data, "event:") {
		_, after, ok := strings.Cut(data, "event: message_delta\ndata: ")
		if !ok {
			t.Fatalf("no message_delta in %q", data)
		}
		data, _, _ = strings.Cut(after, "\n")
	}
	if err := json.Unmarshal([]byte(data), &u); err != nil || u.Usage.Input == 0 {
		t.Fatalf("no usage in %q: %v", data, err)
	}
	return u.Usage.Input, u.Usage.Output
}

// TestAnAnthropicConversationStaysOnThePodHoldingItsPrefix runs an agent's
// conversation, as Claude Code sends it, against simulated vLLM engines
// publishing their KV events: its second turn (the first turn's messages,
// the reply, a new user message) goes kv-aware to the pod that served the
// first, and the gateway tokenizes it exactly as the engine renders it,
// and as it tokenizes the same conversation sent as a chat.
func TestAnAnthropicConversationStaysOnThePodHoldingItsPrefix(t *testing.T) {
	f := startLivenessFleet(t, newSimEngine(t, "a"), newSimEngine(t, "b"))
	seen := watchRoutes(f.gw)
	kvAware := map[string]string{routing.HeaderRoutingStrategy: routing.KVAware}
	system, first, second := "You are a coding agent.", simPrompt(1, 80), simPrompt(2, 20)
	str := func(s string) string { b, _ := json.Marshal(s); return string(b) }

	// The first turn goes to either pod: neither holds any of it.
	turn1 := `{"model":"llama","max_tokens":8,"system":` + str(system) + `,"messages":[{"role":"user","content":` + str(first) + `}]}`
	resp, body := post(t, f.url+PathMessages, turn1, kvAware)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("turn 1: %d %s", resp.StatusCode, body)
	}
	served := resp.Header.Get(HeaderTargetPodName)
	var reply struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(body, &reply); err != nil || len(reply.Content) != 1 || reply.Content[0].Text == "" {
		t.Fatalf("turn 1 answered %s", body)
	}
	input1, _ := messagesUsage(t, body)
	if got := seen.last().PromptTokens; got != input1 {
		t.Errorf("turn 1: the gateway routed %d prompt tokens; the engine rendered %d", got, input1)
	}

	// The second turn: what a client sends next, and the same conversation
	// as a chat.
	messages := `[{"role":"user","content":` + str(first) + `},{"role":"assistant","content":` + str(reply.Content[0].Text) +
		`},{"role":"user","content":` + str(second) + `}]`
	chatMessages := `[{"role":"system","content":` + str(system) + `},` + messages[1:]
	turn2 := `{"model":"llama","max_tokens":8,"stream":true,"system":` + str(system) + `,"messages":` + messages + `}`
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

	resp, body = post(t, f.url+PathMessages, turn2, kvAware)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != served {
		t.Fatalf("turn 2: %d from %q, want %s, which served turn 1: %s", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), served, body)
	}
	input2, _ := messagesUsage(t, body)
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
		t.Fatalf("turn 2 as a chat answered %s; want %d prompt tokens, as the Messages form had", body, input2)
	}
	asChat := seen.last()
	resp, body = post(t, f.url+PathMessages, strings.Replace(turn2, `"stream":true,`, "", 1), kvAware)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != served {
		t.Fatalf("turn 2 again: %d from %q, want %s: %s", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), served, body)
	}
	asMessages := seen.last()
	if asMessages.PromptTokens != input2 || asChat.PromptTokens != input2 {
		t.Errorf("turn 2 routed with %d prompt tokens as Messages, %d as a chat; the engine rendered %d",
			asMessages.PromptTokens, asChat.PromptTokens, input2)
	}
	if len(asMessages.PromptBlocks) == 0 || !slices.Equal(asMessages.PromptBlocks, asChat.PromptBlocks) {
		t.Errorf("turn 2's blocks: %d as Messages, %d as a chat; want the same blocks", len(asMessages.PromptBlocks), len(asChat.PromptBlocks))
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="prefix_hit"}`); n != 3 {
		t.Errorf("kv-aware prefix hits = %v, want 3 (turn 2: twice as Messages, once as a chat)", n)
	}
	if n := f.metric("kvgate_gateway_responses_without_usage_total"); n != 0 {
		t.Errorf("responses without usage = %v, want 0", n)
	}
	if n := f.metric(`kvgate_gateway_time_to_first_token_seconds_count{model="llama"}`); n != 1 {
		t.Errorf("first tokens observed %v times, want 1 (turn 2's stream)", n)
	}
}
