// Command bench-proxy measures what kvgate's gateway costs per request as a
// reverse proxy, beside the engines reached directly and beside nginx and
// haproxy in front of the same engines, where they are installed
// (hack/install-proxies.sh installs Debian's packages; their configurations
// are in hack/bench-proxy/).
//
// It starts two vllm-sim engines that answer at once (every simulated
// latency 0) and the gateway in front of them (package localfleet), and the
// proxies found. Then, for each workload and number of concurrent clients,
// it runs closed-loop clients on keep-alive connections through each
// target in turn, one after the other within a round, for several rounds,
// and reports the medians over the rounds: requests per second, latency
// percentiles, the latency added to going directly, and the CPU time per
// request of the target's processes and of the engines, read from
// /proc/<pid>/stat. The comparisons with the gateway's goals (and with a
// baseline build) divide each round's two runs, seconds apart, and report
// the median of those ratios and each round's: a machine busier in one
// round than the next moves both runs of the round alike.
// The load generator is lean (prepared requests, no allocation per
// request) but shares the machine: compare targets within one report, not
// across machines.
//
// make bench-proxy builds the binaries, installs the proxies and runs it;
// bench-proxy -help lists the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/pkg/localfleet"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "forward" {
		os.Exit(runForwarder(os.Args[2:], os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are bench-proxy's flags.
type options struct {
	binDir, configDir, out string
	// profileDir, when set, receives a CPU profile of the gateway per run
	// through it, taken in the first round.
	profileDir             string
	rounds                 int
	warmup, duration       time.Duration
	concurrency            []int
	streamConcurrency      []int
	streamTokens           int
	longWords, seenPrompts int
	workloads              []string
	proxies                []string
	// gatewayEnv is added to the gateway's environment.
	gatewayEnv []string
	// baseline, when set, is a directory holding another build's gateway
	// binary, measured beside this one (see baselineTarget).
	baseline string
	// baselineEnv is added to the baseline gateway's environment only; set
	// without baseline, the baseline is this build under it.
	baselineEnv []string
	// tokenizer, when set, is the directory of a model's tokenizer files,
	// which the engines and the gateway tokenize with (see
	// localfleet.Config.Tokenizer).
	tokenizer string
}

func parseOptions(fs *flag.FlagSet, args []string) (options, error) {
	var o options
	fs.StringVar(&o.binDir, "bin", "bin", "directory holding the gateway and vllm-sim binaries")
	fs.StringVar(&o.configDir, "configs", "hack/bench-proxy", "directory of the proxies' configuration templates")
	fs.StringVar(&o.out, "out", "", "file to write the report to as well, in Markdown")
	fs.StringVar(&o.profileDir, "profile", "", "directory to write a CPU profile of the gateway to for each run through it, "+
		"in the first round (profiling costs the gateway CPU: that round's numbers are not comparable)")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds; every number reported is the median over the rounds")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "load before each measurement, not measured")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "measured time of each run")
	conc := fs.String("concurrency", "1,16,64", "numbers of concurrent clients")
	streamConc := fs.String("stream-concurrency", "16", "numbers of concurrent clients of the stream workload")
	fs.IntVar(&o.streamTokens, "stream-tokens", 32, "tokens of each streamed response")
	fs.IntVar(&o.longWords, "prompt-words", 2000, "length of the kv-aware workloads' prompts, in words")
	fs.IntVar(&o.seenPrompts, "seen-prompts", 8, "distinct prompts of the kv-seen workload")
	wls := fs.String("workloads", strings.Join([]string{wlCompletions, wlStream, wlKVSeen, wlKVNew}, ","),
		"workloads: completions (short prompts, random and least-request), stream, kv-seen (kv-aware on prompts seen "+
			"before), kv-new (kv-aware on a new prompt each time)")
	proxies := fs.String("proxies", "nginx,haproxy,go-raw,go-nethttp", "reverse proxies to compare with, where installed: "+
		"nginx, haproxy, and the Go reference forwarders go-raw (without net/http) and go-nethttp (net/http's server)")
	fs.StringVar(&o.baseline, "baseline", "", "directory holding another build's gateway binary (e.g. the previous "+
		"commit's bin/): a second gateway runs it on the same engines, measured next to this one in every round (first "+
		"every other round) and compared with it")
	fs.StringVar(&o.tokenizer, "tokenizer", "", "directory of a model's Hugging Face tokenizer files (tokenizer.json): the "+
		"engines tokenize with them and the gateway in process (make tokenizers installs Qwen3's, Llama 3's and Llama 2's "+
		"under hack/tokenizers/models); empty: the simulator's tokenizer, which the gateway asks the engines for")
	fs.Func("gateway-env", "NAME=value added to the gateway's environment (the baseline's too); repeat for more",
		envSetting(&o.gatewayEnv))
	fs.Func("baseline-env", "NAME=value added to the baseline gateway's environment only; repeat for more; without "+
		"-baseline, the baseline is this build run with these settings, to measure what a setting costs",
		envSetting(&o.baselineEnv))
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.concurrency, err = parseInts(*conc); err != nil {
		return o, fmt.Errorf("-concurrency: %w", err)
	}
	if o.streamConcurrency, err = parseInts(*streamConc); err != nil {
		return o, fmt.Errorf("-stream-concurrency: %w", err)
	}
	if o.rounds < 1 || o.duration <= 0 || o.streamTokens < 1 || o.longWords < 1 || o.seenPrompts < 1 {
		return o, errors.New("-rounds, -duration, -stream-tokens, -prompt-words and -seen-prompts must be positive")
	}
	o.workloads = splitList(*wls)
	for _, w := range o.workloads {
		if !slices.Contains([]string{wlCompletions, wlStream, wlKVSeen, wlKVNew}, w) {
			return o, fmt.Errorf("-workloads: unknown workload %q", w)
		}
	}
	o.proxies = splitList(*proxies)
	return o, nil
}

// envSetting returns a flag's function that appends a NAME=value setting
// to env.
func envSetting(env *[]string) func(string) error {
	return func(s string) error {
		if name, _, ok := strings.Cut(s, "="); !ok || name == "" {
			return errors.New("want NAME=value")
		}
		*env = append(*env, s)
		return nil
	}
}

// hasBaseline reports whether a second gateway runs beside the first.
func (o options) hasBaseline() bool { return o.baseline != "" || len(o.baselineEnv) > 0 }

// baselineDescription says what the baseline gateway runs, for the report.
func (o options) baselineDescription() string {
	what := "this build"
	if o.baseline != "" {
		what = "the gateway in " + o.baseline
	}
	if len(o.baselineEnv) > 0 {
		what += " with " + strings.Join(o.baselineEnv, " ")
	}
	return what
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench-proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o, err := parseOptions(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench-proxy:", err)
		return 2
	}
	if err := bench(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "bench-proxy:", err)
		return 1
	}
	return 0
}

// engineArgs make the engines answer at once, so that what is measured is
// the path in front of them.
var engineArgs = []string{"-step-overhead", "0", "-prefill-time-per-token", "0", "-decode-time-per-token", "0",
	"-num-gpu-blocks", "16384", "-max-num-seqs", "512"}

func bench(ctx context.Context, o options, stdout, stderr io.Writer) error {
	cfg := localfleet.Config{
		BinDir: o.binDir, Engines: 2, EngineArgs: engineArgs, AdminAddress: "127.0.0.1:0",
		GatewayEnv: append([]string{"KVGATE_SHUTDOWN_TIMEOUT=5s"}, o.gatewayEnv...), Tokenizer: o.tokenizer,
	}
	if o.hasBaseline() {
		cfg.Gateways, cfg.GatewayReplicaEnv = 2, [][]string{nil, o.baselineEnv}
		if o.baseline != "" {
			cfg.GatewayBinaries = []string{"", filepath.Join(o.baseline, "gateway")}
		}
	}
	fleet, err := localfleet.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer fleet.Close()
	var upstreams []string
	var enginePIDs []int
	for _, e := range fleet.Engines() {
		upstreams = append(upstreams, strings.TrimPrefix(e.URL, "http://"))
		enginePIDs = append(enginePIDs, e.PID)
	}
	targets := map[string]target{targetDirect: {name: targetDirect, addrs: upstreams}}
	gateways, urls, admins := fleet.Gateways(), fleet.GatewayURLs(), fleet.AdminURLs()
	for i, name := range []func(string) string{gatewayTarget, baselineTarget}[:len(gateways)] {
		for _, alg := range []string{"random", "least-request", "kv-aware"} {
			targets[name(alg)] = target{name: name(alg), addrs: []string{strings.TrimPrefix(urls[i], "http://")},
				pids: []int{gateways[i].PID}, header: "routing-strategy: " + alg + "\r\n", gateway: true, adminURL: admins[i]}
		}
	}
	hasProxy := map[string]bool{}
	var found []string
	var versions []string
	for _, spec := range proxySpecs {
		if !slices.Contains(o.proxies, spec.name) {
			continue
		}
		bin := proxyBinary(spec)
		if bin == "" {
			fmt.Fprintf(stderr, "bench-proxy: %s is %v (hack/install-proxies.sh installs it): left out\n", spec.name, errNoProxy)
			continue
		}
		p, err := startProxy(ctx, spec, bin, o.configDir, fleet.Dir(), upstreams, runtime.NumCPU())
		if err != nil {
			return fmt.Errorf("start %s: %w", spec.name, err)
		}
		defer p.stop()
		targets[spec.name] = target{name: spec.name, addrs: []string{p.addr}, pids: p.pids}
		hasProxy[spec.name] = true
		found = append(found, spec.name)
		if spec.self {
			versions = append(versions, spec.name+" ("+runtime.Version()+")")
		} else {
			versions = append(versions, version(bin, spec.name))
		}
	}
	wls, err := workloads(workloadOptions{model: fleet.Model(), concurrency: o.concurrency, streamConc: o.streamConcurrency,
		streamTokens: o.streamTokens, longWords: o.longWords, seenPrompts: o.seenPrompts, proxies: found,
		baseline: o.hasBaseline()}, o.workloads)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "bench-proxy: %d CPUs; engines %v, gateway %d; %s\n", runtime.NumCPU(), enginePIDs, fleet.Gateway().PID,
		strings.Join(versions, ", "))
	var res results
	ro := runOptions{warmup: o.warmup, duration: o.duration, enginePIDs: enginePIDs}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return err
		}
	}
	for round := 1; round <= o.rounds; round++ {
		for _, wl := range wls {
			for _, c := range wl.concurrency {
				for _, name := range roundOrder(wl.targets, round) {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					if err := fleet.Err(); err != nil {
						return err
					}
					ro.profile = ""
					if o.profileDir != "" && round == 1 && targets[name].gateway {
						ro.profile = filepath.Join(o.profileDir, fmt.Sprintf("%s-c%d-%s.pprof", wl.name, c,
							strings.ReplaceAll(name, " ", "-")))
						ro.profileURL = targets[name].adminURL + "/debug/pprof/profile"
					}
					s := run(ctx, targets[name], wl, c, ro)
					res.add(caseKey{wl.name, c, name}, s)
					fmt.Fprintf(stderr, "round %d/%d %-12s c=%-3d %-22s %8.0f req/s  %d errors\n", round, o.rounds, wl.name, c, name,
						float64(s.requests)/s.elapsed.Seconds(), s.errors)
					if s.errors > 0 {
						fmt.Fprintf(stderr, "  the first error: %v\n", s.firstErr)
					}
				}
			}
		}
	}
	var report strings.Builder
	fmt.Fprintf(&report, "Two vllm-sim engines answering at once; %d rounds of %v per run after %v of warm-up, medians; "+
		"%d CPUs shared by the engines, the proxy measured and the load generator; %s.\n",
		o.rounds, o.duration, o.warmup, runtime.NumCPU(), strings.Join(append([]string{"kvgate gateway"}, versions...), ", "))
	if o.hasBaseline() {
		fmt.Fprintf(&report, "Baseline: %s, beside this build's gateway on the same engines.\n", o.baselineDescription())
	}
	if o.tokenizer != "" {
		fmt.Fprintf(&report, "Tokenizer: the files in %s, in the engines and in the gateway's process.\n", o.tokenizer)
	} else {
		fmt.Fprintf(&report, "Tokenizer: the simulator's, in the engines; the gateway asks their /tokenize.\n")
	}
	local, remote, err := tokenizations(ctx, fleet.AdminURL())
	if err != nil {
		return err
	}
	if local+remote > 0 {
		fmt.Fprintf(&report, "The gateway tokenized %.0f prompts in process and called the engines' /tokenize %.0f times.\n",
			local, remote)
	}
	printReport(&report, &res, wls, hasProxy)
	fmt.Fprint(stdout, report.String())
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(report.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// roundOrder returns the order of a round's runs: the targets', but every
// other round with the baseline's runs before the gateway's, so that
// neither build always runs on the machine the other left.
func roundOrder(targets []string, round int) []string {
	if round%2 == 1 {
		return targets
	}
	out := slices.Clone(targets)
	for i := 0; i+1 < len(out); i++ {
		if alg, ok := strings.CutPrefix(out[i], gatewayTarget("")); ok && out[i+1] == baselineTarget(alg) {
			out[i], out[i+1] = out[i+1], out[i]
			i++
		}
	}
	return out
}

// version returns the first line a proxy prints of its version.
func version(bin, name string) string {
	out, _ := exec.Command(bin, "-v").CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if line == "" {
		return name
	}
	return line
}

// tokenizations returns how many prompts the gateway whose metrics are at
// adminURL tokenized in process, and how many times it called the
// engines' /tokenize.
func tokenizations(ctx context.Context, adminURL string) (local, remote float64, err error) {
	families, err := localfleet.Metrics(ctx, http.DefaultClient, adminURL)
	if err != nil {
		return 0, 0, err
	}
	return localfleet.Sum(families, "kvgate_tokenizer_local_tokenizations_total"),
		localfleet.Sum(families, "kvgate_tokenizer_calls_total"), nil
}
