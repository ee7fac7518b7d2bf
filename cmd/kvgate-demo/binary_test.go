package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/localfleet"
)

// waitTimeout bounds what the tests wait for: far beyond what a loaded
// two-core machine needs.
const waitTimeout = 3 * time.Minute

var binDir string

func TestMain(m *testing.M) {
	os.Exit(testsupport.RunInTempDir(m, "kvgate-demo-bin-", func(dir string) error {
		binDir = dir
		return localfleet.Build(dir, "github.com/kvgate/kvgate/cmd/kvgate-demo")
	}))
}

// shortRun shapes a demo of a few seconds per algorithm on two engines
// whose caches hold about two of the four system prompts each.
var shortRun = []string{
	"-engines", "2", "-users", "6", "-duration", "4s", "-interval", "1s",
	"-system-prompts", "4", "-system-tokens", "1024", "-turns", "3",
	"-min-user-tokens", "50", "-max-user-tokens", "150", "-min-answer-tokens", "4", "-max-answer-tokens", "12",
	"-think-time", "200ms", "-engine-blocks", "200",
	"-prefill-time-per-token", "60us", "-decode-time-per-token", "200us", "-step-overhead", "2ms",
}

// demoProcess is a kvgate-demo run by a test, its output going to a file.
type demoProcess struct {
	cmd     *exec.Cmd
	outPath string
	done    chan struct{}
}

func startDemo(t *testing.T, args ...string) *demoProcess {
	t.Helper()
	out, err := os.Create(filepath.Join(t.TempDir(), "demo.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	d := &demoProcess{cmd: exec.Command(filepath.Join(binDir, "kvgate-demo"), args...), outPath: out.Name(), done: make(chan struct{})}
	d.cmd.Stdout, d.cmd.Stderr = out, out
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	})
	return d
}

// output returns what the demo printed so far.
func (d *demoProcess) output() string {
	data, _ := os.ReadFile(d.outPath)
	return string(data)
}

// exitCode waits for the demo to exit and returns its exit code.
func (d *demoProcess) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-d.done:
		return d.cmd.ProcessState.ExitCode()
	case <-time.After(waitTimeout):
		t.Fatalf("kvgate-demo did not exit within %v; output:\n%s", waitTimeout, d.output())
		return 0
	}
}

// waitOutput waits until the demo's output matches re.
func (d *demoProcess) waitOutput(t *testing.T, re *regexp.Regexp) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !re.MatchString(d.output()) {
		select {
		case <-d.done:
			t.Fatalf("kvgate-demo exited before printing %q; output:\n%s", re, d.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvgate-demo did not print %q within %v; output:\n%s", re, waitTimeout, d.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var (
	processesLine = regexp.MustCompile(`Processes \(group (\d+)\): (.+); logs in (\S+)`)
	liveLine      = regexp.MustCompile(`(?m)^kv-aware\s+\d+s\s+[\d.]+ req/s\s+\d+ done`)
	foundLine     = regexp.MustCompile(`decisions: kv-aware: [^\n]*\n\s+predicted cache hits the engines found: ([\d.]+)`)
	processPID    = regexp.MustCompile(`(\S+) (\d+)`)
)

// checkNothingLeft asserts that no process the demo started runs and its
// temporary directory is gone: two engines and the gateway.
func checkNothingLeft(t *testing.T, out string) {
	t.Helper()
	checkNoneLeft(t, out, 3, false)
}

// checkNoneLeft asserts that none of the n processes the demo started
// runs and, unless it was given (kept), its directory is gone.
func checkNoneLeft(t *testing.T, out string, n int, kept bool) {
	t.Helper()
	m := processesLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the output names no processes; output:\n%s", out)
	}
	pgid, _ := strconv.Atoi(m[1])
	if err := syscall.Kill(-pgid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process group %d still has processes (kill: %v)", pgid, err)
	}
	pids := processPID.FindAllStringSubmatch(m[2], -1)
	if len(pids) != n {
		t.Errorf("processes %q, want %d", m[2], n)
	}
	for _, p := range pids {
		pid, _ := strconv.Atoi(p[2])
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) still runs (kill: %v)", p[1], pid, err)
		}
	}
	if _, err := os.Stat(m[3]); !kept && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary directory %s is left (%v)", m[3], err)
	}
}

