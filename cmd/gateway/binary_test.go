package main

import (
	"bytes"
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
		cmd := exec.Command("go", "build", "-o", binDir+string(filepath.Separator), ".", "../vllm-sim")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
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
	p.cmd.Env = append(os.Environ(), env...)
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

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// completion posts a completion, with the routing strategy when one is
// given, and returns the status, the pod that served it and the body.
func completion(t *testing.T, url, body string, strategy ...string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if len(strategy) > 0 {
		req.Header.Set("routing-strategy", strategy[0])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("target-pod-name"), string(data)
}

func TestBinaryRoutesToTwoSimulatedEnginesInStaticMode(t *testing.T) {
	dir := binaries(t)
	ports := freePorts(t, 7)
	var endpoints strings.Builder
	endpoints.WriteString("endpoints:\n")
	for i := range 2 {
		http, pub, replay := ports[3*i], ports[3*i+1], ports[3*i+2]
		events := fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":"tcp://[::ffff:127.0.0.1]:%d","replay_endpoint":"tcp://127.0.0.1:%d"}`, pub, replay)
		start(t, nil, filepath.Join(dir, "vllm-sim"), "--host", "127.0.0.1", "--port", fmt.Sprint(http),
			"--model", "sim", "--kv-events-config", events, "--step-overhead", "1ms")
		fmt.Fprintf(&endpoints, "- name: vllm-%d\n  address: 127.0.0.1\n  model: sim\n  port: %d\n  pubPort: %d\n  replayPort: %d\n",
			i, http, pub, replay)
	}
	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(file, []byte(endpoints.String()), 0o644); err != nil {
		t.Fatal(err)
	}
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
	waitFor(t, gw, "both engines' KV events to be followed", func() bool {
		resp, err := http.Get(url + "/debug/kvcache")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return strings.Count(string(data), `"connected":true`) == 2
	})

	words := make([]string, 400)
	for i := range words {
		words[i] = fmt.Sprintf("w%d", i)
	}
	prompt, _ := json.Marshal(strings.Join(words, " "))
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
