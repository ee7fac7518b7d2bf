package cache

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

func TestModelListsAdaptersAreTheCardsWithAParent(t *testing.T) {
	golden, err := os.ReadFile("testdata/models/vllm_lora.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		body    string
		want    []string
		wantErr string
	}{
		{"vLLM with two adapters", string(golden), []string{"chat-lora", "sql-lora"}, ""},
		{"base model only", `{"object":"list","data":[{"id":"llama","parent":null}]}`, nil, ""},
		{"no models", `{"object":"list","data":[]}`, nil, ""},
		{"duplicates and nameless cards", `{"data":[{"id":"b","parent":"m"},{"id":"a","parent":"m"},{"id":"b","parent":"m"},` +
			`{"id":"","parent":"m"},{"id":"c","parent":""}]}`, []string{"a", "b"}, ""},
		{"no data", `{"object":"list"}`, nil, `no "data" list`},
		{"not JSON", `<html>404</html>`, nil, "decode model list"},
		{"wrong type", `{"data":{"id":"a"}}`, nil, "decode model list"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, got, err := cardsOfModelList([]byte(tt.body))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("adapters = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// modelServer is a vLLM engine's GET /v1/models on its own 127.0.0.1 port,
// listing a base model and the adapters loaded now.
type modelServer struct {
	srv  *httptest.Server
	port int
	// hits counts the requests for /v1/models, others those for any other
	// path, answered with 404.
	hits, others atomic.Int64

	mu       sync.Mutex
	adapters []string
	status   int
	// root and maxModelLen are those of the base model's card, left out
	// when empty or 0.
	root        string
	maxModelLen int
}

func newModelServer(t *testing.T, adapters ...string) *modelServer {
	t.Helper()
	m := &modelServer{adapters: adapters, status: http.StatusOK}
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			m.others.Add(1)
			http.NotFound(w, r)
			return
		}
		m.hits.Add(1)
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.status != http.StatusOK {
			http.Error(w, `{"error":"unavailable"}`, m.status)
			return
		}
		type card struct {
			ID          string  `json:"id"`
			Object      string  `json:"object"`
			Root        string  `json:"root,omitempty"`
			Parent      *string `json:"parent"`
			MaxModelLen int     `json:"max_model_len,omitempty"`
		}
		base := llama
		cards := []card{{ID: base, Object: "model", Root: m.root, MaxModelLen: m.maxModelLen}}
		for _, a := range m.adapters {
			cards = append(cards, card{ID: a, Object: "model", Root: "/adapters/" + a, Parent: &base})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": cards})
	}))
	t.Cleanup(m.srv.Close)
	_, port, _ := net.SplitHostPort(m.srv.Listener.Addr().String())
	m.port, _ = strconv.Atoi(port)
	return m
}

// setBase changes the root and max_model_len of the base model's card.
func (m *modelServer) setBase(root string, maxModelLen int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.root, m.maxModelLen = root, maxModelLen
}

// set changes what the engine answers: the adapters it lists, or an error
// status.
func (m *modelServer) set(status int, adapters ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.status, m.adapters = status, adapters
}

// adapterConfig lists adapters every 20 ms and scrapes no metrics.
func adapterConfig(reg prometheus.Registerer) Config {
	return Config{PodMetricRefreshInterval: -1, AdapterRefreshInterval: 20 * time.Millisecond,
		PodMetricScrapeTimeout: 300 * time.Millisecond, Registerer: reg}
}

// waitModels waits until the pod serves exactly want: its base model first,
// then its adapters.
func waitModels(t *testing.T, s *Store, pod string, want ...string) {
	t.Helper()
	testsupport.EventuallyWhy(t, "pod "+pod+" to serve "+strings.Join(want, ","), func() (string, bool) {
		got, err := s.ListModelsByPod(pkey("ns", pod))
		return "serves " + strings.Join(got, ","), err == nil && slices.Equal(got, want)
	})
}

func TestStoreMergesDeclaredSetAndListedAdapters(t *testing.T) {
	reg := prometheus.NewRegistry()
	engine := newModelServer(t, "sql-lora", "declared")
	s := newTestStore(t, adapterConfig(reg))
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(engine.port),
		withAnnotation(endpoint.LoraAdaptersAnnotation, "declared")))
	if err := s.SetPodAdapters(pkey("ns", "a"), []string{"set"}); err != nil {
		t.Fatal(err)
	}
	waitModels(t, s, "a", llama, "declared", "set", "sql-lora")
	if pods, err := s.ListPodsByModel("sql-lora"); err != nil || !slices.Equal(podNames(pods), []string{"ns/a"}) {
		t.Fatalf("pods of sql-lora = %v, %v", podNames(pods), err)
	}

	// An adapter loaded at runtime appears, one unloaded goes; the declared
	// and set ones stay whatever the engine lists.
	engine.set(http.StatusOK, "runtime-lora")
	waitModels(t, s, "a", llama, "declared", "set", "runtime-lora")
	if s.HasModel("sql-lora") {
		t.Fatal("sql-lora is still served after its only engine unloaded it")
	}

	// An engine that fails keeps the adapters it listed last.
	engine.set(http.StatusServiceUnavailable)
	testsupport.EventuallyWhy(t, "two failed listings of ns/a's models", func() (string, bool) {
		n := testsupport.MetricValue(t, reg, "kvgate_cache_pod_model_list_failures_total",
			map[string]string{"pod": "ns/a", "reason": readStatus})
		return "failures for status " + strconv.FormatFloat(n, 'g', -1, 64), n >= 2
	})
	if models, _ := s.ListModelsByPod(pkey("ns", "a")); !slices.Contains(models, "runtime-lora") {
		t.Fatalf("models while the engine fails = %v, want runtime-lora kept", models)
	}
	engine.set(http.StatusOK)
	waitModels(t, s, "a", llama, "declared", "set")

	// A pod replaced under the same name starts from what it declares and
	// its own engine lists.
	other := newModelServer(t, "other-lora")
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(other.port), withUID("new-uid")))
	waitModels(t, s, "a", llama, "other-lora")
	s.DeletePod(pkey("ns", "a"))
	testsupport.Eventually(t, "the deleted pod's listing failures to leave the metrics", func() bool {
		return testsupport.MetricSeries(t, reg, "kvgate_cache_pod_model_list_failures_total", map[string]string{"pod": "ns/a"}) == 0
	})
}