// hitRatio returns the hit ratio of alg's row in the comparison table.
func hitRatio(t *testing.T, table, alg string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(alg) + `\s+\d+\s+[\d.]+\s+([\d.]+)\s`).FindStringSubmatch(table)
	if m == nil {
		t.Fatalf("no row for %s in the comparison:\n%s", alg, table)
	}
	r, _ := strconv.ParseFloat(m[1], 64)
	return r
}

func TestDemoComparesTheAlgorithmsAndLeavesNothing(t *testing.T) {
	d := startDemo(t, shortRun...)
	code := d.exitCode(t)
	out := d.output()
	if code != exitOK {
		t.Fatalf("exit %d, want 0; output:\n%s", code, out)
	}
	if !liveLine.MatchString(out) || !strings.Contains(out, "pods:  vllm-0") || !strings.Contains(out, "decisions: kv-aware: prefix_hit") {
		t.Errorf("no live summary with pods and decisions; output:\n%s", out)
	}
	// The engines report the cached tokens they found: most of the hits
	// kv-aware counts on are there, by the run's last summary. The first
	// second's can exceed 1: a follow-up turn routed at once on the turns
	// before it is predicted to hit less than the engine finds.
	if ms := foundLine.FindAllStringSubmatch(out, -1); ms == nil {
		t.Errorf("no live summary of the predicted cache hits the engines found; output:\n%s", out)
	} else if f, _ := strconv.ParseFloat(ms[len(ms)-1][1], 64); f < 0.5 || f > 1.2 {
		t.Errorf("the engines found %v of the predicted cache hits, want most; output:\n%s", f, out)
	}
	_, table, ok := strings.Cut(out, "== comparison")
	if !ok {
		t.Fatalf("no comparison table; output:\n%s", out)
	}
	kv, random := hitRatio(t, table, "kv-aware"), hitRatio(t, table, "random")
	hitRatio(t, table, "least-request")
	if kv <= random {
		t.Errorf("kv-aware's hit ratio %.2f is not above random's %.2f; output:\n%s", kv, random, out)
	}
	// The gateway's time, every part of it, from its Server-Timing header
	// and trailer.
	_, timing, _ := strings.Cut(table, "The gateway's time per request")
	for _, line := range strings.Split(timing, "\n") {
		if fields := strings.Fields(line); len(fields) > 0 && fields[0] == "kv-aware" {
			if len(fields) != 1+3*len(timingParts) || strings.Contains(line, " - ") {
				t.Errorf("kv-aware's timing row %q, want p50 / p99 of each of %v", line, timingParts)
			}
			checkNothingLeft(t, out)
			return
		}
	}
	t.Errorf("no timing row for kv-aware; output:\n%s", out)
	checkNothingLeft(t, out)
}

func TestDemoStopsEverythingOnCtrlC(t *testing.T) {
	d := startDemo(t, append(append([]string{}, shortRun...), "-duration", "2m")...)
	d.waitOutput(t, liveLine)
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	code := d.exitCode(t)
	out := d.output()
	if code != exitInterrupted || !strings.Contains(out, "Interrupted: stopping the engines and the gateway.") ||
		!strings.Contains(out, "Stopped the engines and the gateway") {
		t.Fatalf("exit %d after SIGINT, want %d having said it stopped everything; output:\n%s", code, exitInterrupted, out)
	}
	checkNothingLeft(t, out)
}

func TestDemoExitsClearlyWhenTheGatewayAddressIsInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := startDemo(t, append(append([]string{}, shortRun...), "-gateway-address", ln.Addr().String())...)
	code := d.exitCode(t)
	out := d.output()
	if code != exitFailed || !strings.Contains(out, "gateway address "+ln.Addr().String()+" is not free") {
		t.Fatalf("exit %d, want %d naming the address in use; output:\n%s", code, exitFailed, out)
	}
}

