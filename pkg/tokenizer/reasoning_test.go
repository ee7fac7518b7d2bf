package tokenizer

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// agentLoop returns a multi-turn chat request of an agent loop whose
// assistant messages carry their reasoning as member.
func agentLoop(member string) string {
	return `{"model":"` + localModelName + `","tools":[{"type":"function","function":{"name":"get_weather",` +
		`"parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"messages":[` +
		`{"role":"system","content":"You are a weather assistant."},` +
		`{"role":"user","content":"Is it warm in Paris?"},` +
		`{"role":"assistant","content":"","` + member + `":"I should look the weather up.",` +
		`"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
		`{"role":"tool","tool_call_id":"call_1","content":"{\"temperature\":24}"},` +
		`{"role":"assistant","content":"Yes, 24 degrees.","` + member + `":"24 degrees is warm."},` +
		`{"role":"user","content":"And tomorrow?"},` +
		`{"role":"assistant","content":"","` + member + `":"Look up tomorrow's forecast, then answer.",` +
		`"tool_calls":[{"id":"call_2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
		`{"role":"tool","tool_call_id":"call_2","content":"{\"temperature\":19}"}]}`
}

// responsesAgentTurn is a Responses body whose reasoning item and
// function call become an assistant message carrying reasoning.
const responsesAgentTurn = `{"model":"` + localModelName + `","input":[{"role":"user","content":"Is it warm in Paris?"},` +
	`{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"I should look the weather up."}]},` +
	`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}","status":"completed"},` +
	`{"type":"function_call_output","call_id":"call_1","output":"{\"temperature\":24}"}]}`

// withReasoning configures a simulated engine to pass reasoning as p.
func withReasoning(p hf.ReasoningPassing) func(*simserver.Config) {
	return func(c *simserver.Config) { c.Reasoning = p }
}

// chatOf decodes body, a chat or, with input, a Responses request.
func chatOf(t testing.TB, body string) *ChatRequest {
	t.Helper()
	if !strings.Contains(body, `"input"`) {
		return chatRequest(t, body)
	}
	req, err := ChatFromResponses([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Model = localModelName
	return req
}

// The chat form's verification asks the engine how it passes an
// assistant message's reasoning, and chats carrying it are then tokenized
// in process with the engine's ids, whichever vLLM convention it follows.
func TestChatsCarryingReasoningAreTokenizedInProcessAsTheEnginePassesIt(t *testing.T) {
	localDir, _ := qwen3Dir(t)
	for _, c := range []struct {
		name    string
		engine  hf.ReasoningPassing
		learned string
		body    string
	}{
		{"recent vLLM, reasoning", hf.VLLMReasoning, "reasoning", agentLoop("reasoning")},
		{"recent vLLM, Responses reasoning item", hf.VLLMReasoning, "reasoning", responsesAgentTurn},
		{"earlier vLLM, reasoning_content", hf.VLLMReasoningContent, "reasoning_content", agentLoop("reasoning_content")},
	} {
		t.Run(c.name, func(t *testing.T) {
			eng := startEngine(t, loadQwen3(t), withReasoning(c.engine))
			tk, reg := newTestTokenizer(t, Config{LocalDir: localDir, VerifyFraction: -1, NoPrefixReuse: true})
			mustTokenize(t, tk, eng.url, conversation(1))
			waitVerified(t, tk)
			if lm := tk.LocalModels()[0]; lm.Reasoning != c.learned {
				t.Fatalf("LocalModels: %+v, want reasoning %q", lm, c.learned)
			}
			if n := testsupport.MetricValue(t, reg, "kvgate_tokenizer_reasoning_probes_total",
				map[string]string{"model": localModelName, "result": probeMatch}); n != float64(2*len(reasoningProbes)) {
				t.Errorf("reasoning_probes_total{result=match} = %v, want %d", n, 2*len(reasoningProbes))
			}
			localChats := func() float64 {
				return testsupport.MetricValue(t, reg, "kvgate_tokenizer_local_tokenizations_total", map[string]string{"form": FormChat})
			}
			before, calls := localChats(), eng.calls.Load()
			got, err := tk.TokenizeChat(context.Background(), eng.url, chatOf(t, c.body))
			if err != nil {
				t.Fatal(err)
			}
			if n := eng.calls.Load() - calls; n != 0 || localChats() != before+1 {
				t.Fatalf("the chat cost %d /tokenize calls, and %v in-process tokenizations; want none and 1", n, localChats()-before)
			}
			remote, _ := newTestTokenizer(t, Config{NoPrefixReuse: true})
			want, err := remote.TokenizeChat(context.Background(), eng.url, chatOf(t, c.body))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("in process %v\nengine %v", got, want)
			}
			// The reasoning is in the prompt: without it the ids differ.
			without := strings.NewReplacer(`"reasoning":`, `"ignored":`, `"reasoning_content":`, `"ignored":`).Replace(c.body)
			if c.body != responsesAgentTurn {
				if plain := mustTokenize(t, remote, eng.url, without); slices.Equal(plain, want) {
					t.Error("the chat renders alike without its reasoning")
				}
			}
		})
	}
}

// Chats carrying reasoning that the sampled live verification compares
// agree with the engine: the chat form stays in process.
func TestLiveVerificationComparesChatsCarryingReasoning(t *testing.T) {
	localDir, _ := qwen3Dir(t)
	eng := startEngine(t, loadQwen3(t))
	tk, reg := newTestTokenizer(t, Config{LocalDir: localDir, VerifyFraction: 1, NoPrefixReuse: true})
	mustTokenize(t, tk, eng.url, conversation(1))
	waitVerified(t, tk)
	matches := func() float64 {
		return testsupport.MetricValue(t, reg, "kvgate_tokenizer_verifications_total",
			map[string]string{"model": localModelName, "form": FormChat, "result": verifyMatch})
	}
	before := matches()
	mustTokenize(t, tk, eng.url, agentLoop("reasoning"))
	testsupport.Eventually(t, "the live comparison to match", func() bool { return matches() == before+1 })
	if lm := tk.LocalModels()[0]; lm.Chat != LocalActive || lm.Reasoning != "reasoning" {
		t.Errorf("LocalModels: %+v, want the chat form active with reasoning learned", lm)
	}
}

// An engine that refuses the reasoning probes leaves the passing unknown:
// the chat form is verified, and chats carrying reasoning go to the
// engine.
func TestEngineRefusingTheReasoningProbesTokenizesChatsCarryingReasoning(t *testing.T) {
	localDir, _ := qwen3Dir(t)
	eng := startEngine(t, loadQwen3(t))
	refusing := probeAnswering(t, eng.url, func(w http.ResponseWriter) bool {
		http.Error(w, `{"error":{"message":"no","type":"BadRequestError","code":400}}`, http.StatusBadRequest)
		return true
	})
	tk, reg := newTestTokenizer(t, Config{LocalDir: localDir, VerifyFraction: -1, NoPrefixReuse: true})
	mustTokenize(t, tk, refusing.URL, conversation(1))
	waitVerified(t, tk)
	if lm := tk.LocalModels()[0]; lm.Reasoning != "unknown" {
		t.Fatalf("LocalModels: %+v, want reasoning unknown", lm)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_tokenizer_reasoning_probes_total",
		map[string]string{"model": localModelName, "result": probeRefused}); n != 1 {
		t.Errorf("reasoning_probes_total{result=refused} = %v, want 1", n)
	}
	before := eng.calls.Load()
	got := mustTokenize(t, tk, refusing.URL, agentLoop("reasoning"))
	if eng.calls.Load() != before+1 {
		t.Fatal("a chat carrying reasoning was not tokenized by the engine")
	}
	remote, _ := newTestTokenizer(t, Config{NoPrefixReuse: true})
	wantTokens(t, got, mustTokenize(t, remote, eng.url, agentLoop("reasoning")))
	// Chats without reasoning are still tokenized in process.
	before = eng.calls.Load()
	mustTokenize(t, tk, refusing.URL, conversation(3))
	if eng.calls.Load() != before {
		t.Error("a chat without reasoning was tokenized by the engine")
	}
}

// An engine that does not answer a reasoning probe (a restart, an
// overloaded server) leaves the chat form unverified, the engine
// tokenizing meanwhile, and the verification with its probes is tried
// again after verifyRetry, as when the engine does not answer a sample.
func TestReasoningProbeTheEngineDidNotAnswerIsAskedAgain(t *testing.T) {
	localDir, _ := qwen3Dir(t)
	eng := startEngine(t, loadQwen3(t))
	var failing atomic.Bool
	failing.Store(true)
	flaky := probeAnswering(t, eng.url, func(w http.ResponseWriter) bool {
		if !failing.Load() {
			return false
		}
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
		return true
	})
	tk, reg := newTestTokenizer(t, Config{LocalDir: localDir, VerifyFraction: -1, NoPrefixReuse: true})
	mustTokenize(t, tk, flaky.URL, conversation(1))
	probeErrors := func() float64 {
		return testsupport.MetricValue(t, reg, "kvgate_tokenizer_reasoning_probes_total",
			map[string]string{"model": localModelName, "result": probeError})
	}
	testsupport.Eventually(t, "a reasoning probe the engine did not answer", func() bool { return probeErrors() == 1 })
	lm := tk.local[localModelName]
	testsupport.Eventually(t, "the chat form left unverified", func() bool {
		return lm.state[formIndexChat].Load() == stateUnverified
	})
	if got := tk.LocalModels()[0]; got.Chat != "unverified" || got.Reasoning != "unknown" || got.ChatReason != "" {
		t.Fatalf("LocalModels: %+v, want the chat form unverified, reasoning unknown", got)
	}
	if lm.retryAt[formIndexChat].Load() <= time.Now().UnixNano() {
		t.Fatal("no retry scheduled")
	}
	// The engine answers again, and the retry is due.
	failing.Store(false)
	lm.retryAt[formIndexChat].Store(0)
	mustTokenize(t, tk, flaky.URL, conversation(2))
	waitVerified(t, tk)
	if got := tk.LocalModels()[0]; got.Reasoning != "reasoning" {
		t.Fatalf("LocalModels: %+v, want reasoning learned once the engine answered", got)
	}
}

// probeAnswering returns a server in front of the engine at base whose
// answer to a reasoning probe is answer's, when it writes one (true); it
// forwards every other request, and probes answer leaves, to the engine.
func probeAnswering(t testing.TB, base string, answer func(w http.ResponseWriter) bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), probeThought) && answer(w) {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy(t, w, r, base)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// proxy forwards r to base and copies the answer to w.
func proxy(t testing.TB, w http.ResponseWriter, r *http.Request, base string) {
	resp, err := http.Post(base+r.URL.Path, r.Header.Get("Content-Type"), r.Body)
	if err != nil {
		t.Error(err)
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

// Config.Reasoning other than ReasoningAuto sets the way for every model
// without probing the engine; ReasoningEngine leaves chats carrying
// reasoning to the engine.
func TestConfiguredReasoningIsTakenWithoutProbing(t *testing.T) {
	localDir, _ := qwen3Dir(t)
	for _, c := range []struct {
		setting string
		engine  hf.ReasoningPassing
		body    string
		local   bool // the chat is tokenized in process
	}{
		{ReasoningRecent, hf.VLLMReasoning, agentLoop("reasoning"), true},
		{ReasoningEarlier, hf.VLLMReasoningContent, agentLoop("reasoning_content"), true},
		{ReasoningEngine, hf.VLLMReasoning, agentLoop("reasoning"), false},
	} {
		t.Run(c.setting, func(t *testing.T) {
			eng := startEngine(t, loadQwen3(t), withReasoning(c.engine))
			tk, reg := newTestTokenizer(t, Config{LocalDir: localDir, VerifyFraction: -1, NoPrefixReuse: true, Reasoning: c.setting})
			mustTokenize(t, tk, eng.url, conversation(1))
			waitVerified(t, tk)
			want := c.setting
			if !c.local {
				want = "unknown"
			}
			if lm := tk.LocalModels()[0]; lm.Reasoning != want {
				t.Fatalf("LocalModels: %+v, want reasoning %q", lm, want)
			}
			for _, result := range []string{probeMatch, probeNoMatch, probeRefused, probeError} {
				if n := testsupport.MetricValue(t, reg, "kvgate_tokenizer_reasoning_probes_total",
					map[string]string{"model": localModelName, "result": result}); n != 0 {
					t.Errorf("reasoning_probes_total{result=%s} = %v, want no probe", result, n)
				}
			}
			before := eng.calls.Load()
			got := mustTokenize(t, tk, eng.url, c.body)
			if sent := eng.calls.Load() != before; sent == c.local {
				t.Fatalf("chat sent to the engine: %v, want %v", sent, !c.local)
			}
			remote, _ := newTestTokenizer(t, Config{NoPrefixReuse: true})
			wantTokens(t, got, mustTokenize(t, remote, eng.url, c.body))
		})
	}
	if _, err := New(Config{Reasoning: "think"}, prometheus.NewRegistry()); err == nil {
		t.Error("New accepted Reasoning \"think\"")
	}
}

// waitVerified waits for both forms of the model to be verified, so that
// no verification call reaches the engine afterwards.
func waitVerified(t testing.TB, tk *Tokenizer) {
	t.Helper()
	testsupport.Eventually(t, "both forms to be verified", func() bool {
		return localActive(t, tk, FormChat) == 1 && localActive(t, tk, FormCompletion) == 1
	})
}