func TestAdaptersAreListedOnlyOnRoutablePods(t *testing.T) {
	engine := newModelServer(t, "sql-lora")
	s := newTestStore(t, adapterConfig(nil))
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(engine.port), notReady))
	s.AddOrUpdatePod(testPod("ns", "b", llama, "127.0.0.1", withPort(newModelServer(t).port)))
	waitModels(t, s, "b", llama)
	if n := engine.hits.Load(); n != 0 {
		t.Fatalf("the unready pod's models were listed %d times", n)
	}
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(engine.port)))
	waitModels(t, s, "a", llama, "sql-lora")

	// Unready again: the pod keeps its adapters (it has not unloaded them),
	// but is not routed to.
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(engine.port), notReady))
	pods, err := s.ListPodsByModel("sql-lora")
	if err != nil || len(pods) != 0 {
		t.Fatalf("pods of sql-lora with its pod unready = %v, %v; want none and no error", podNames(pods), err)
	}
}

func TestAdapterListingIsOffWhenDisabled(t *testing.T) {
	engine := newModelServer(t, "sql-lora")
	cfg := adapterConfig(nil)
	cfg.AdapterRefreshInterval = -1
	cfg.PodMetricRefreshInterval = 20 * time.Millisecond
	s := newTestStore(t, cfg)
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(engine.port)))
	// The engine answers /metrics with 404: after two scrapes, the loop
	// that would list the adapters has had its chance to run.
	testsupport.Eventually(t, "two scrapes of the engine", func() bool { return engine.others.Load() >= 2 })
	if n := engine.hits.Load(); n != 0 || s.HasModel("sql-lora") {
		t.Fatalf("models listed %d times with listing disabled", n)
	}
}

