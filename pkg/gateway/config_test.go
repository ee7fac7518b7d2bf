package gateway

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/slo"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"github.com/kvgate/kvgate/pkg/types"
)

func envOf(m map[string]string) *config.Env {
	return config.NewEnv(func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	})
}

func TestLoadConfigDefaults(t *testing.T) {
	e := envOf(nil)
	cfg := LoadConfig(e)
	if err := e.Err(); err != nil {
		t.Fatalf("defaults rejected: %v", err)
	}
	if cfg.ListenAddress != ":8080" || cfg.AdminListenAddress != "" || cfg.MaxRequestBodyBytes != 16<<20 || cfg.ShutdownTimeout != 30*time.Second ||
		cfg.ShutdownDelay != 5*time.Second || cfg.Discovery.Mode != config.DiscoveryKubernetes || !cfg.KVSync.Enabled ||
		!cfg.RemoteTokenizer || cfg.TokenizerEndpointTemplate != "http://%s:8000" || cfg.Tokenizer.Timeout != 5*time.Second ||
		cfg.Routing.DefaultAlgorithm != "kv-aware" || cfg.Routing.MinFleetQueue != 0.5 || cfg.RequestTTL != DefaultRequestTTL ||
		cfg.Cache.PodMetricRefreshInterval != 50*time.Millisecond || cfg.Cache.AdapterRefreshInterval != 10*time.Second ||
		cfg.MaxHeldRequestBytes != 256<<20 || cfg.ClientWriteTimeout != time.Minute || cfg.ResponseTimeout != time.Hour ||
		cfg.Cache.MaxAdaptersPerPod != 256 || cfg.MaxClientConnections != 10000 {
		t.Errorf("defaults: %+v", cfg)
	}
	if cfg.Redis.RequestTraces || cfg.Redis.GPUProfiles || cfg.Redis.SharedCounts || cfg.Redis.StoredResponses {
		t.Errorf("Redis features on without Redis: %+v", cfg.Redis)
	}
	e = envOf(map[string]string{"KVGATE_ROUTING_MIN_FLEET_QUEUE": "0"})
	if cfg = LoadConfig(e); e.Err() != nil || cfg.Routing.MinFleetQueue >= 0 {
		t.Errorf("fleet queue floor set to 0: %v, %v; want none (negative for routing.Config)", cfg.Routing.MinFleetQueue, e.Err())
	}
	e = envOf(map[string]string{"KVGATE_ADAPTER_REFRESH_INTERVAL": "0"})
	if cfg = LoadConfig(e); e.Err() != nil || cfg.Cache.AdapterRefreshInterval >= 0 {
		t.Errorf("adapter listing set to 0: interval %v, %v; want it off", cfg.Cache.AdapterRefreshInterval, e.Err())
	}
	e = envOf(map[string]string{"KVGATE_MAX_ADAPTERS_PER_POD": "1000"})
	if cfg = LoadConfig(e); e.Err() != nil || cfg.Cache.MaxAdaptersPerPod != 1000 {
		t.Errorf("adapters per pod set to 1000: %v, %v", cfg.Cache.MaxAdaptersPerPod, e.Err())
	}
	e = envOf(map[string]string{"KVGATE_MAX_ADAPTERS_PER_POD": "0"})
	if LoadConfig(e); e.Err() == nil || !strings.Contains(e.Err().Error(), "KVGATE_MAX_ADAPTERS_PER_POD") {
		t.Errorf("adapters per pod set to 0: %v, want an error naming the variable", e.Err())
	}
	e = envOf(map[string]string{"KVGATE_SLO_TTFT": "1.5s", "KVGATE_SLO_TPOT": "0.05s", "KVGATE_SLO_QUEUE_MAX_WAIT": "30",
		"KVGATE_SLO_MODELS": "llama=ttft:2s,ttft-per-token:200us; qwen=none"})
	if cfg = LoadConfig(e); e.Err() != nil || cfg.SLO.Default != (types.SLO{TTFT: 1500 * time.Millisecond, TPOT: 50 * time.Millisecond}) ||
		cfg.SLO.MaxWait != 30*time.Second || cfg.SLO.MaxQueueLength != 1024 || len(cfg.SLO.Models) != 2 ||
		cfg.SLO.Models["llama"] != (types.SLO{TTFT: 2 * time.Second, TTFTPerPromptToken: 200 * time.Microsecond}) ||
		!cfg.SLO.Models["qwen"].IsZero() {
		t.Errorf("SLOs: %+v, %v", cfg.SLO, e.Err())
	}
	e = envOf(map[string]string{"KVGATE_REDIS_ADDRESS": "redis:6379"})
	cfg = LoadConfig(e)
	if e.Err() != nil || cfg.Redis.RequestTraces || !cfg.Redis.GPUProfiles || !cfg.Redis.SharedCounts ||
		!cfg.Redis.StoredResponses || cfg.Redis.Stored.TTL != time.Hour || cfg.Redis.Stored.LookupTimeout != 50*time.Millisecond {
		t.Errorf("with Redis: %+v, %v; want profiles, shared counts and stored responses (for 1h, looked up within "+
			"50ms) on, traces off", cfg.Redis, e.Err())
	}
}

