package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/config"
)

// testFleet is a gateway built as cmd/gateway builds it, from environment
// settings, discovering its engines through a static endpoints file.
type testFleet struct {
	t       testing.TB
	engines []*testEngine
	gw      *Gateway
	url     string
	// adminURL serves /metrics and /debug: url, or the admin listener.
	adminURL string
	file     string
	stop     func() error
}

// fleetOptions adjust a fleet before it starts.
type fleetOptions struct {
	// env overrides the fleet's environment.
	env map[string]string
	// configure adjusts the loaded Config.
	configure func(*Config)
	// notReady skips waiting for /readyz.
	notReady bool
	// declare lists, per engine name, the LoRA adapters its entry in the
	// endpoints file declares.
	declare map[string][]string
}

// startFleet starts the engines named names and a gateway in front of
// them, and waits until the gateway is ready and follows every engine's
// KV events.
func startFleet(t testing.TB, names []string, o fleetOptions) *testFleet {
	t.Helper()
	f := &testFleet{t: t}
	yaml := "endpoints:\n"
	for _, n := range names {
		e := newTestEngine(t, n)
		f.engines = append(f.engines, e)
		yaml += e.endpointYAML(o.declare[n])
	}
	f.file = writeEndpoints(t, yaml)
	f.start(o)
	return f
}

// replica starts another gateway, adjusted by o, in front of f's engines,
// as a load balancer's second gateway replica, and waits until it is
// ready. It shares nothing with f's gateway but what o configures.
func (f *testFleet) replica(o fleetOptions) *testFleet {
	f.t.Helper()
	r := &testFleet{t: f.t, engines: f.engines, file: f.file}
	r.start(o)
	return r
}

// start starts the fleet's gateway, discovering its engines from its
// endpoints file, and waits as startFleet does.
func (f *testFleet) start(o fleetOptions) {
	t := f.t
	t.Helper()
	env := map[string]string{
		"KVGATE_POD_DISCOVERY":                  "static",
		"KVGATE_STATIC_ENDPOINTS_FILE":          f.file,
		"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "20",
		"KVGATE_SHUTDOWN_TIMEOUT":               "10s",
	}
	for k, v := range o.env {
		env[k] = v
	}
	cfg := loadTestConfig(t, env)
	if o.configure != nil {
		o.configure(&cfg)
	}
	f.serve(cfg)
	if o.notReady {
		return
	}
	f.waitReady()
	if cfg.KVSync.Enabled {
		for _, e := range f.engines {
			f.waitFollowed("static/" + e.name)
		}
	}
}

// writeEndpoints writes a static endpoints file and returns its path.
func writeEndpoints(t testing.TB, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// loadTestConfig loads a Config from env, failing on any error. Unless env
// sets it, the shutdown delay is 0: a test has no load balancer to wait
// for.
func loadTestConfig(t testing.TB, env map[string]string) Config {
	t.Helper()
	e := config.NewEnv(func(name string) (string, bool) {
		v, ok := env[name]
		if !ok && name == config.ShutdownDelay.Name {
			return "0", true
		}
		return v, ok
	})
	cfg := LoadConfig(e)
	if err := e.Err(); err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	return cfg
}

// serveGateway builds a gateway from cfg and serves it on a loopback port
// until the test ends. stop ends it and returns Serve's result.
func serveGateway(t testing.TB, cfg Config) (*Gateway, string, func() error) {
	t.Helper()
	g, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Serve(ctx, ln) }()
	var result error
	stopped := false
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case result = <-done:
			case <-time.After(testsupport.WaitTimeout):
				t.Fatalf("Serve did not return within %v of its context ending", testsupport.WaitTimeout)
			}
		}
		return result
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return g, "http://" + ln.Addr().String(), stop
}

// engine returns the engine named name.
func (f *testFleet) engine(name string) *testEngine {
	for _, e := range f.engines {
		if e.name == name {
			return e
		}
	}
	f.t.Fatalf("no engine %s", name)
	return nil
}

// serve starts the gateway configured by cfg for the fleet.
func (f *testFleet) serve(cfg Config) {
	f.gw, f.url, f.stop = serveGateway(f.t, cfg)
	f.adminURL = f.url
	if cfg.AdminListenAddress != "" {
		f.adminURL = "http://" + cfg.AdminListenAddress
	}
}

func (f *testFleet) waitReady() {
	f.t.Helper()
	testsupport.EventuallyWhy(f.t, "the gateway to be ready", func() (string, bool) {
		status, body := get(f.t, f.url+"/readyz")
		return body, status == http.StatusOK
	})
}

