package gateway

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/pkg/inflight"
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

// messagesInputTokens reads the input tokens of a Messages response, whole
// or streamed (its message_delta event's usage).
func messagesInputTokens(t *testing.T, body []byte) int {
	t.Helper()
	data, _ := answerData(t, body, "message_delta")
	return usageInputTokens(t, data)
}

// answerData returns body, a whole answer, or the data of its event named
// event when it is a stream (streamed then set), failing t when it has
// none.
func answerData(t *testing.T, body []byte, event string) (data string, streamed bool) {
	t.Helper()
	data = string(body)
	if !strings.HasPrefix(data, "event:") {
		return data, false
	}
	_, after, ok := strings.Cut(data, "event: "+event+"\ndata: ")
	if !ok {
		t.Fatalf("no %s in %q", event, data)
	}
	data, _, _ = strings.Cut(after, "\n")
	return data, true
}

// usageInputTokens reads the usage.input_tokens of data, a JSON object,
// failing t when there are none.
func usageInputTokens(t *testing.T, data string) int {
	t.Helper()
	var u struct {
		Usage struct {
			Input int `json:"input_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(data), &u); err != nil || u.Usage.Input == 0 {
		t.Fatalf("no usage in %q: %v", data, err)
	}
	return u.Usage.Input
}

// TestAnAnthropicConversationStaysOnThePodHoldingItsPrefix runs an agent's
// conversation, as Claude Code sends it, against simulated vLLM engines
// publishing their KV events: its second turn (the first turn's messages,
// the reply, a new user message) goes kv-aware to the pod that served the
// first, and the gateway tokenizes it exactly as the engine renders it,
// and as it tokenizes the same conversation sent as a chat.
func TestAnAnthropicConversationStaysOnThePodHoldingItsPrefix(t *testing.T) {
	staysOnThePodHoldingItsPrefix(t, agentConversation{
		api:   messagesAPI,
		seeds: [2]int{1, 2},
		turn1: func(system, first string) string {
			return `{"model":"llama","max_tokens":8,"system":` + jsonString(system) + `,"messages":[{"role":"user","content":` +
				jsonString(first) + `}]}`
		},
		reply: func(t *testing.T, body []byte) string {
			var reply struct {
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
			}
			if err := json.Unmarshal(body, &reply); err != nil || len(reply.Content) != 1 || reply.Content[0].Text == "" {
				t.Fatalf("turn 1 answered %s", body)
			}
			return reply.Content[0].Text
		},
		turn2: func(system, first, reply, second string) string {
			return `{"model":"llama","max_tokens":8,"stream":true,"system":` + jsonString(system) + `,"messages":[{"role":"user","content":` +
				jsonString(first) + `},{"role":"assistant","content":` + jsonString(reply) + `},{"role":"user","content":` +
				jsonString(second) + `}]}`
		},
		inputTokens: messagesInputTokens,
	})
}