func TestNewRefusesToHoldLessThanTheLargestBody(t *testing.T) {
	cfg := Config{MaxRequestBodyBytes: 1 << 20, MaxHeldRequestBytes: 1 << 19}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "largest request body") {
		t.Errorf("New with %d bytes held and bodies of %d: %v, want an error", cfg.MaxHeldRequestBytes, cfg.MaxRequestBodyBytes, err)
	}
}

func TestNewRefusesToHoldNoClientConnection(t *testing.T) {
	cfg := Config{MaxClientConnections: -1}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "client connections") {
		t.Errorf("New with %d client connections: %v, want an error", cfg.MaxClientConnections, err)
	}
	e := envOf(map[string]string{"KVGATE_MAX_CLIENT_CONNECTIONS": "0"})
	if LoadConfig(e); e.Err() == nil || !strings.Contains(e.Err().Error(), "KVGATE_MAX_CLIENT_CONNECTIONS") {
		t.Errorf("client connections set to 0: %v, want an error naming the variable", e.Err())
	}
}

func TestNewRefusesAResponseTimeoutBelowTheFirstByteTimeout(t *testing.T) {
	cfg := Config{FirstByteTimeout: 10 * time.Minute, ResponseTimeout: time.Minute}
	_, err := New(cfg)
	if err == nil || !strings.Contains(err.Error(), "KVGATE_UPSTREAM_RESPONSE_TIMEOUT") ||
		!strings.Contains(err.Error(), "KVGATE_UPSTREAM_FIRST_BYTE_TIMEOUT") {
		t.Errorf("New with a response timeout of %v and a first-byte timeout of %v: %v, want an error naming both",
			cfg.ResponseTimeout, cfg.FirstByteTimeout, err)
	}
	e := envOf(map[string]string{"KVGATE_UPSTREAM_FIRST_BYTE_TIMEOUT": "90s", "KVGATE_UPSTREAM_RESPONSE_TIMEOUT": "1m"})
	if cfg := LoadConfig(e); e.Err() != nil || cfg.ResponseTimeout != time.Minute {
		t.Fatalf("LoadConfig: %v, %v", cfg.ResponseTimeout, e.Err())
	} else if _, err := New(cfg); err == nil {
		t.Error("New with the response timeout below the first-byte timeout from the environment: no error")
	}
}

func TestLoadConfigGivesTheEngineAPIKeyToTheModelListingAndTheTokenizer(t *testing.T) {
	for _, tc := range []struct {
		value, want string
		ok          bool
	}{
		{"", "", true},
		{"sk-s3cret", "sk-s3cret", true},
		{"  sk-s3cret\n", "sk-s3cret", true}, // surrounding white space is trimmed, as for every variable
		{"sk-s3cret\r\nX-Injected: 1", "", false},
		{"sk-s3cr\u00e9t", "", false},
	} {
		e := envOf(map[string]string{"KVGATE_ENGINE_API_KEY": tc.value})
		cfg := LoadConfig(e)
		if !tc.ok {
			if err := e.Err(); err == nil || !strings.Contains(err.Error(), "KVGATE_ENGINE_API_KEY") ||
				strings.Contains(err.Error(), "s3cr") {
				t.Errorf("%q: error %v, want one naming KVGATE_ENGINE_API_KEY and not the key", tc.value, err)
			}
			continue
		}
		if e.Err() != nil || cfg.Cache.EngineAPIKey != tc.want || cfg.Tokenizer.APIKey != tc.want {
			t.Errorf("%q: model listing key %q, tokenizer key %q, %v; want %q for both", tc.value,
				cfg.Cache.EngineAPIKey, cfg.Tokenizer.APIKey, e.Err(), tc.want)
		}
	}
}

