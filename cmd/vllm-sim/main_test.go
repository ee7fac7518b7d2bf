package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
)

func parse(t *testing.T, args ...string) (options, error) {
	t.Helper()
	fs := flag.NewFlagSet("vllm-sim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return parseOptions(fs, args)
}

func TestOptionsBuildOneEnginePerRank(t *testing.T) {
	o, err := parse(t, "--model", "m", "--data-parallel-size", "3", "--block-size", "32",
		"--lora-modules", "sql=/adapters/sql, chat", "--step-overhead", "2ms")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := o.serverConfig(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Model != "m" || len(cfg.Ranks) != 3 || cfg.AllowRuntimeLoRAUpdating ||
		!slices.Equal(cfg.LoRAModules, []simserver.LoRAModule{{Name: "sql", Path: "/adapters/sql"}, {Name: "chat"}}) {
		t.Fatalf("config %+v: want model m, 3 ranks, adapters sql at /adapters/sql and chat, no runtime loading", cfg)
	}
	seeds := map[string]bool{}
	for _, r := range cfg.Ranks {
		if r.Engine.BlockSize != 32 || r.Engine.Latency.StepOverhead != 2*time.Millisecond {
			t.Errorf("rank engine %+v: flags not applied", r.Engine)
		}
		seeds[r.Engine.HashSeed] = true
	}
	if len(seeds) != 3 {
		t.Errorf("ranks share hash seeds %v; without -hash-seed each draws its own", seeds)
	}

	o, err = parse(t, "--data-parallel-size", "2", "--hash-seed", "fleet")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ = o.serverConfig(rand.Reader)
	if cfg.Ranks[0].Engine.HashSeed != "fleet" || cfg.Ranks[1].Engine.HashSeed != "fleet" {
		t.Errorf("-hash-seed not shared by the ranks: %q %q", cfg.Ranks[0].Engine.HashSeed, cfg.Ranks[1].Engine.HashSeed)
	}
}

func TestAPIKeyFlagMakesTheServerRequireTheKey(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, nil},
		{[]string{"--api-key", "s3cret"}, []string{"s3cret"}},
	} {
		o, err := parse(t, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := o.serverConfig(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.APIKeys, tc.want) {
			t.Errorf("%q: APIKeys %q, want %q", tc.args, cfg.APIKeys, tc.want)
		}
	}
}

func TestCORSFlagsSetThePolicyWithVLLMsDefaults(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want simserver.CORS
	}{
		{nil, simserver.DefaultCORS()},
		{[]string{"--allowed-origins", "https://a.example, https://b.example", "--allowed-methods", "POST,GET",
			"--allowed-headers", "", "--allow-credentials"},
			simserver.CORS{AllowedOrigins: []string{"https://a.example", "https://b.example"}, AllowedMethods: []string{"POST", "GET"},
				AllowedHeaders: []string{}, AllowCredentials: true}},
		{[]string{"--allowed-origins", `["https://a.example"]`, "--allowed-headers", `["X-Custom", "Authorization"]`},
			simserver.CORS{AllowedOrigins: []string{"https://a.example"}, AllowedMethods: []string{"*"},
				AllowedHeaders: []string{"X-Custom", "Authorization"}}},
	} {
		o, err := parse(t, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := o.serverConfig(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		got := *cfg.CORS
		if !slices.Equal(got.AllowedOrigins, tc.want.AllowedOrigins) || !slices.Equal(got.AllowedMethods, tc.want.AllowedMethods) ||
			!slices.Equal(got.AllowedHeaders, tc.want.AllowedHeaders) || got.AllowCredentials != tc.want.AllowCredentials {
			t.Errorf("%q: CORS %+v, want %+v", tc.args, got, tc.want)
		}
	}
}

func TestAllowedOriginsFlagRefusesOtherOriginsPreflights(t *testing.T) {
	url, stop := startServe(t, "--allowed-origins", "https://app.example")
	defer func() { _ = stop() }()
	for origin, want := range map[string]int{"https://app.example": http.StatusOK, "https://evil.example": http.StatusBadRequest} {
		req, err := http.NewRequest(http.MethodOptions, url+"/v1/completions", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("preflight from %s: HTTP %d, want %d", origin, resp.StatusCode, want)
		}
	}
}

func TestServedModelNameNamesTheModelAndModelItsRoot(t *testing.T) {
	tests := []struct {
		args            []string
		model, rootPath string
	}{
		{[]string{"--model", "llama"}, "llama", ""},
		{[]string{"--model", "/models/Llama-3.1-8B", "--served-model-name", "llama"}, "llama", "/models/Llama-3.1-8B"},
		{[]string{"--served-model-name", "llama"}, "llama", "sim-model"},
	}
	for _, tt := range tests {
		o, err := parse(t, tt.args...)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := o.serverConfig(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Model != tt.model || cfg.ModelPath != tt.rootPath {
			t.Errorf("%q: model %q at %q, want %q at %q", tt.args, cfg.Model, cfg.ModelPath, tt.model, tt.rootPath)
		}
	}
}

func TestOptionsSetTheLatencyModelAndEventDelivery(t *testing.T) {
	o, err := parse(t, "--attention-ns-per-context-token", "3.5", "--decode-ns-per-context-token", "64", "--speed", "1.8",
		"--kv-events-delay", "5ms", "--kv-events-jitter", "20ms", "--kv-events-loss", "0.01")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := o.serverConfig(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if lat := cfg.Ranks[0].Engine.Latency; lat.AttentionPerContextToken != 3.5 || lat.DecodePerContextToken != 64 || lat.Speed != 1.8 {
		t.Errorf("latency model %+v: flags not applied", lat)
	}
	if d := o.delivery; d.Delay != 5*time.Millisecond || d.Jitter != 20*time.Millisecond || d.LossRate != 0.01 {
		t.Errorf("event delivery %+v: flags not applied", d)
	}
}

func TestOptionsRejectBadValues(t *testing.T) {
	for _, args := range [][]string{
		{"--data-parallel-size", "0"},
		{"--port", "70000"},
		{"--block-size", "x"},
		{"--kv-events-loss", "1.5"},
		{"--kv-events-delay", "-1s"},
		{"--speed", "0"},
		{"--allowed-origins", `["https://a.example"`},
		{"--allowed-headers", `[1]`},
		{"--reasoning-passing", "think"},
		{"--responses-store-max", "0"},
		{"positional"},
	} {
		if _, err := parse(t, args...); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// startServe runs serve with args on a loopback port and returns its URL
// and a stop func that cancels it and returns serve's result.
func startServe(t *testing.T, args ...string) (url string, stop func() error) {
	t.Helper()
	o, err := parse(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, o, ln) }()
	stop = func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(15 * time.Second):
			t.Fatal("serve did not return after cancel")
			return nil
		}
	}
	return "http://" + ln.Addr().String(), stop
}

func TestServeAnswersUntilCancelled(t *testing.T) {
	url, stop := startServe(t, "--num-gpu-blocks", "64", "--step-overhead", "1ms")
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"completion_tokens":2`) {
		t.Fatalf("completion: %d %s", resp.StatusCode, body)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve after cancel: %v", err)
	}
	if _, err := http.Get(url + "/health"); err == nil {
		t.Error("still serving after shutdown")
	}
}

// TestServeAnswersEveryAPI holds that the binary serves, besides the
// completions, the APIs vLLM converts into chats: OpenAI's Responses and
// Anthropic's Messages.
func TestServeAnswersEveryAPI(t *testing.T) {
	url, stop := startServe(t, "--num-gpu-blocks", "64", "--step-overhead", "1ms")
	defer func() { _ = stop() }()
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, `"completion_tokens":2`},
		{"/v1/responses", `{"model":"sim-model","input":"hi","max_output_tokens":2}`, `"output_tokens":2`},
		{"/v1/messages", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, `"output_tokens":2`},
	} {
		resp, err := http.Post(url+tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: %d %s, want 200 with %s", tc.path, resp.StatusCode, body, tc.want)
		}
	}
}

func TestShutdownFailsRequestsThatOutliveTheGrace(t *testing.T) {
	url, stop := startServe(t, "--num-gpu-blocks", "64", "--step-overhead", "20ms", "--shutdown-grace", "100ms")
	// 200 tokens at 20 ms a step take 4 s, far beyond the grace.
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"a long answer","max_tokens":200,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data: " {
		t.Fatalf("stream opened with %q: %v", first, err)
	}
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("shutdown took %v with a 100ms grace", took)
	}
	rest, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(rest), "engine stopped") || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("stream ended with %q, want an error event and [DONE]", rest[max(0, len(rest)-300):])
	}
}

func TestTokenizerFlagLoadsTheModelsFiles(t *testing.T) {
	dir := filepath.Join(testsupport.TokenizerModels(t), "qwen3")
	url, stop := startServe(t, "--tokenizer", dir)
	defer stop()
	resp, err := http.Post(url+"/tokenize", "application/json", strings.NewReader(`{"prompt":"Hello world!","add_special_tokens":false}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct{ Tokens []uint32 }
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	// Qwen3's ids for "Hello" and " world!"... as Hugging Face computes them.
	if want := []uint32{9707, 1879, 0}; !slices.Equal(got.Tokens, want) {
		t.Errorf("tokens %v, want %v", got.Tokens, want)
	}
	o, err := parse(t, "--tokenizer", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.serverConfig(rand.Reader); err == nil || !strings.Contains(err.Error(), "-tokenizer") {
		t.Errorf("a directory without tokenizer.json: %v, want a -tokenizer error", err)
	}
}

func TestReasoningPassingFlagChoosesHowTheTemplateSeesReasoning(t *testing.T) {
	dir := filepath.Join(testsupport.TokenizerModels(t), "qwen3")
	for _, c := range []struct {
		args   []string
		member string // the member the template sees
	}{
		{nil, "reasoning"},
		{[]string{"--reasoning-passing", "reasoning"}, "reasoning"},
		{[]string{"--reasoning-passing", "reasoning_content"}, "reasoning_content"},
	} {
		url, stop := startServe(t, append([]string{"--tokenizer", dir}, c.args...)...)
		count := func(member string) int {
			t.Helper()
			body := `{"add_generation_prompt":false,"messages":[{"role":"user","content":"Hi"},` +
				`{"role":"assistant","content":"Hello.","` + member + `":"a long thought about greetings"}]}`
			resp, err := http.Post(url+"/tokenize", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var got struct{ Count int }
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("%q: /tokenize with %s: status %d, %v", c.args, member, resp.StatusCode, err)
			}
			return got.Count
		}
		// Qwen3's template writes the reasoning the engine passes in the
		// think block of the last turn, which is otherwise empty.
		seen, other := count("reasoning"), count("reasoning_content")
		if c.member == "reasoning_content" {
			seen, other = other, seen
		}
		if seen <= other {
			t.Errorf("%q: %s gave %d tokens, the other member %d; want the template to see %s", c.args, c.member, seen, other, c.member)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestResponsesStoreFlagAndVLLMsVariableKeepResponses holds that
// -responses-store, whose default VLLM_ENABLE_RESPONSES_API_STORE sets
// as it enables vLLM's store, lets a request continue a stored response.
func TestResponsesStoreFlagAndVLLMsVariableKeepResponses(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
		want bool
	}{
		{"", nil, false},
		{"", []string{"--responses-store"}, true},
		{"1", nil, true},
		{"true", nil, true},
		{"0", []string{"--responses-store-max", "5"}, false},
		{"1", []string{"--responses-store=false"}, false},
	} {
		t.Setenv("VLLM_ENABLE_RESPONSES_API_STORE", tc.env)
		url, stop := startServe(t, append([]string{"--num-gpu-blocks", "64", "--step-overhead", "1ms"}, tc.args...)...)
		post := func(body string) (int, string) {
			t.Helper()
			resp, err := http.Post(url+"/v1/responses", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			out, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(out)
		}
		status, out := post(`{"model":"sim-model","input":"hi","max_output_tokens":2}`)
		var first struct{ ID string }
		if err := json.Unmarshal([]byte(out), &first); err != nil || status != http.StatusOK {
			t.Fatalf("env %q %q: status %d %s", tc.env, tc.args, status, out)
		}
		status, out = post(`{"model":"sim-model","input":"and?","max_output_tokens":2,"previous_response_id":"` + first.ID + `"}`)
		if got := status == http.StatusOK; got != tc.want {
			t.Errorf("env %q %q: follow-up got %d %s, want it served: %v", tc.env, tc.args, status, out, tc.want)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("VLLM_ENABLE_RESPONSES_API_STORE", "yes")
	if _, err := parse(t); err == nil || !strings.Contains(err.Error(), "VLLM_ENABLE_RESPONSES_API_STORE") {
		t.Errorf("VLLM_ENABLE_RESPONSES_API_STORE=yes: %v, want an error naming the variable", err)
	}
}

func TestResponsesStoreMaxFlagBoundsTheStore(t *testing.T) {
	o, err := parse(t, "--responses-store", "--responses-store-max", "5")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := o.serverConfig(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.ResponsesStore || cfg.ResponsesStoreMax != 5 {
		t.Errorf("store %v, at most %d; want on, at most 5", cfg.ResponsesStore, cfg.ResponsesStoreMax)
	}
}
