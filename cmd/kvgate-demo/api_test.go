package main

import (
	"encoding/json"
	"flag"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/routingbench"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/sim/simtest"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// history is a conversation's second turn: the system prompt, a turn and
// its answer, and the next user message.
var history = []chatMessage{
	{Role: "system", Content: "You are a coding agent."},
	{Role: "user", Content: "Fix the build."},
	{Role: "assistant", Content: "Done.", id: "msg_1"},
	{Role: "user", Content: "Now the tests."},
}

func TestRequestBodiesAreShapedAsTheirClientsSendThem(t *testing.T) {
	for _, tc := range []struct {
		api    string
		encode func(string, []chatMessage, int) ([]byte, error)
		want   string
	}{
		{apiChat, chatBody, `{"model":"llama","messages":[{"role":"system","content":"You are a coding agent."},` +
			`{"role":"user","content":"Fix the build."},{"role":"assistant","content":"Done."},{"role":"user","content":"Now the tests."}],` +
			`"max_tokens":16,"stream":true,"stream_options":{"include_usage":true}}`},
		// Codex CLI: the system prompt as instructions, the history as
		// input items, the answers as the output messages they came as.
		{apiResponses, responsesBody, `{"model":"llama","instructions":"You are a coding agent.","input":[` +
			`{"type":"message","role":"user","content":[{"type":"input_text","text":"Fix the build."}]},` +
			`{"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"Done.","annotations":[]}]},` +
			`{"type":"message","role":"user","content":[{"type":"input_text","text":"Now the tests."}]}],` +
			`"max_output_tokens":16,"stream":true,"store":false}`},
		// Claude Code: the system prompt and the messages as text blocks.
		{apiMessages, messagesBody, `{"model":"llama","system":[{"type":"text","text":"You are a coding agent."}],"messages":[` +
			`{"role":"user","content":[{"type":"text","text":"Fix the build."}]},` +
			`{"role":"assistant","content":[{"type":"text","text":"Done."}]},` +
			`{"role":"user","content":[{"type":"text","text":"Now the tests."}]}],"max_tokens":16,"stream":true}`},
	} {
		t.Run(tc.api, func(t *testing.T) {
			got, err := tc.encode("llama", history, 16)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("body\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// startSimServer runs a simulated vLLM engine serving every API, as
// vllm-sim does, until the test ends, and returns its URL.
func startSimServer(t *testing.T) string {
	t.Helper()
	return simtest.Serve(t, simserver.Config{Model: "llama", Ranks: []simserver.Rank{{Engine: sim.EngineConfig{
		BlockSize: 16, NumGPUBlocks: 512, MaxModelLen: 4096,
		Latency: sim.LatencyModel{StepOverhead: 500 * time.Microsecond, PrefillPerToken: time.Microsecond, DecodePerToken: 10 * time.Microsecond},
	}}}}).URL
}

// TestEachAPIReadsTheEnginesStreamAndRendersTheChatsPrompt holds a
// conversation of the workload with a simulated engine through each API:
// the client reads every stream's first token, answer and usage, and each
// turn's prompt is the chat's, its second turn finding the first cached
// (reported by all but the Messages API).
func TestEachAPIReadsTheEnginesStreamAndRendersTheChatsPrompt(t *testing.T) {
	cfg := routingbench.SharedPrefixConfig{Groups: 1, SystemPromptTokens: 200, Conversations: 1, Turns: 3,
		MinUserTokens: 20, MaxUserTokens: 40, MinAnswerTokens: 4, MaxAnswerTokens: 8, MeanTurnGap: time.Second, Seed: 5}
	var chatPrompts []int
	for _, api := range apiNames {
		t.Run(api, func(t *testing.T) {
			w, err := newWorkload(cfg, routingbench.SimTexter{})
			if err != nil {
				t.Fatal(err)
			}
			conv, _ := w.conversation()
			d := w.startDialog(conv)
			c := chatClient{http: newHTTPClient(1), url: startSimServer(t) + apiPaths[api], model: "llama", api: api}
			defer c.http.CloseIdleConnections()
			for turn := 0; !d.done(); turn++ {
				messages, maxTokens, err := d.nextTurn()
				if err != nil {
					t.Fatal(err)
				}
				r, err := c.send(t.Context(), routing.Random, messages, maxTokens)
				if err != nil {
					t.Fatalf("turn %d: %v", turn, err)
				}
				if r.answer == "" || r.ttft <= 0 || r.ttft > r.e2e || r.promptTokens == 0 {
					t.Errorf("turn %d: answer %q, TTFT %v of %v, %d prompt tokens", turn, r.answer, r.ttft, r.e2e, r.promptTokens)
				}
				if api == apiResponses && r.answerID == "" {
					t.Errorf("turn %d: no id of the answer's output message", turn)
				}
				if api == apiChat {
					chatPrompts = append(chatPrompts, r.promptTokens)
				} else if turn < len(chatPrompts) && r.promptTokens != chatPrompts[turn] {
					t.Errorf("turn %d renders %d prompt tokens, the chat %d", turn, r.promptTokens, chatPrompts[turn])
				}
				switch {
				case api == apiMessages:
					if !r.cachedUnknown || r.cachedTokens != 0 {
						t.Errorf("turn %d: cached tokens %d, known %v; the Messages API reports none", turn, r.cachedTokens, !r.cachedUnknown)
					}
				case r.cachedUnknown:
					t.Errorf("turn %d: cached tokens unknown", turn)
				case turn > 0 && r.cachedTokens < cfg.SystemPromptTokens:
					t.Errorf("turn %d: %d cached tokens of %d, want at least the system prompt's %d",
						turn, r.cachedTokens, r.promptTokens, cfg.SystemPromptTokens)
				}
				d.answered(r.answer, r.answerID)
			}
		})
	}
}

func TestStreamReadersMeasureTheFirstTokenOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		read   func(io.Reader, *result, func()) error
		stream string
		want   result
	}{
		{"responses", readResponsesStream,
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"output\":[],\"usage\":null}}\n\n" +
				"event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"item\":{\"id\":\"a1\",\"type\":\"message\"}}\n\n" +
				"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\" the\"}\n\n" +
				"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\" cache\"}\n\n" +
				"event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"item\":{\"id\":\"a1\",\"type\":\"message\"}}\n\n" +
				"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[{\"id\":\"msg_2\",\"type\":\"message\"}]," +
				"\"usage\":{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":64}}}}\n\n",
			result{answer: " the cache", answerID: "a1", promptTokens: 100, cachedTokens: 64}},
		{"responses without text", readResponsesStream,
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[{\"id\":\"msg_2\",\"type\":\"message\"}]," +
				"\"usage\":{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":0}}}}\n\n",
			result{answerID: "msg_2", promptTokens: 100}},
		{"messages", readMessagesStream,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":90,\"output_tokens\":0}}}\n\n" +
				"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"text\",\"text\":\"\"},\"index\":0}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\" the\"},\"index\":0}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\" cache\"},\"index\":0}\n\n" +
				"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"input_tokens\":100,\"output_tokens\":2}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			result{answer: " the cache", promptTokens: 100, cachedUnknown: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r result
			first := 0
			if err := tc.read(strings.NewReader(tc.stream), &r, func() { first++ }); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r, tc.want) || first != 1 {
				t.Errorf("read %+v, first token seen %d times; want %+v, once", r, first, tc.want)
			}
		})
	}
}

