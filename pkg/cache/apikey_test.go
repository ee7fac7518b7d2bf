package cache

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
)

// keyedEngine is a simulated vLLM serving llama and the adapter sql-lora
// that, as vLLM with --api-key, refuses /v1/models without its key, and
// the Authorization headers its paths received.
type keyedEngine struct {
	port int

	mu   sync.Mutex
	auth map[string][]string // by path
}

func startKeyedEngine(t *testing.T, key string) *keyedEngine {
	t.Helper()
	s, err := simserver.New(simserver.Config{Model: llama, LoRAModules: []simserver.LoRAModule{{Name: "sql-lora"}},
		APIKeys: []string{key}, Ranks: []simserver.Rank{{Engine: sim.EngineConfig{NumGPUBlocks: 256}}}})
	if err != nil {
		t.Fatal(err)
	}
	e := &keyedEngine{auth: map[string][]string{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.auth[r.URL.Path] = append(e.auth[r.URL.Path], r.Header.Get("Authorization"))
		e.mu.Unlock()
		s.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	e.port, _ = strconv.Atoi(u.Port())
	return e
}

// sent returns the Authorization headers path received.
func (e *keyedEngine) sent(path string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.auth[path]...)
}

func TestAdaptersOfAnEngineRequiringAKeyAreListedWithTheEngineAPIKey(t *testing.T) {
	const key = "engine-s3cret"
	engine := startKeyedEngine(t, key)
	cfg := adapterConfig(nil)
	cfg.PodMetricRefreshInterval = 20 * time.Millisecond
	cfg.EngineAPIKey = key
	s := newTestStore(t, cfg)
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(engine.port)))
	waitModels(t, s, "a", llama, "sql-lora")
	testsupport.Eventually(t, "a scrape of the pod's /metrics", func() bool { return len(engine.sent(metricsPath)) > 0 })
	for _, a := range engine.sent(modelsPath) {
		if a != "Bearer "+key {
			t.Fatalf("GET %s sent Authorization %q, want the engine's key", modelsPath, a)
		}
	}
	for _, a := range engine.sent(metricsPath) {
		if a != "" {
			t.Fatalf("GET %s, which vLLM serves without a key, sent Authorization %q", metricsPath, a)
		}
	}
}

func TestAdaptersOfAnEngineRequiringAKeyAreNotListedWithoutIt(t *testing.T) {
	engine := startKeyedEngine(t, "engine-s3cret")
	reg := prometheus.NewRegistry()
	s := newTestStore(t, adapterConfig(reg))
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(engine.port)))
	testsupport.EventuallyWhy(t, "a failed listing of ns/a's models", func() (string, bool) {
		n := testsupport.MetricValue(t, reg, "kvgate_cache_pod_model_list_failures_total",
			map[string]string{"pod": "ns/a", "reason": readStatus})
		return "failures for status " + strconv.FormatFloat(n, 'g', -1, 64), n >= 1
	})
	if s.HasModel("sql-lora") {
		t.Fatal("sql-lora is served though the engine refused to list it")
	}
}

func TestEngineAPIKeysThatAHeaderWouldAlterAreRefusedWithoutNamingThem(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"", true},
		{"sk-abc_123.XYZ~", true},
		{"two words", true},
		{"s3cret\r\nX-Injected: 1", false},
		{" s3cret", false},
		{"s3cret\t", false},
		{"s3cr\u00e9t", false},
		{"s3cret\x00", false},
	} {
		_, err := New(Config{EngineAPIKey: tc.key})
		if (err == nil) != tc.ok {
			t.Errorf("New with EngineAPIKey %q: error %v, want ok %v", tc.key, err, tc.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), "EngineAPIKey") || strings.Contains(err.Error(), "s3cr")) {
			t.Errorf("error %q: want it to name EngineAPIKey and not the key", err)
		}
	}
}