func TestLoadConfigReadsAIBrixsRedisVariables(t *testing.T) {
	tests := []struct {
		env               map[string]string
		address, password string
	}{
		{map[string]string{"REDIS_HOST": "aibrix-redis-master", "REDIS_PASSWORD": "s3cret"}, "aibrix-redis-master:6379", "s3cret"},
		{map[string]string{"REDIS_HOST": "redis", "REDIS_PORT": "6380"}, "redis:6380", ""},
		{map[string]string{"KVGATE_REDIS_ADDRESS": "redis:6379", "REDIS_HOST": "redis", "KVGATE_REDIS_PASSWORD": "a"},
			"redis:6379", "a"},
	}
	for _, tt := range tests {
		e := envOf(tt.env)
		cfg := LoadConfig(e)
		if e.Err() != nil || cfg.Redis.Address != tt.address || cfg.Redis.Password != tt.password {
			t.Errorf("%v: Redis at %q with password %q, %v; want %q and %q", tt.env, cfg.Redis.Address, cfg.Redis.Password,
				e.Err(), tt.address, tt.password)
		}
	}
	e := envOf(map[string]string{"KVGATE_REDIS_ADDRESS": "kv:1", "REDIS_HOST": "redis"})
	if LoadConfig(e); e.Err() == nil || !strings.Contains(e.Err().Error(), "name different Redis servers") {
		t.Errorf("two Redis servers named: %v", e.Err())
	}
}

func TestLoadConfigListsEveryProblem(t *testing.T) {
	e := envOf(map[string]string{
		"KVGATE_LISTEN_ADDRESS":                    "8080",
		"KVGATE_ROUTING_ALGORITHM":                 "fastest",
		"AIBRIX_VLLM_TOKENIZER_ENDPOINT_TEMPLATE":  "http://pods:8000",
		"AIBRIX_GPU_OPTIMIZER_TRACING_FLAG":        "true",
		"KVGATE_ROUTING_CPU_CACHE_WEIGHT":          "1.5",
		"KVGATE_ROUTING_MIN_FLEET_QUEUE":           "-1",
		"KVGATE_POD_DISCOVERY":                     "static",
		"KVGATE_STATIC_ENDPOINTS_FILE":             "/does/not/exist.yaml",
		"AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER": "false",
		"KVGATE_SHUTDOWN_DELAY":                    "-1",
		"KVGATE_ADMIN_LISTEN_ADDRESS":              "9090",
		"KVGATE_SLO_TTFT":                          "-2s",
		"KVGATE_SLO_MODELS":                        "llama=ttft:2s;llama=e2e:30s",
		"KVGATE_SLO_QUEUE_MAX_LENGTH":              "0",
		"KVGATE_SHARED_STATE_INTERVAL_MS":          "500",
		"KVGATE_SHARED_STATE_TTL_MS":               "500",
		"KVGATE_SHARED_STORED_RESPONSES":           "true",
		"KVGATE_STORED_RESPONSE_TTL_SECONDS":       "1.5s",
	})
	LoadConfig(e)
	err := e.Err()
	for _, want := range []string{"KVGATE_LISTEN_ADDRESS", `KVGATE_ROUTING_ALGORITHM="fastest"`,
		"AIBRIX_VLLM_TOKENIZER_ENDPOINT_TEMPLATE", "AIBRIX_GPU_OPTIMIZER_TRACING_FLAG is true but needs Redis",
		"KVGATE_ROUTING_CPU_CACHE_WEIGHT", `KVGATE_ROUTING_MIN_FLEET_QUEUE="-1"`, "/does/not/exist.yaml", "AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER is false",
		"KVGATE_SHUTDOWN_DELAY", `KVGATE_ADMIN_LISTEN_ADDRESS="9090"`, `KVGATE_SLO_TTFT="-2s"`,
		`KVGATE_SLO_MODELS: model "llama" named twice`, `KVGATE_SLO_QUEUE_MAX_LENGTH="0"`,
		"KVGATE_SHARED_STATE_TTL_MS (500ms) must exceed", "KVGATE_SHARED_STORED_RESPONSES is true but needs Redis",
		"KVGATE_STORED_RESPONSE_TTL_SECONDS (1.5s) must be a whole number of seconds"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %s", err, want)
		}
	}

	e = envOf(map[string]string{"KVGATE_POD_DISCOVERY": "static", "KVGATE_STATIC_ENDPOINTS_FILE": writeEndpoints(t, "endpoints: [{}]\n")})
	if LoadConfig(e); e.Err() == nil || !strings.Contains(e.Err().Error(), "model is empty") {
		t.Errorf("invalid endpoints file: %v", e.Err())
	}
	e = envOf(map[string]string{"KVGATE_ADMIN_LISTEN_ADDRESS": ":8080"})
	if LoadConfig(e); e.Err() == nil || !strings.Contains(e.Err().Error(), "address of their own") {
		t.Errorf("admin address equal to the listen address: %v", e.Err())
	}
	e = envOf(map[string]string{"KUBECONFIG": "/no/kubeconfig"})
	if LoadConfig(e); e.Err() == nil || !strings.Contains(e.Err().Error(), "/no/kubeconfig") {
		t.Errorf("missing kubeconfig: %v", e.Err())
	}
}