// waitFollowed waits until the gateway's KV event client of pod (its
// namespace/name) is connected.
func (f *testFleet) waitFollowed(pod string) {
	f.t.Helper()
	testsupport.EventuallyWhy(f.t, "the KV events of "+pod+" to be followed", func() (string, bool) {
		v := f.kvcache()
		for _, m := range v.Models {
			for _, p := range m.Pods {
				if p.Pod == pod && len(p.Ranks) > 0 && p.Ranks[0].Client != nil && p.Ranks[0].Client.Connected {
					return "", true
				}
			}
		}
		return mustJSON(v), false
	})
}

// kvcache reads /debug/kvcache.
func (f *testFleet) kvcache() kvCacheView {
	f.t.Helper()
	var v kvCacheView
	status, body := get(f.t, f.adminURL+"/debug/kvcache")
	if status != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil {
		f.t.Fatalf("GET /debug/kvcache: %d %s", status, body)
	}
	return v
}

// match asks /debug/match about a prompt given as token ids.
func (f *testFleet) match(tokens []uint32) matchResponse {
	f.t.Helper()
	return f.matchAdapter("", tokens)
}

// matchAdapter asks /debug/match about a prompt given as token ids, for
// LoRA adapter lora of llama ("" for llama itself).
func (f *testFleet) matchAdapter(lora string, tokens []uint32) matchResponse {
	f.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "llama", "lora": lora, "tokens": tokens})
	resp, data := post(f.t, f.adminURL+"/debug/match", string(body), nil)
	var m matchResponse
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &m) != nil {
		f.t.Fatalf("POST /debug/match: %d %s", resp.StatusCode, data)
	}
	return m
}

// waitMatched waits until pod holds blocks leading blocks of tokens in the
// gateway's index.
func (f *testFleet) waitMatched(tokens []uint32, pod string, blocks int) {
	f.t.Helper()
	testsupport.EventuallyWhy(f.t, "the index to hold "+pod+"'s blocks", func() (string, bool) {
		m := f.match(tokens)
		for _, p := range m.Pods {
			if p.Pod == "static/"+pod {
				return mustJSON(m.Pods), p.MatchedBlocks == blocks
			}
		}
		return mustJSON(m.Pods), false
	})
}

// metric returns the value of the sample of /metrics whose line starts with
// prefix (a metric name with its labels), 0 when there is none. It fails
// the test when the gateway registers no such family, or the family has
// none of the labels named, so that a mistyped prefix cannot pass for 0.
func (f *testFleet) metric(prefix string) float64 {
	f.t.Helper()
	f.checkSeries(prefix)
	_, body := get(f.t, f.adminURL+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, prefix+" "); ok {
			var v float64
			if err := json.Unmarshal([]byte(rest), &v); err == nil {
				return v
			}
		}
	}
	return 0
}

// sampleLabel finds the label names of a sample prefix.
var sampleLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)

// checkSeries fails the test unless prefix names a family the gateway
// registers (a histogram's by its _sum, _count or _bucket series) and
// labels that family has.
func (f *testFleet) checkSeries(prefix string) {
	f.t.Helper()
	name, labels, _ := strings.Cut(prefix, "{")
	families := describeFamilies(f.t, f.gw.registry)
	fam, ok := families[name]
	for _, suffix := range []string{"_sum", "_count", "_bucket"} {
		if !ok {
			fam, ok = families[strings.TrimSuffix(name, suffix)]
		}
	}
	if !ok {
		f.t.Fatalf("the gateway registers no metric family for %s", prefix)
	}
	for _, m := range sampleLabel.FindAllStringSubmatch(labels, -1) {
		if m[1] != "le" && !slices.Contains(fam.labels, m[1]) {
			f.t.Fatalf("metric %s has no label %s (its labels: %v)", fam.name, m[1], fam.labels)
		}
	}
}

func get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// post sends body to url with headers and returns the response and its
// body.
func post(t testing.TB, url, body string, headers map[string]string) (*http.Response, []byte) {
	t.Helper()
	resp, data, err := tryPost(url, body, headers)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

// tryPost is post for goroutines other than the test's, which must not
// fail the test themselves.
func tryPost(url, body string, headers map[string]string) (*http.Response, []byte, error) {
	return trySend(http.MethodPost, url, body, headers)
}

// send sends a request of method without a body to url with headers, and
// returns the response and its body.
func send(t testing.TB, method, url string, headers map[string]string) (*http.Response, []byte) {
	t.Helper()
	resp, data, err := trySend(method, url, "", headers)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

// trySend sends a request of method to url with headers and, unless body
// is empty, the JSON body.
func trySend(method, url, body string, headers map[string]string) (*http.Response, []byte, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	if body != "" || method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: read body: %w", method, url, err)
	}
	return resp, data, nil
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// completion is a /v1/completions body for prompt.
func completion(prompt string, extra string) string {
	b, _ := json.Marshal(prompt)
	return `{"model":"llama","prompt":` + string(b) + extra + `}`
}