func TestStreamReadersRefuseBrokenStreams(t *testing.T) {
	const (
		delta     = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n"
		textDelta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n"
	)
	for _, tc := range []struct {
		name   string
		read   func(io.Reader, *result, func()) error
		stream string
		want   string
	}{
		{"responses cut", readResponsesStream, delta, "before response.completed"},
		{"responses without usage", readResponsesStream, delta +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[]}}\n\n", "without its usage"},
		// The gateway ends a stream the engine broke off with an OpenAI
		// error object in an error event.
		{"responses broken off", readResponsesStream, delta +
			"event: error\ndata: {\"error\":{\"message\":\"engine stopped\",\"type\":\"upstream_error\"}}\n\n", "engine stopped"},
		{"responses error event", readResponsesStream,
			"event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"engine stopped\"}\n\n", "engine stopped"},
		{"responses failed", readResponsesStream,
			"event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"error\":{\"message\":\"engine stopped\"}}}\n\n", "engine stopped"},
		{"responses not JSON", readResponsesStream, "data: {oops\n\n", "undecodable event"},
		{"messages cut", readMessagesStream, textDelta, "before message_stop"},
		{"messages without usage", readMessagesStream, textDelta + "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", "without its usage"},
		{"messages error event", readMessagesStream, textDelta +
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\",\"message\":\"engine stopped\"}}\n\n", "engine stopped"},
		{"messages not JSON", readMessagesStream, "data: {oops\n\n", "undecodable event"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.read(strings.NewReader(tc.stream), &result{}, func() {}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestOptionsSelectTheAPI(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, apiChat},
		{[]string{"-api", "responses"}, apiResponses},
		{[]string{"-api", "messages"}, apiMessages},
	} {
		fs := flag.NewFlagSet("kvgate-demo", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		if o, err := parseOptions(fs, tc.args); err != nil || o.api != tc.want {
			t.Errorf("%q: API %q (%v), want %q", tc.args, o.api, err, tc.want)
		}
	}
}

// TestComparisonShowsNoHitRatioWithoutCachedTokens: requests through an API
// whose usage reports no cached tokens show their hit ratio as unknown,
// not as 0.
func TestComparisonShowsNoHitRatioWithoutCachedTokens(t *testing.T) {
	rec := newRecorder(time.Unix(0, 0))
	for range 2 {
		rec.begin()
		rec.end(result{pod: "static/a", ttft: time.Millisecond, promptTokens: 100, cachedUnknown: true})
	}
	s := rec.summarize(time.Unix(2, 0), []string{"static/a", "static/b"})
	var b strings.Builder
	rec = newRecorder(time.Unix(0, 0))
	rec.begin()
	rec.end(result{pod: "static/a", ttft: 2 * time.Millisecond, promptTokens: 100, cachedUnknown: true})
	printComparison(&b, []runResult{{algorithm: "kv-aware", summary: s},
		{algorithm: "random", summary: rec.summarize(time.Unix(2, 0), []string{"static/a", "static/b"})}})
	if !regexp.MustCompile(`(?m)^kv-aware\s+2\s+1\.0\s+-\s`).MatchString(b.String()) ||
		!strings.Contains(b.String(), "hit ratio -: the engines reported no cached tokens") ||
		!strings.Contains(b.String(), "kv-aware vs random: TTFT p90") {
		t.Errorf("comparison:\n%s", b.String())
	}
	var live strings.Builder
	printLive(&live, "kv-aware", s, 1, nil, 0.9, nil)
	if !strings.Contains(live.String(), "hit -") || !strings.Contains(live.String(), "pods:  a - (2)  b - (0)") {
		t.Errorf("live summary:\n%s", live.String())
	}
}

// With -reasoning an answer goes back with the reasoning that preceded it,
// each API in its own shape (a chat's reasoning member, a Responses
// reasoning item, a Messages thinking block), and each body converts into
// the chat the engine renders with that reasoning on the answer.
func TestAnswersCarryTheirReasoningInEveryAPI(t *testing.T) {
	thought := slices.Clone(history)
	thought[2].Reasoning = "Run make first."
	want := []map[string]any{
		{"role": "system", "content": "You are a coding agent."},
		{"role": "user", "content": "Fix the build."},
		{"role": "assistant", "content": "Done.", "reasoning": "Run make first."},
		{"role": "user", "content": "Now the tests."},
	}
	for _, tc := range []struct {
		api     string
		encode  func(string, []chatMessage, int) ([]byte, error)
		convert func([]byte) (json.RawMessage, error)
	}{
		{apiChat, chatBody, func(body []byte) (json.RawMessage, error) {
			var chat struct{ Messages json.RawMessage }
			return chat.Messages, json.Unmarshal(body, &chat)
		}},
		{apiResponses, responsesBody, func(body []byte) (json.RawMessage, error) {
			chat, err := tokenizer.ChatFromResponses(body)
			if err != nil {
				return nil, err
			}
			return chat.Messages, nil
		}},
		{apiMessages, messagesBody, func(body []byte) (json.RawMessage, error) {
			chat, err := tokenizer.ChatFromAnthropic(body)
			if err != nil {
				return nil, err
			}
			return chat.Messages, nil
		}},
	} {
		t.Run(tc.api, func(t *testing.T) {
			body, err := tc.encode("llama", thought, 16)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := tc.convert(body)
			if err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			var got []map[string]any
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			// A content of one text part renders as its text.
			for _, m := range got {
				if parts, ok := m["content"].([]any); ok && len(parts) == 1 {
					if part, ok := parts[0].(map[string]any); ok && part["type"] == "text" {
						m["content"] = part["text"]
					}
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s converts into\n%s\nwant the answer's reasoning on it", body, raw)
			}
		})
	}
}