func TestTokenizerURLReplacesTheTemplatesPortWithThePodsServingPort(t *testing.T) {
	pod := func(ip, port string) *v1.Pod {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{}}, Status: v1.PodStatus{PodIP: ip}}
		if port != "" {
			p.Labels["model.aibrix.ai/port"] = port
		}
		return p
	}
	tests := []struct {
		template string
		pod      *v1.Pod
		want     string
	}{
		{"http://%s:8000", pod("10.0.0.5", ""), "http://10.0.0.5:8000"},
		{"http://%s:8000", pod("10.0.0.5", "8100"), "http://10.0.0.5:8100"},
		{"http://%s:8000/", pod("127.0.0.1", "31001"), "http://127.0.0.1:31001"},
		{"https://%s/vllm", pod("10.0.0.5", ""), "https://10.0.0.5:443/vllm"},
		{"http://%s", pod("fd00::5", "9000"), "http://[fd00::5]:9000"},
	}
	for _, tt := range tests {
		tmpl, err := parseTokenizerTemplate(tt.template)
		if err != nil {
			t.Fatalf("%s: %v", tt.template, err)
		}
		if got := tmpl.forPod(endpoint.Parse(tt.pod, endpoint.Options{})); got != tt.want {
			t.Errorf("%s for %s:%s = %s, want %s", tt.template, tt.pod.Status.PodIP, tt.pod.Labels["model.aibrix.ai/port"], got, tt.want)
		}
	}
	for _, bad := range []string{"http://pods:8000", "http://%s:%s", "ftp://%s:21", "http://%s:99999", "http://%s:8000?x=1", "http://a%s:8000"} {
		if _, err := parseTokenizerTemplate(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestAdapterOfTellsBaseModelsFromAdapters(t *testing.T) {
	pod := func(base string) *endpoint.Endpoint {
		return endpoint.Parse(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"model.aibrix.ai/name": base}}}, endpoint.Options{})
	}
	pods := []*endpoint.Endpoint{pod("llama"), pod("llama")}
	if got := adapterOf("llama", pods); got != "" {
		t.Errorf("adapterOf(base model) = %q, want \"\"", got)
	}
	if got := adapterOf("sql-lora", pods); got != "sql-lora" {
		t.Errorf("adapterOf(adapter) = %q, want sql-lora", got)
	}
}

func TestLoadConfigRefusesADeadPodTimeoutShorterThanTwoScrapes(t *testing.T) {
	for _, c := range []struct {
		env map[string]string
		ok  bool
	}{
		{nil, true},
		{map[string]string{"KVGATE_KV_EVENTS_DEAD_POD_TIMEOUT": "3s"}, true},
		{map[string]string{"KVGATE_KV_EVENTS_DEAD_POD_TIMEOUT": "2s"}, false},
		{map[string]string{"KVGATE_KV_EVENTS_DEAD_POD_TIMEOUT": "5", "AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "2000"}, false},
	} {
		e := envOf(c.env)
		cfg := LoadConfig(e)
		if err := e.Err(); c.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "KVGATE_KV_EVENTS_DEAD_POD_TIMEOUT")) {
			t.Errorf("%v: error %v, want ok %v", c.env, err, c.ok)
		}
		if c.env == nil && cfg.KVSync.DeadPodTimeout != 30*time.Second {
			t.Errorf("default dead-pod timeout %v, want 30s", cfg.KVSync.DeadPodTimeout)
		}
	}
}