// newTestAdapterLoop returns the adapter loop the Store would run for the
// pod of engine m, recording what it publishes in published, for tests that
// look inside it.
func newTestAdapterLoop(m *modelServer, reg prometheus.Registerer, published *[]string) *adapterLoop {
	ep := epOf(testPod("ns", "a", llama, "127.0.0.1", withPort(m.port)))
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "model_list_failures_total"}, []string{"pod", "reason"})
	if reg != nil {
		reg.MustRegister(counter)
	}
	return &adapterLoop{
		key: ep.Key, id: ep.ID, model: ep.Model, state: newPodState(ep.ID),
		page:        newPageClient(ep.Address, modelsPath, "application/json", 10*time.Second, maxModelListBytes),
		interval:    time.Hour,
		maxAdapters: DefaultMaxAdaptersPerPod,
		publish: func(_ endpoint.Key, _ *podState, adapters []string) ([]string, bool) {
			prev := *published
			*published = adapters
			return prev, !slices.Equal(prev, adapters)
		},
		counter:  counter,
		dropped:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "adapters_dropped_total"}, []string{"pod"}),
		failures: failureLog{log: klog.Background(), pod: klog.KObj(ep.Pod), url: modelsURL(ep), what: "Listing the pod's models"},
	}
}

func TestAdapterListingReleasesTheBufferALargeListGrew(t *testing.T) {
	reg := prometheus.NewRegistry()
	engine := newModelServer(t, "sql-lora")
	var published []string
	l := newTestAdapterLoop(engine, reg, &published)
	l.refresh(t.Context())
	if !slices.Equal(published, []string{"sql-lora"}) || l.body.Cap() == 0 {
		t.Fatalf("adapters %q with a buffer of %d bytes kept; want sql-lora, and the buffer kept", published, l.body.Cap())
	}

	// 20000 cards of about 90 bytes: beyond the 1 MiB a listing may take.
	many := make([]string, 20000)
	for i := range many {
		many[i] = fmt.Sprintf("adapter-%05d", i)
	}
	engine.set(http.StatusOK, many...)
	l.refresh(t.Context())
	if n := testsupport.MetricValue(t, reg, "model_list_failures_total", map[string]string{"reason": readTooLarge}); n != 1 {
		t.Fatalf("too_large failures = %v, want 1", n)
	}
	if !slices.Equal(published, []string{"sql-lora"}) {
		t.Fatalf("adapters after a failed listing = %q, want sql-lora kept", published)
	}
	if l.body.Cap() > 1<<20 {
		t.Fatalf("after a listing beyond its bound the loop keeps a buffer of %d bytes, want at most 1 MiB", l.body.Cap())
	}
}

// adapterNames returns n adapter names from first on, in sorted order.
func adapterNames(first, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("adapter-%05d", first+i)
	}
	return names
}

func TestCapAdaptersKeepsTheAdaptersServedFirst(t *testing.T) {
	if got := capAdapters(adapterNames(0, 256), nil, 256); !slices.Equal(got, adapterNames(0, 256)) {
		t.Fatalf("256 adapters capped to %d", len(got))
	}
	got := capAdapters(adapterNames(0, 300), nil, 256)
	if !slices.Equal(got, adapterNames(0, 256)) {
		t.Fatalf("300 adapters, none served before: kept %d, %q first; want the first 256 in order", len(got), got[0])
	}
	// Adapters loaded since, sorting first, do not push out those served.
	listed := append([]string{"a-new-1", "a-new-2"}, adapterNames(0, 300)...)
	got = capAdapters(listed, adapterNames(0, 256), 256)
	if !slices.Equal(got, adapterNames(0, 256)) {
		t.Fatalf("with two adapters loaded: kept %d, %q first; want the 256 served before", len(got), got[0])
	}
	// One served unloaded: its place goes to the first not served.
	listed = slices.DeleteFunc(listed, func(a string) bool { return a == "adapter-00007" })
	got = capAdapters(listed, adapterNames(0, 256), 256)
	want := append([]string{"a-new-1"}, slices.DeleteFunc(adapterNames(0, 256), func(a string) bool { return a == "adapter-00007" })...)
	if !slices.Equal(got, want) {
		t.Fatalf("with one served unloaded: kept %d, %q first; want a-new-1 in its place", len(got), got[:2])
	}
}

