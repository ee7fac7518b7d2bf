package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/localfleet"
)

// waitTimeout is how long the tests wait for processes: far beyond what a
// loaded two-core machine needs.
const waitTimeout = 60 * time.Second

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds cmd/gateway and cmd/vllm-sim once and returns the
// directory holding them.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "kvgate-bin-"); buildErr != nil {
			return
		}
		buildErr = localfleet.Build(binDir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// process is a command started by a test, stopped when the test ends.
type process struct {
	cmd    *exec.Cmd
	output *syncBuffer
	done   chan struct{}
	err    error
}

// syncBuffer is a bytes.Buffer safe for the command's writers and the
// test's readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func start(t *testing.T, env []string, name string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(name, args...), output: &syncBuffer{}, done: make(chan struct{})}
	// Without a shutdown delay, unless a test sets one: the processes
	// stop at once when a test ends.
	p.cmd.Env = append(append(os.Environ(), "KVGATE_SHUTDOWN_DELAY=0"), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.output, p.output
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(waitTimeout):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// exited waits for the process to exit and returns its exit code.
func (p *process) exited(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(waitTimeout):
		t.Fatalf("%s did not exit within %v; output:\n%s", p.cmd.Path, waitTimeout, p.output)
	}
	return p.cmd.ProcessState.ExitCode()
}

// completion posts a completion, with the routing strategy when one is
// given, and returns the status, the pod that served it and the body.
func completion(t *testing.T, url, body string, strategy ...string) (int, string, string) {
	t.Helper()
	var header []string
	if len(strategy) > 0 {
		header = []string{"routing-strategy", strategy[0]}
	}
	return postJSON(t, url+"/v1/completions", body, header...)
}

// startSims starts n vllm-sim engines serving model sim and publishing KV
// events, engine i on ports[3i:3i+3] (HTTP, PUB, replay) with the extra
// arguments extra(i), and writes a static endpoints file listing them. It
// returns the file and the engines' URLs.
func startSims(t *testing.T, dir string, ports []int, n int, extra func(i int) []string) (string, []string) {
	t.Helper()
	var endpoints strings.Builder
	endpoints.WriteString("endpoints:\n")
	var urls []string
	for i := range n {
		http, pub, replay := ports[3*i], ports[3*i+1], ports[3*i+2]
		urls = append(urls, fmt.Sprintf("http://127.0.0.1:%d", http))
		events := fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":"tcp://[::ffff:127.0.0.1]:%d","replay_endpoint":"tcp://127.0.0.1:%d"}`, pub, replay)
		args := []string{"--host", "127.0.0.1", "--port", fmt.Sprint(http), "--model", "sim", "--kv-events-config", events,
			"--step-overhead", "1ms"}
		start(t, nil, filepath.Join(dir, "vllm-sim"), append(args, extra(i)...)...)
		fmt.Fprintf(&endpoints, "- {name: vllm-%d, address: 127.0.0.1, model: sim, port: %d, pubPort: %d, replayPort: %d}\n",
			i, http, pub, replay)
	}
	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(file, []byte(endpoints.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return file, urls
}

// waitFollowed waits until the gateway at url follows n engines' KV events.
func waitFollowed(t *testing.T, gw *process, url string, n int) {
	t.Helper()
	waitFor(t, gw, fmt.Sprintf("%d engines' KV events to be followed", n), func() bool {
		resp, err := http.Get(url + "/debug/kvcache")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return strings.Count(string(data), `"connected":true`) == n
	})
}

// words returns "w0 w1 ... w<n-1>", a prompt of many blocks.
func words(n int) []string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("w%d", i)
	}
	return w
}

func TestBinaryRoutesToTwoSimulatedEnginesInStaticMode(t *testing.T) {
	dir := binaries(t)
	ports := testsupport.FreePorts(t, 7)
	file, _ := startSims(t, dir, ports, 2, func(int) []string { return nil })
	addr := fmt.Sprintf("127.0.0.1:%d", ports[6])
	url := "http://" + addr
	gw := start(t, []string{"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS=20", "KVGATE_POD_DISCOVERY=kubernetes"},
		filepath.Join(dir, "gateway"), "--discovery", "static", "--static-endpoints-file", file, "--listen-address", addr)

	waitFor(t, gw, "the gateway to be ready", func() bool {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// Both engines' KV events are followed before the first request.
	waitFollowed(t, gw, url, 2)

	prompt, _ := json.Marshal(strings.Join(words(400), " "))
	body := `{"model":"sim","prompt":` + string(prompt) + `,"max_tokens":4}`
	status, first, data := completion(t, url, body)
	if status != http.StatusOK || first == "" {
		t.Fatalf("first completion: %d from %q: %s", status, first, data)
	}
	// Once the index holds the prompt's blocks on that engine (its KV
	// events arrive on their own path, not with the response), kv-aware
	// sends the prompt there at once: the engine's last scrape may still
	// count the first request as waiting, but the gateway knows it ended.
	waitFor(t, gw, "the index to hold the prompt on "+first, func() bool {
		resp, err := http.Post(url+"/debug/match", "application/json", strings.NewReader(`{"model":"sim","prompt":`+string(prompt)+`}`))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var m struct {
			Decisions []struct {
				Algorithm  string
				Candidates []struct {
					Pod           string
					MatchedBlocks int
				}
			} `json:"decisions"`
		}
		if json.NewDecoder(resp.Body).Decode(&m) != nil {
			return false
		}
		for _, d := range m.Decisions {
			for _, c := range d.Candidates {
				if d.Algorithm == "kv-aware" && c.Pod == first && c.MatchedBlocks > 0 {
					return true
				}
			}
		}
		return false
	})
	if status, pod, data := completion(t, url, body); status != http.StatusOK || pod != first {
		t.Fatalf("repeated prompt: %d from %q, want %s: %s", status, pod, first, data)
	}
	// prefix-cache reads the gateway's own request counts, never a scrape:
	// the prompt goes to its holder every time.
	for range 3 {
		if status, pod, data := completion(t, url, body, "prefix-cache"); status != http.StatusOK || pod != first {
			t.Fatalf("repeated prompt with prefix-cache: %d from %q, want %s: %s", status, pod, first, data)
		}
	}
	// The engines report the cached tokens they found: the four repeats
	// found the cache the gateway counted on.
	cached := map[string]float64{}
	for _, name := range []string{"predicted", "found", "reported"} {
		cached[name] = metricOf(t, url, "kvgate_routing_cached_tokens_"+name+"_total")
	}
	if p, f := cached["predicted"], cached["found"]; p < 4*256 || f < 0.9*p || f > p || cached["reported"] < f {
		t.Errorf("cached tokens predicted, found, reported = %v; want at least 4 x 256 predicted, nearly all found", cached)
	}
	status, _, data = completion(t, url, `{"model":"sim","prompt":"hi","max_tokens":3,"stream":true}`)
	if status != http.StatusOK || strings.Count(data, "data: ") != 4 || strings.Contains(data, `"usage"`) ||
		!strings.HasSuffix(data, "data: [DONE]\n\n") {
		t.Errorf("stream: %d %q; want three tokens and [DONE], without the usage chunk", status, data)
	}

	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := gw.exited(t); code != 0 {
		t.Fatalf("gateway exited with %d after SIGTERM; output:\n%s", code, gw.output)
	}
	if out := gw.output.String(); !strings.Contains(out, "Running without Redis") || !strings.Contains(out, "Gateway stopped") {
		t.Errorf("gateway log lacks the Redis notice or the stop:\n%s", out)
	}
}

func TestBinaryExitsNonZeroWhenTheBindEndpointIsInUse(t *testing.T) {
	dir := binaries(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(file, []byte("endpoints: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	endpoint := "tcp://" + ln.Addr().String()
	gw := start(t, nil, filepath.Join(dir, "gateway"), "--discovery", "static", "--static-endpoints-file", file,
		"--listen-address", "127.0.0.1:0", "--kv-events-bind-endpoint", endpoint)
	if code := gw.exited(t); code != 1 || !strings.Contains(gw.output.String(), endpoint) {
		t.Errorf("exit %d, want 1 with an error naming %s; output:\n%s", code, endpoint, gw.output)
	}
}

// waitFor polls cond until it holds, failing when p exits or after
// waitTimeout.
func waitFor(t *testing.T, p *process, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		select {
		case <-p.done:
			t.Fatalf("%s exited while waiting for %s: %v; output:\n%s", p.cmd.Path, what, p.err, p.output)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; output:\n%s", what, p.output)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// postJSON posts body to url with the header's name and value pairs and
// returns the status, the pod that served the request and the response
// body.
func postJSON(t *testing.T, url, body string, header ...string) (int, string, string) {
	t.Helper()
	status, pod, data, err := tryPost(url, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return status, pod, data
}

// tryPost is postJSON returning the error of a request that got no answer.
func tryPost(url, body string, header ...string) (int, string, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("target-pod-name"), string(data), nil
}

// adapterMatch returns, per pod serving adapter lora of model sim ("" for
// sim itself), the blocks of the chat prompt's prefix the gateway's index
// credits it with.
func adapterMatch(t *testing.T, url, lora, messages string) map[string]int {
	t.Helper()
	status, _, body := postJSON(t, url+"/debug/match", `{"model":"sim","lora":"`+lora+`","messages":`+messages+`}`)
	var m struct {
		TokenSource string `json:"tokenSource"`
		Pods        []struct {
			Pod           string `json:"pod"`
			MatchedBlocks int    `json:"matchedBlocks"`
		} `json:"pods"`
	}
	if status != http.StatusOK || json.Unmarshal([]byte(body), &m) != nil || m.TokenSource != "tokenizer" {
		t.Fatalf("/debug/match for %q: %d %s", lora, status, body)
	}
	out := map[string]int{}
	for _, p := range m.Pods {
		out[p.Pod] = p.MatchedBlocks
	}
	return out
}

func TestBinaryRoutesAdapterRequestsByTheAdaptersBlocks(t *testing.T) {
	dir := binaries(t)
	ports := testsupport.FreePorts(t, 8)
	// The endpoints file declares no adapter: the gateway learns them from
	// the engines' /v1/models.
	file, sims := startSims(t, dir, ports, 2, func(i int) []string {
		if i == 0 {
			return []string{"--lora-modules", "sql-lora=/adapters/sql"}
		}
		return []string{"--allow-runtime-lora-updating"}
	})
	// The admin endpoints (/debug, /metrics) have a listener of their own.
	url, admin := fmt.Sprintf("http://127.0.0.1:%d", ports[6]), fmt.Sprintf("http://127.0.0.1:%d", ports[7])
	gw := start(t, []string{"KVGATE_ADAPTER_REFRESH_INTERVAL=100ms"}, filepath.Join(dir, "gateway"), "--discovery", "static",
		"--static-endpoints-file", file, "--listen-address", url[len("http://"):], "--admin-listen-address", admin[len("http://"):])
	waitFor(t, gw, "sql-lora to be served by vllm-0 alone", func() bool {
		status, _, body, err := tryPost(admin+"/debug/match", `{"model":"sim","lora":"sql-lora","tokens":[1]}`)
		return err == nil && status == http.StatusOK && strings.Contains(body, `"pod":"static/vllm-0"`) && !strings.Contains(body, "vllm-1")
	})
	waitFollowed(t, gw, admin, 2)
	if status, _, _ := postJSON(t, url+"/debug/match", `{"model":"sim","tokens":[1]}`); status != http.StatusNotFound {
		t.Fatalf("/debug/match on the API listener: %d, want 404 with an admin listener", status)
	}

	// A chat request for the adapter goes to the only engine serving it,
	// which indexes the prompt's blocks under the adapter: they match
	// requests for the adapter, not for the base model.
	text := words(300)
	messages, _ := json.Marshal([]map[string]string{{"role": "user", "content": strings.Join(text, " ")}})
	chat := `{"model":"sql-lora","max_tokens":2,"messages":` + string(messages) + `}`
	if status, pod, body := postJSON(t, url+"/v1/chat/completions", chat); status != http.StatusOK || pod != "static/vllm-0" {
		t.Fatalf("adapter chat: %d from %q: %s", status, pod, body)
	}
	waitFor(t, gw, "the adapter's blocks to be indexed", func() bool {
		return adapterMatch(t, admin, "sql-lora", string(messages))["static/vllm-0"] > 10
	})
	if base := adapterMatch(t, admin, "", string(messages)); base["static/vllm-0"] != 0 {
		t.Fatalf("the adapter's blocks match a request for the base model: %v", base)
	}

	// vllm-1 loads the adapter at runtime and computes another prompt with
	// it: the gateway learns the adapter, and a request for it with that
	// prompt goes to vllm-1.
	if status, _, body := postJSON(t, sims[1]+"/v1/load_lora_adapter", `{"lora_name":"sql-lora","lora_path":"/adapters/sql"}`); status != http.StatusOK {
		t.Fatalf("load the adapter on vllm-1: %d %s", status, body)
	}
	other, _ := json.Marshal([]map[string]string{{"role": "user", "content": strings.Join(text[100:], " ") + " more"}})
	otherChat := `{"model":"sql-lora","max_tokens":2,"messages":` + string(other) + `}`
	if status, _, body := postJSON(t, sims[1]+"/v1/chat/completions", otherChat); status != http.StatusOK {
		t.Fatalf("adapter chat sent to vllm-1: %d %s", status, body)
	}
	waitFor(t, gw, "vllm-1's adapter blocks to be indexed", func() bool {
		m := adapterMatch(t, admin, "sql-lora", string(other))
		return m["static/vllm-1"] > 10 && m["static/vllm-0"] == 0
	})
	for range 3 {
		if status, pod, body := postJSON(t, url+"/v1/chat/completions", otherChat, "routing-strategy", "prefix-cache"); status != http.StatusOK || pod != "static/vllm-1" {
			t.Fatalf("adapter chat whose prompt vllm-1 holds: %d from %q: %s", status, pod, body)
		}
	}
	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := gw.exited(t); code != 0 {
		t.Fatalf("gateway exited with %d after SIGTERM; output:\n%s", code, gw.output)
	}
}

func TestBinaryServesEnvoysExternalProcessorInsteadOfTheProxy(t *testing.T) {
	dir := binaries(t)
	ports := testsupport.FreePorts(t, 5)
	file, urls := startSims(t, dir, ports, 1, func(int) []string { return nil })
	addr, extAddr := fmt.Sprintf("127.0.0.1:%d", ports[3]), fmt.Sprintf("127.0.0.1:%d", ports[4])
	url := "http://" + addr
	gw := start(t, []string{"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS=20", "KVGATE_EXTPROC_TLS=false"},
		filepath.Join(dir, "gateway"), "--discovery", "static", "--static-endpoints-file", file, "--listen-address", addr,
		"--extproc-listen-address", extAddr, "--proxy-enabled=false")
	conn, err := grpc.NewClient(extAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	waitFor(t, gw, "the external processor to be ready", func() bool {
		resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	if status, _, _ := completion(t, url, `{"model":"sim","prompt":"hi"}`); status != http.StatusNotFound {
		t.Errorf("the HTTP proxy answered %d with --proxy-enabled=false, want 404", status)
	}

	// Envoy's messages in BUFFERED mode: the headers, answered at once,
	// then the whole body, answered with the endpoint.
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	headers := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")}}}
	var answer *extprocv3.ProcessingResponse
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headers}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: []byte(`{"model":"sim","prompt":"pick a pod","max_tokens":2}`), EndOfStream: true}}},
	} {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
		if answer, err = stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	picked := ""
	for _, h := range answer.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "x-gateway-destination-endpoint" {
			picked = string(h.GetHeader().GetRawValue())
		}
	}
	if "http://"+picked != urls[0] {
		t.Errorf("picked %q, want the engine at %s", picked, urls[0])
	}
	_ = stream.CloseSend()

	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := gw.exited(t); code != 0 {
		t.Fatalf("gateway exited with %d after SIGTERM; output:\n%s", code, gw.output)
	}
}

// metricOf returns the value of the unlabelled metric name on the /metrics
// page of the gateway at url.
func metricOf(t *testing.T, url, name string) float64 {
	t.Helper()
	families, err := localfleet.Metrics(context.Background(), http.DefaultClient, url)
	if err != nil {
		t.Fatal(err)
	}
	if families[name] == nil {
		t.Fatalf("%s/metrics has no %s", url, name)
	}
	return localfleet.Sum(families, name)
}