func TestStreamsStartFromTheKVSyncSettings(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want time.Duration
	}{
		{nil, transport.DefaultReadInterval},
		{map[string]string{"KVGATE_KV_EVENTS_READ_INTERVAL": "20ms"}, 20 * time.Millisecond},
		{map[string]string{"KVGATE_KV_EVENTS_READ_INTERVAL": "0"}, 0},
	}
	for _, tt := range tests {
		e := envOf(tt.env)
		cfg := LoadConfig(e)
		if err := e.Err(); err != nil {
			t.Fatal(err)
		}
		c := streamClientConfig(cfg.KVSync)
		if c.ReadInterval != tt.want {
			t.Errorf("%v: streams read every %v, want %v", tt.env, c.ReadInterval, tt.want)
		}
		c.PodKey, c.PodIP = "default/vllm-0", "10.0.0.1"
		if err := transport.ValidateConfig(c); err != nil {
			t.Errorf("%v: %v", tt.env, err)
		}
	}
	// A zero value (a Config built in code) keeps the transport's default.
	if c := streamClientConfig(config.KVSync{}); c.ReadInterval != transport.DefaultReadInterval {
		t.Errorf("a zero read interval reads every %v, want the default %v", c.ReadInterval, transport.DefaultReadInterval)
	}
}

func TestLoadConfigRefusesRoutingNumbersThatCannotPriceARequest(t *testing.T) {
	tests := []struct{ name, value string }{
		{"KVGATE_ROUTING_TTFT_TIE_TOLERANCE", "NaN"},
		{"KVGATE_ROUTING_TTFT_TIE_TOLERANCE", "Inf"},
		{"KVGATE_ROUTING_CPU_CACHE_WEIGHT", "NaN"},
		{"KVGATE_ROUTING_DEFAULT_PREFILL_TOKENS_PER_SECOND", "NaN"},
		{"KVGATE_ROUTING_DEFAULT_PREFILL_TOKENS_PER_SECOND", "+Inf"},
		{"KVGATE_ROUTING_DEFAULT_PREFILL_TOKENS_PER_SECOND", "1e-320"},
		{"KVGATE_ROUTING_DEFAULT_PREFILL_TOKENS_PER_SECOND", "0.5"},
		{"KVGATE_ROUTING_MIN_FLEET_QUEUE", "NaN"},
		{"AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "+Inf"},
		{"AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "NaN"},
		{"KVGATE_TOKENIZER_VERIFY_FRACTION", "NaN"},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			e := envOf(map[string]string{tt.name: tt.value})
			LoadConfig(e)
			if err := e.Err(); err == nil || !strings.Contains(err.Error(), tt.name+`="`+tt.value+`"`) {
				t.Fatalf("LoadConfig: %v, want an error naming %s=%q", err, tt.name, tt.value)
			}
		})
	}
	e := envOf(map[string]string{"KVGATE_ROUTING_DEFAULT_PREFILL_TOKENS_PER_SECOND": "1"})
	if cfg := LoadConfig(e); e.Err() != nil || cfg.Routing.DefaultPrefillTokensPerSecond != 1 {
		t.Errorf("a prefill speed of 1 token a second: %v, %v", cfg.Routing.DefaultPrefillTokensPerSecond, e.Err())
	}
}

func TestLoadConfigHonoursAnExplicitZeroTieToleranceAndStdDevFactor(t *testing.T) {
	// Zero in routing.Config means the default; the operator's 0 is
	// carried as a negative value, which routing reads as zero.
	tests := []struct {
		name  string
		value func(routing.Config) float64
	}{
		{"KVGATE_ROUTING_TTFT_TIE_TOLERANCE", func(c routing.Config) float64 { return c.TieTolerance }},
		{"AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", func(c routing.Config) float64 { return c.StdDevFactor }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := envOf(map[string]string{tt.name: "0"})
			cfg := LoadConfig(e)
			if err := e.Err(); err != nil {
				t.Fatalf("%s=0 refused: %v", tt.name, err)
			}
			if v := tt.value(cfg.Routing); v >= 0 {
				t.Errorf("%s=0 gave routing %v, which stands for the default", tt.name, v)
			}
			if _, err := routing.New(cfg.Routing); err != nil {
				t.Errorf("routing.New: %v", err)
			}
		})
	}
}

