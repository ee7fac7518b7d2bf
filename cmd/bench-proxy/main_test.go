package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/localfleet"
)

var binDir string

func TestMain(m *testing.M) {
	// The test binary runs the reference forwarders as bench-proxy does.
	if len(os.Args) > 1 && os.Args[1] == "forward" {
		os.Exit(runForwarder(os.Args[2:], os.Stderr))
	}
	os.Exit(testsupport.RunInTempDir(m, "kvgate-bench-proxy-bin-", func(dir string) error {
		binDir = dir
		return localfleet.Build(dir)
	}))
}

func TestConnReadsEveryFramingOnOneConnection(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/length":
			w.Header().Set("Server-Timing", "gateway;dur=0.5, read;dur=0.1")
			_, _ = w.Write([]byte(`{"ok":true}`))
		case "/chunked":
			w.Header().Set("Trailer", "Server-Timing")
			for _, e := range []string{"data: a\n\n", "data: [DONE]\n\n"} {
				_, _ = w.Write([]byte(e))
				w.(http.Flusher).Flush()
			}
			w.Header().Set("Server-Timing", "total;dur=2")
		case "/error":
			http.Error(w, "no", http.StatusTeapot)
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	c, err := dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	body := []byte(`{}`)
	var res response
	for _, tc := range []struct {
		path   string
		status int
		done   bool
		timing string
	}{
		{"/length", 200, false, "gateway;dur=0.5, read;dur=0.1,"},
		{"/chunked", 200, true, "total;dur=2,"},
		{"/error", 418, false, ""},
		{"/length", 200, false, "gateway;dur=0.5, read;dur=0.1,"},
	} {
		if err := c.do([][]byte{requestHead(addr, tc.path, len(body), ""), body}, &res, true); err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		if res.status != tc.status || res.done != tc.done || string(res.timing) != tc.timing {
			t.Errorf("%s: status %d done %v timing %q; want %d %v %q", tc.path, res.status, res.done, res.timing,
				tc.status, tc.done, tc.timing)
		}
	}
	timings := map[string][]time.Duration{}
	addTimings(timings, []byte("gateway;dur=0.5, read;dur=0.1,total;dur=2,"))
	if timings["gateway"][0] != 500*time.Microsecond || timings["total"][0] != 2*time.Millisecond || len(timings) != 3 {
		t.Errorf("addTimings = %v", timings)
	}
}

func TestParseStatReadsUserAndSystemTime(t *testing.T) {
	stat := []byte("4242 (nginx: worker (x)) S 1 4242 4242 0 -1 4194624 500 0 0 0 150 37 0 0 20 0 1 0 100 0 0")
	d, err := parseStat(stat)
	if err != nil || d != 187*clockTick {
		t.Fatalf("parseStat = %v, %v; want %v", d, err, 187*clockTick)
	}
	if parentOf(stat) != 1 {
		t.Errorf("parentOf = %d, want 1", parentOf(stat))
	}
	// The kernel counts CPU time in clock ticks: spin until this process
	// has used one.
	deadline := time.Now().Add(30 * time.Second)
	for {
		own, err := cpuTime(os.Getpid())
		if err != nil || own < 0 || (own == 0 && time.Now().After(deadline)) {
			t.Fatalf("cpuTime(self) = %v, %v", own, err)
		}
		if own > 0 {
			break
		}
		for i := 0; i < 1e6; i++ {
			spin += i
		}
	}
}

// spin keeps the loop above from being optimized away.
var spin int

func TestMediansAndAddedLatencyComeFromTheSameRound(t *testing.T) {
	var r results
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for i, d := range []time.Duration{ms(1), ms(3), ms(2)} {
		r.add(caseKey{wlCompletions, 1, targetDirect}, sample{requests: 10, elapsed: time.Second, latencies: []time.Duration{d}})
		r.add(caseKey{wlCompletions, 1, "nginx"}, sample{requests: 10 * (i + 1), elapsed: time.Second,
			latencies: []time.Duration{d + ms(i+1)}, targetCPU: ms(10)})
	}
	st := r.stats(caseKey{wlCompletions, 1, "nginx"})
	if st.rps != 20 || st.addedP50 != ms(2) || st.targetCPU != ms(10)/20 {
		t.Errorf("stats = %+v; want 20 req/s, 2 ms added, 0.5 ms CPU per request", st)
	}
}

// TestProxyConfigurationsAreValid renders the proxies' configurations and
// checks them with the proxies themselves where they are installed.
func TestProxyConfigurationsAreValid(t *testing.T) {
	for _, spec := range proxySpecs {
		t.Run(spec.name, func(t *testing.T) {
			bin := proxyBinary(spec)
			if bin == "" {
				t.Skipf("%s is not installed (hack/install-proxies.sh installs it)", spec.name)
			}
			engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte("data: [DONE]\n\n"))
			}))
			defer engine.Close()
			p, err := startProxy(context.Background(), spec, bin, filepath.Join("..", "..", "hack", "bench-proxy"), t.TempDir(),
				[]string{strings.TrimPrefix(engine.URL, "http://")}, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer p.stop()
			c, err := dial(p.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			var res response
			body := []byte(`{}`)
			for range 3 {
				if err := c.do([][]byte{requestHead(p.addr, "/v1/completions", len(body), ""), body}, &res, false); err != nil ||
					res.status != 200 || !res.done {
					t.Fatalf("through %s: %v, status %d, done %v", spec.name, err, res.status, res.done)
				}
			}
		})
	}
}