// TestDemoWithARealTokenizerTokenizesInProcess runs the demo with Qwen3's
// tokenizer files: the gateway verifies them against the engines and
// tokenizes in process, and kv-aware still finds the cached prefixes.
func TestDemoWithARealTokenizerTokenizesInProcess(t *testing.T) {
	dir := filepath.Join(testsupport.TokenizerModels(t), "qwen3")
	work := t.TempDir()
	d := startDemo(t, append(append([]string{}, shortRun...), "-algorithms", "kv-aware,random", "-tokenizer", dir, "-work-dir", work)...)
	code := d.exitCode(t)
	out := d.output()
	if code != exitOK {
		t.Fatalf("exit %d, want 0; output:\n%s", code, out)
	}
	if !strings.Contains(out, "Tokenizer: the model's own files in "+dir) {
		t.Errorf("the setup does not name the tokenizer files; output:\n%s", out)
	}
	_, table, ok := strings.Cut(out, "== comparison")
	if !ok {
		t.Fatalf("no comparison table; output:\n%s", out)
	}
	if kv, random := hitRatio(t, table, "kv-aware"), hitRatio(t, table, "random"); kv <= random {
		t.Errorf("kv-aware's hit ratio %.2f is not above random's %.2f; output:\n%s", kv, random, out)
	}
	log, err := os.ReadFile(filepath.Join(work, "gateway.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, form := range []string{"chat", "completion"} {
		if !regexp.MustCompile(`Tokenizing in process.*form="` + form + `"`).Match(log) {
			t.Errorf("the gateway did not tokenize the %s form in process; its log:\n%s", form, log)
		}
	}
}

func TestDemoOverloadReportsWhatTheSLOAwareAlgorithmRefuses(t *testing.T) {
	// No engine returns a first token within a millisecond: kv-aware,
	// which does not read the objective, serves every request and meets
	// it for none; slo-least-load-pulling refuses every request (429), and
	// its users give up their conversations without failing the run.
	args := append(slices.Clone(shortRun), "-overload", "-slo-ttft", "1ms", "-users", "6", "-think-time", "200ms")
	d := startDemo(t, args...)
	code := d.exitCode(t)
	out := d.output()
	if code != exitOK {
		t.Fatalf("exit %d, want 0; output:\n%s", code, out)
	}
	if !strings.Contains(out, "SLO (TTFT 1ms): ") || !strings.Contains(out, "queued in the gateway") {
		t.Errorf("no live SLO summary; output:\n%s", out)
	}
	_, table, ok := strings.Cut(out, "== comparison")
	if !ok {
		t.Fatalf("no comparison table; output:\n%s", out)
	}
	kv := regexp.MustCompile(`(?m)^kv-aware\s+[1-9]\d*\s.*\s0\s+0\s+0%\s+0\.0$`)
	slo := regexp.MustCompile(`(?m)^slo-least-load-pulling\s+0\s.*\s0\s+[1-9]\d*\s+0%\s+0\.0$`)
	if !kv.MatchString(table) || !slo.MatchString(table) {
		t.Errorf("want kv-aware serving every request, none within 1 ms, and slo-least-load-pulling refusing every one:\n%s", table)
	}
	checkNothingLeft(t, out)
}

func TestDemoSpreadsRequestsOverReplicasSharingStateThroughRedis(t *testing.T) {
	work := t.TempDir()
	d := startDemo(t, append(append([]string{}, shortRun...), "-algorithms", "kv-aware,random", "-gateways", "2",
		"-work-dir", work)...)
	code := d.exitCode(t)
	out := d.output()
	if code != exitOK {
		t.Fatalf("exit %d, want 0; output:\n%s", code, out)
	}
	if !strings.Contains(out, "2 gateway replicas sharing state through Redis, requests spread over them") ||
		!regexp.MustCompile(`gateway-1 \d+, redis-server \d+`).MatchString(out) {
		t.Errorf("the setup does not name both replicas and Redis; output:\n%s", out)
	}
	_, table, ok := strings.Cut(out, "== comparison")
	if !ok {
		t.Fatalf("no comparison table; output:\n%s", out)
	}
	if kv, random := hitRatio(t, table, "kv-aware"), hitRatio(t, table, "random"); kv <= random {
		t.Errorf("kv-aware's hit ratio %.2f is not above random's %.2f; output:\n%s", kv, random, out)
	}
	for _, name := range []string{"gateway.log", "gateway-1.log"} {
		log, err := os.ReadFile(filepath.Join(work, name))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(log, []byte("through Redis failed")) {
			t.Errorf("%s: sharing through Redis failed:\n%s", name, log)
		}
	}
	checkNoneLeft(t, out, 5, true)
}