func TestARequestTTLMustOutlastTheLongestRequest(t *testing.T) {
	// With the defaults a request is served for at most 5 s of
	// tokenization, 1 min in its SLO queue and 1 h of response.
	tests := []struct {
		name string
		env  map[string]string
		want []string // in the error; none when accepted
	}{
		{"the defaults", nil, nil},
		{"the former default of an hour", map[string]string{"KVGATE_REQUEST_TTL_SECONDS": "3600"},
			[]string{"KVGATE_REQUEST_TTL_SECONDS (1h0m0s) must exceed 1h1m5s", "AIBRIX_TOKENIZER_REQUEST_TIMEOUT (5s)",
				"KVGATE_SLO_QUEUE_MAX_WAIT (1m0s)", "KVGATE_UPSTREAM_RESPONSE_TIMEOUT (1h0m0s)"}},
		{"a TTL equal to the longest request", map[string]string{"KVGATE_REQUEST_TTL_SECONDS": "3665"},
			[]string{"KVGATE_REQUEST_TTL_SECONDS"}},
		{"a response timeout raised alone", map[string]string{"KVGATE_UPSTREAM_RESPONSE_TIMEOUT": "2h"},
			[]string{"KVGATE_REQUEST_TTL_SECONDS (1h1m40s) must exceed 2h1m5s"}},
		{"a response timeout and TTL raised together", map[string]string{"KVGATE_UPSTREAM_RESPONSE_TIMEOUT": "2h",
			"KVGATE_REQUEST_TTL_SECONDS": "2h2m"}, nil},
		{"without the remote tokenizer", map[string]string{"AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER": "false",
			"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false", "KVGATE_REQUEST_TTL_SECONDS": "3661"}, nil},
		{"a short response timeout and a shorter TTL", map[string]string{"KVGATE_UPSTREAM_RESPONSE_TIMEOUT": "30s",
			"KVGATE_UPSTREAM_FIRST_BYTE_TIMEOUT": "30s", "KVGATE_REQUEST_TTL_SECONDS": "1"},
			[]string{"KVGATE_REQUEST_TTL_SECONDS (1s) must exceed 1m35s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := envOf(tt.env)
			cfg := LoadConfig(e)
			err := e.Err()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("LoadConfig: %v", err)
				}
				return
			}
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("LoadConfig: %v, want an error mentioning %s", err, w)
				}
			}
			if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "KVGATE_REQUEST_TTL_SECONDS") {
				t.Errorf("New: %v, want the TTL refused", err)
			}
		})
	}
}

func TestLoadConfigReadsHowEnginesPassReasoning(t *testing.T) {
	for value, want := range map[string]string{
		"":                  tokenizer.ReasoningAuto,
		"auto":              tokenizer.ReasoningAuto,
		"reasoning":         tokenizer.ReasoningRecent,
		"reasoning_content": tokenizer.ReasoningEarlier,
		"engine":            tokenizer.ReasoningEngine,
	} {
		env := map[string]string{}
		if value != "" {
			env["KVGATE_TOKENIZER_REASONING"] = value
		}
		e := envOf(env)
		if cfg := LoadConfig(e); e.Err() != nil || cfg.Tokenizer.Reasoning != want {
			t.Errorf("KVGATE_TOKENIZER_REASONING=%q: %q, %v; want %q", value, cfg.Tokenizer.Reasoning, e.Err(), want)
		}
	}
	e := envOf(map[string]string{"KVGATE_TOKENIZER_REASONING": "think"})
	LoadConfig(e)
	if err := e.Err(); err == nil || !strings.Contains(err.Error(), `KVGATE_TOKENIZER_REASONING="think"`) {
		t.Errorf("KVGATE_TOKENIZER_REASONING=think: %v, want an error naming it", err)
	}
}

func TestLoadConfigReadsTheSLOQueuesFairness(t *testing.T) {
	for value, want := range map[string]string{
		"":            slo.FairnessDeadline,
		"deadline":    slo.FairnessDeadline,
		"round-robin": slo.FairnessRoundRobin,
	} {
		env := map[string]string{}
		if value != "" {
			env["KVGATE_SLO_QUEUE_FAIRNESS"] = value
		}
		e := envOf(env)
		if cfg := LoadConfig(e); e.Err() != nil || cfg.SLO.Fairness != want {
			t.Errorf("KVGATE_SLO_QUEUE_FAIRNESS=%q: %q, %v; want %q", value, cfg.SLO.Fairness, e.Err(), want)
		}
	}
	e := envOf(map[string]string{"KVGATE_SLO_QUEUE_FAIRNESS": "fair"})
	LoadConfig(e)
	if err := e.Err(); err == nil || !strings.Contains(err.Error(), `KVGATE_SLO_QUEUE_FAIRNESS="fair"`) ||
		!strings.Contains(err.Error(), "round-robin") {
		t.Errorf("KVGATE_SLO_QUEUE_FAIRNESS=fair: %v, want an error naming it and the policies", err)
	}
}