func TestBenchmarkReportsTheGatewayAgainstTheEngines(t *testing.T) {
	var out, errs bytes.Buffer
	args := []string{"-bin", binDir, "-rounds", "1", "-duration", "300ms", "-warmup", "100ms", "-concurrency", "2",
		"-stream-concurrency", "2", "-workloads", "completions,stream,kv-seen", "-prompt-words", "200", "-seen-prompts", "2",
		"-proxies", "none"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if code := runMain(ctx, args, &out, &errs); code != 0 {
		t.Fatalf("bench-proxy exited %d: %s", code, errs.String())
	}
	report := out.String()
	for _, want := range []string{"| 2 | direct |", "| 2 | gateway random |", "| 2 | gateway least-request |",
		"| 2 | gateway kv-aware |", "gateway ", "read ", "upstream ", "total "} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "errors, the first") {
		t.Errorf("requests failed:\n%s", report)
	}
	if !regexp.MustCompile(`(?m)^Tokenizer: the simulator's.*\nThe gateway tokenized 0 prompts in process and called the engines' /tokenize [1-9]\d* times\.$`).
		MatchString(report) {
		t.Errorf("the report does not say the engines tokenized every prompt:\n%s", report)
	}
}

// TestBenchmarkComparesTheGatewayWithABaselineBuild measures a second
// gateway, here the same build, beside the first, round after round.
func TestBenchmarkComparesTheGatewayWithABaselineBuild(t *testing.T) {
	var out, errs bytes.Buffer
	args := []string{"-bin", binDir, "-baseline", binDir, "-baseline-env", "KVGATE_ROUTING_MIN_FLEET_QUEUE=0.25",
		"-rounds", "2", "-duration", "200ms", "-warmup", "100ms", "-concurrency", "2", "-workloads", "completions", "-proxies", "none"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if code := runMain(ctx, args, &out, &errs); code != 0 {
		t.Fatalf("bench-proxy exited %d: %s", code, errs.String())
	}
	report := out.String()
	for _, want := range []string{"| 2 | gateway random |", "| 2 | baseline random |", "| 2 | baseline least-request |",
		"This build against the baseline",
		"Baseline: the gateway in " + binDir + " with KVGATE_ROUTING_MIN_FLEET_QUEUE=0.25, beside"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
	if !regexp.MustCompile(`(?m)^- completions, c=2, least-request: CPU/request \d+\.\d{3}x the baseline's \(rounds: \S+ \S+\), req/s \d`).
		MatchString(report) || strings.Contains(report, "errors, the first") {
		t.Errorf("no comparison of two rounds without errors:\n%s", report)
	}
}

func TestBaselineSettingsAloneRunThisBuildUnderThem(t *testing.T) {
	o, err := parseOptions(flag.NewFlagSet("bench-proxy", flag.ContinueOnError),
		[]string{"-baseline-env", "AIBRIX_KV_EVENT_SYNC_ENABLED=false", "-baseline-env", "A=b=c", "-gateway-env", "G=1"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.hasBaseline() || o.baseline != "" || !slices.Equal(o.gatewayEnv, []string{"G=1"}) {
		t.Errorf("options %+v: want a baseline of this build", o)
	}
	if got, want := o.baselineDescription(), "this build with AIBRIX_KV_EVENT_SYNC_ENABLED=false A=b=c"; got != want {
		t.Errorf("baseline %q, want %q", got, want)
	}
	for _, bad := range []string{"novalue", "=1"} {
		fs := flag.NewFlagSet("bench-proxy", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		if _, err := parseOptions(fs, []string{"-baseline-env", bad}); err == nil {
			t.Errorf("-baseline-env %q accepted", bad)
		}
	}
	if o, err := parseOptions(flag.NewFlagSet("bench-proxy", flag.ContinueOnError), nil); err != nil || o.hasBaseline() {
		t.Errorf("no flags: baseline %v, %v", o.hasBaseline(), err)
	}
}

func TestTheBaselineComparisonPairsEachRoundsRuns(t *testing.T) {
	var r results
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// Round 2 is slower for both builds: paired, the gateway costs 0.8 of
	// the baseline in each round, which medians taken apart would hide.
	for i, cpu := range []time.Duration{ms(8), ms(16), ms(9)} {
		base := []time.Duration{ms(10), ms(20), ms(11)}[i]
		r.add(caseKey{wlCompletions, 1, gatewayTarget("random")}, sample{requests: 10, elapsed: time.Second, targetCPU: cpu})
		r.add(caseKey{wlCompletions, 1, baselineTarget("random")}, sample{requests: 10, elapsed: time.Second, targetCPU: base})
	}
	var out bytes.Buffer
	printBaseline(&out, &r, []workload{{name: wlCompletions, concurrency: []int{1},
		targets: []string{gatewayTarget("random"), baselineTarget("random")}}})
	if want := "- completions, c=1, random: CPU/request 0.800x the baseline's (rounds: 0.800 0.800 0.818), req/s 1.000x"; !strings.Contains(out.String(), want) {
		t.Errorf("printBaseline wrote\n%s\nwant the line %q", out.String(), want)
	}
}

func TestTheGoalsPairEachRoundsRuns(t *testing.T) {
	var r results
	// Round 2 runs on a busier machine, where both cost twice as much and
	// serve half as many requests, and round 3's gateway run meets a burst
	// of other work. Paired, the gateway costs 1.6 times nginx's CPU per
	// request in two rounds of three; the medians taken apart would say
	// 32/12 = 2.67.
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	for i := range 3 {
		n := []int{1000, 500, 1000}[i]
		r.add(caseKey{wlCompletions, 16, "nginx"}, sample{requests: n, elapsed: time.Second, targetCPU: us([]int{10, 20, 12}[i] * n)})
		r.add(caseKey{wlCompletions, 16, gatewayTarget("random")}, sample{requests: n * 4 / 5, elapsed: time.Second,
			targetCPU: us([]int{16, 32, 40}[i] * n * 4 / 5)})
	}
	var out bytes.Buffer
	printGoals(&out, &r, []workload{{name: wlCompletions, concurrency: []int{16}}}, map[string]bool{"nginx": true})
	want := "- completions, c=16, random: CPU/request 1.60x nginx's (goal ≤ 1.5x; rounds: 1.600 1.600 3.333), " +
		"req/s 0.80x nginx's (goal ≥ 1x; rounds: 0.800 0.800 0.800)"
	if !strings.Contains(out.String(), want) {
		t.Errorf("printGoals wrote\n%s\nwant the line %q", out.String(), want)
	}
}

func TestEveryOtherRoundRunsTheBaselineFirst(t *testing.T) {
	targets := []string{targetDirect, "gateway random", "baseline random", "gateway kv-aware", "baseline kv-aware"}
	if got := roundOrder(targets, 1); !slices.Equal(got, targets) {
		t.Errorf("round 1: %q, want %q", got, targets)
	}
	want := []string{targetDirect, "baseline random", "gateway random", "baseline kv-aware", "gateway kv-aware"}
	if got := roundOrder(targets, 2); !slices.Equal(got, want) || targets[1] != "gateway random" {
		t.Errorf("round 2: %q, want %q, the targets unchanged", got, want)
	}
}

func TestABaselineFollowsEachOfTheGatewaysTargets(t *testing.T) {
	wls, err := workloads(workloadOptions{model: "m", concurrency: []int{1}, streamConc: []int{1}, streamTokens: 1, longWords: 1,
		seenPrompts: 1, proxies: []string{"nginx"}, baseline: true}, []string{wlCompletions, wlKVSeen})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{targetDirect, "nginx", "gateway random", "baseline random", "gateway least-request", "baseline least-request"},
		{targetDirect, "gateway least-request", "baseline least-request", "gateway kv-aware", "baseline kv-aware"},
	}
	for i, wl := range wls {
		if !slices.Equal(wl.targets, want[i]) {
			t.Errorf("%s: targets %q, want %q", wl.name, wl.targets, want[i])
		}
	}
}

// TestBenchmarkTokenizesInTheGatewayWithTheModelsFiles runs kv-aware on new
// prompts with Qwen3's tokenizer files: the engines tokenize with them, and
// the gateway, once they agreed, in process.
func TestBenchmarkTokenizesInTheGatewayWithTheModelsFiles(t *testing.T) {
	dir := filepath.Join(testsupport.TokenizerModels(t), "qwen3")
	var out, errs bytes.Buffer
	// The warm-up leaves the gateway time to check the files against the
	// engines' /tokenize before it uses them.
	args := []string{"-bin", binDir, "-rounds", "1", "-duration", "300ms", "-warmup", "1s", "-concurrency", "2",
		"-workloads", "kv-new", "-prompt-words", "200", "-proxies", "none", "-tokenizer", dir}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if code := runMain(ctx, args, &out, &errs); code != 0 {
		t.Fatalf("bench-proxy exited %d: %s", code, errs.String())
	}
	report := out.String()
	if !strings.Contains(report, "| 2 | gateway kv-aware |") || strings.Contains(report, "errors, the first") {
		t.Errorf("no run of kv-aware without errors:\n%s", report)
	}
	if !regexp.MustCompile(`(?m)^Tokenizer: the files in .*qwen3, .*\nThe gateway tokenized [1-9]\d* prompts in process`).
		MatchString(report) {
		t.Errorf("the report does not say the gateway tokenized prompts in process:\n%s", report)
	}
}

func TestFlagsAreChecked(t *testing.T) {
	for _, args := range [][]string{{"-concurrency", "0"}, {"-rounds", "0"}, {"-workloads", "nope", "-bin", binDir}} {
		var out, errs bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		code := runMain(ctx, args, &out, &errs)
		cancel()
		if code == 0 {
			t.Errorf("%v: exit 0, want an error", args)
		}
	}
}
