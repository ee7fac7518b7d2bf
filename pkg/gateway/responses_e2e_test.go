package gateway

import (
	"encoding/json"
	"testing"
)

// responsesInputTokens reads the input tokens of a Responses response, whole or
// streamed (its response.completed event's response).
func responsesInputTokens(t *testing.T, body []byte) int {
	t.Helper()
	return usageInputTokens(t, responseObject(t, body))
}

// responseObject returns the Responses API response of body, a whole
// response or a stream, whose response.completed event carries it.
func responseObject(t *testing.T, body []byte) string {
	t.Helper()
	data, streamed := answerData(t, body, "response.completed")
	if !streamed {
		return data
	}
	var completed struct {
		Response json.RawMessage `json:"response"`
	}
	if err := json.Unmarshal([]byte(data), &completed); err != nil {
		t.Fatalf("response.completed %q: %v", data, err)
	}
	return string(completed.Response)
}

// TestAResponsesConversationStaysOnThePodHoldingItsPrefix runs an agent's
// conversation through OpenAI's Responses API, as Codex CLI and the Agents
// SDK send it (instructions, the whole history as input items, nothing
// stored), against simulated vLLM engines publishing their KV events: its
// second turn goes kv-aware to the pod that served the first, and the
// gateway tokenizes it exactly as the engine renders it, and as it
// tokenizes the same conversation sent as a chat.
func TestAResponsesConversationStaysOnThePodHoldingItsPrefix(t *testing.T) {
	staysOnThePodHoldingItsPrefix(t, agentConversation{
		api:   responsesAPI,
		seeds: [2]int{3, 4},
		turn1: func(instructions, first string) string {
			return `{"model":"llama","max_output_tokens":8,"store":false,"instructions":` + jsonString(instructions) +
				`,"input":` + jsonString(first) + `}`
		},
		reply: func(t *testing.T, body []byte) string {
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
			return reply.Output[0].Content[0].Text
		},
		// The history as input items, the reply as the output message it
		// was.
		turn2: func(instructions, first, reply, second string) string {
			return `{"model":"llama","max_output_tokens":8,"store":false,"stream":true,"instructions":` + jsonString(instructions) +
				`,"input":[{"role":"user","content":` + jsonString(first) + `},{"type":"message","id":"msg_1","status":"completed",` +
				`"role":"assistant","content":[{"type":"output_text","text":` + jsonString(reply) + `,"annotations":[]}]},` +
				`{"role":"user","content":[{"type":"input_text","text":` + jsonString(second) + `}]}]}`
		},
		inputTokens: responsesInputTokens,
	})
}
