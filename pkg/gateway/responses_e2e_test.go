package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/routing"
)

// responsesInputTokens reads the input tokens of a Responses response, whole or
// streamed (its response.completed event's response).
func responsesInputTokens(t *testing.T, body []byte) int {
	t.Helper()
	var u struct {
		Usage struct {
			Input int `json:"input_tokens"`
		} `json:"usage"`
	}
	data := string(body)
	if strings.HasPrefix(data, "event:") {
		_, after, ok := strings.Cut(data, "event: response.completed\ndata: ")
		if !ok {
			t.Fatalf("no response.completed in %q", data)
		}
		data, _, _ = strings.Cut(after, "\n")
		var completed struct {
			Response json.RawMessage `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &completed); err != nil {
			t.Fatalf("response.completed %q: %v", data, err)
		}
		data = string(completed.Response)
	}
	if err := json.Unmarshal([]byte(data), &u); err != nil || u.Usage.Input == 0 {
		t.Fatalf("no usage in %q: %v", data, err)
	}
	return u.Usage.Input
}

// TestAResponsesConversationStaysOnThePodHoldingItsPrefix runs an agent's
// conversation through OpenAI's Responses API, as Codex CLI and the Agents
// SDK send it (instructions, the whole history as input items, nothing
// stored), against simulated vLLM engines publishing their KV events: its
// second turn goes kv-aware to the pod that served the first, and the
// gateway tokenizes it exactly as the engine renders it, and as it
// tokenizes the same conversation sent as a chat.
func TestAResponsesConversationStaysOnThePodHoldingItsPrefix(t *testing.T) {
	f := startLivenessFleet(t, newSimEngine(t, "a"), newSimEngine(t, "b"))
	seen := watchRoutes(f.gw)
	kvAware := map[string]string{routing.HeaderRoutingStrategy: routing.KVAware}
	instructions, first, second := "You are a coding agent.", simPrompt(3, 80), simPrompt(4, 20)
	str := func(s string) string { b, _ := json.Marshal(s); return string(b) }

	// The first turn goes to either pod: neither holds any of it.
	turn1 := `{"model":"llama","max_output_tokens":8,"store":false,"instructions":` + str(instructions) + `,"input":` + str(first) + `}`
	resp, body := post(t, f.url+PathResponses, turn1, kvAware)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("turn 1: %d %s", resp.StatusCode, body)
	}
	served := resp.Header.Get(HeaderTargetPodName)
	var reply struct {
		Output []struct {
			Type    string `json:"type"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
	}
	if err := json.Unmarshal(body, &reply); err != nil || len(reply.Output) != 1 || len(reply.Output[0].Content) != 1 ||
		reply.Output[0].Content[0].Text == "" {
		t.Fatalf("turn 1 answered %s", body)
	}
	text := reply.Output[0].Content[0].Text
	input1 := responsesInputTokens(t, body)
	if got := seen.last().PromptTokens; got != input1 {
		t.Errorf("turn 1: the gateway routed %d prompt tokens; the engine rendered %d", got, input1)
	}

	// The second turn, as the client sends it (the history as input
	// items, the reply as the output message it was), and the same
	// conversation as a chat.
	input := `[{"role":"user","content":` + str(first) + `},{"type":"message","id":"msg_1","status":"completed","role":"assistant",` +
		`"content":[{"type":"output_text","text":` + str(text) + `,"annotations":[]}]},{"role":"user","content":[{"type":"input_text","text":` + str(second) + `}]}]`
	chatMessages := `[{"role":"system","content":` + str(instructions) + `},{"role":"user","content":` + str(first) +
		`},{"role":"assistant","content":` + str(text) + `},{"role":"user","content":` + str(second) + `}]`
	turn2 := `{"model":"llama","max_output_tokens":8,"store":false,"stream":true,"instructions":` + str(instructions) + `,"input":` + input + `}`
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

	resp, body = post(t, f.url+PathResponses, turn2, kvAware)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != served {
		t.Fatalf("turn 2: %d from %q, want %s, which served turn 1: %s", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), served, body)
	}
	input2 := responsesInputTokens(t, body)
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
		t.Fatalf("turn 2 as a chat answered %s; want %d prompt tokens, as the Responses form had", body, input2)
	}
	asChat := seen.last()
	resp, body = post(t, f.url+PathResponses, strings.Replace(turn2, `"stream":true,`, "", 1), kvAware)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != served {
		t.Fatalf("turn 2 again: %d from %q, want %s: %s", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), served, body)
	}
	asResponses := seen.last()
	if asResponses.PromptTokens != input2 || asChat.PromptTokens != input2 {
		t.Errorf("turn 2 routed with %d prompt tokens as Responses, %d as a chat; the engine rendered %d",
			asResponses.PromptTokens, asChat.PromptTokens, input2)
	}
	if len(asResponses.PromptBlocks) == 0 || !slices.Equal(asResponses.PromptBlocks, asChat.PromptBlocks) {
		t.Errorf("turn 2's blocks: %d as Responses, %d as a chat; want the same blocks", len(asResponses.PromptBlocks), len(asChat.PromptBlocks))
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="prefix_hit"}`); n != 3 {
		t.Errorf("kv-aware prefix hits = %v, want 3 (turn 2: twice as Responses, once as a chat)", n)
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