func TestAdaptersPerPodFollowTheConfig(t *testing.T) {
	engine := newModelServer(t, "d", "c", "b", "a", "e")
	cfg := adapterConfig(nil)
	cfg.MaxAdaptersPerPod = 3
	s := newTestStore(t, cfg)
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(engine.port), withAnnotation(endpoint.LoraAdaptersAnnotation, "declared")))
	waitModels(t, s, "a", llama, "declared", "a", "b", "c")

	if _, err := New(Config{MaxAdaptersPerPod: -1}); err == nil || !strings.Contains(err.Error(), "MaxAdaptersPerPod") {
		t.Fatalf("New with a negative bound: %v, want an error naming MaxAdaptersPerPod", err)
	}
}

// The Store's default bound, as the documents give it.
func TestAdaptersBeyondThePodsBoundAreCountedAndLoggedOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs testsupport.LogLines
	engine := newModelServer(t, adapterNames(0, 300)...)
	cfg := adapterConfig(reg)
	cfg.Logger = funcr.New(logs.Add, funcr.Options{})
	s := newTestStore(t, cfg)
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(engine.port)))
	waitModels(t, s, "a", append([]string{llama}, adapterNames(0, 256)...)...)
	dropped := func() float64 {
		return testsupport.MetricValue(t, reg, "kvgate_cache_pod_adapters_dropped_total", map[string]string{"pod": "ns/a"})
	}
	testsupport.EventuallyWhy(t, "three listings of 44 adapters too many", func() (string, bool) {
		n := dropped()
		return "dropped " + strconv.FormatFloat(n, 'g', -1, 64), n >= 3*44
	})
	if s.HasModel("adapter-00299") {
		t.Fatal("an adapter beyond the bound is a model of the registry")
	}
	if logged := logs.Containing("more LoRA adapters than"); len(logged) != 1 ||
		!strings.Contains(logged[0], `"pod"={"name"="a" "namespace"="ns"}`) || !strings.Contains(logged[0], `"model"="`+llama+`"`) {
		t.Fatalf("logged %q, want one line naming the pod and its model", logged)
	}

	// An adapter loaded since does not push one the pod serves out.
	engine.set(http.StatusOK, append([]string{"a-new"}, adapterNames(0, 300)...)...)
	n0 := dropped()
	testsupport.Eventually(t, "two listings with a-new", func() bool { return dropped() >= n0+2*45 })
	waitModels(t, s, "a", append([]string{llama}, adapterNames(0, 256)...)...)

	s.DeletePod(pkey("ns", "a"))
	testsupport.Eventually(t, "the deleted pod's dropped adapters to leave the metrics", func() bool {
		return testsupport.MetricSeries(t, reg, "kvgate_cache_pod_adapters_dropped_total", map[string]string{"pod": "ns/a"}) == 0
	})
}

func TestNamesForLogListsAFewNamesClipped(t *testing.T) {
	if got := namesForLog([]string{"a", "b"}); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("two names logged as %q", got)
	}
	names := adapterNames(0, 300)
	names[0] = strings.Repeat("x", 1<<20)
	got := namesForLog(names)
	if len(got) != maxLoggedNames+1 || got[maxLoggedNames] != "and 284 more" || len(got[0]) > maxLoggedNameBytes+len("…") {
		t.Fatalf("300 names, the first of 1 MiB, logged as %d entries, the last %q, the first of %d bytes",
			len(got), got[len(got)-1], len(got[0]))
	}
}
