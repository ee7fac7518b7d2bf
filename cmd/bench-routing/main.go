// Command bench-routing measures how well routing policies use the KV
// caches of a fleet of simulated vLLM engines: it replays workloads in
// virtual time through the real routing algorithms, prefix index and KV
// event codec (package routingbench), prints a table per workload, and
// writes the table, CSV, JSON and a PNG plot of each to an output
// directory.
//
// With -overload it runs the overload scenario instead: each workload's
// arrival rate stepped from half to three times the fleet's capacity within
// an SLO, for each seed of -seeds, comparing kv-aware with the SLO-aware
// algorithms on goodput, SLO attainment, time to first token and the
// requests queued and refused (routingbench.RunOverload), and it ends with
// the targets each seed met.
//
// Usage:
//
//	bench-routing [flags]
//
// Run with -h for the flags. The same flags and seed give the same
// numbers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/redisstate"
	"github.com/kvgate/kvgate/pkg/routingbench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "bench-routing:", err)
		}
		os.Exit(2)
	}
}

// Names of the workloads -workload selects.
const (
	workloadMooncake     = "mooncake"
	workloadSharedPrefix = "shared-prefix"
)

// options are the command's flags.
type options struct {
	workloads string
	trace     string
	policies  string
	out       string
	bench     routingbench.Config
	shared    routingbench.SharedPrefixConfig

	overload bool
	loads    string
	slo      string
	seeds    string
	requests int
	capacity float64
}

// overloadSLOs are the objectives of the overload scenario by workload,
// unless -slo sets one: Mooncake's prompts run from a few tokens to
// 190,000, so its objective grows with the prompt (2 s plus four times
// what an uncached prompt takes to prefill at 10,000 tokens per second);
// the shared-prefix chats are mostly cached, 2 s flat.
var overloadSLOs = map[string]string{
	workloadMooncake:     "ttft:2s,ttft-per-token:400us",
	workloadSharedPrefix: "ttft:2s",
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{bench: routingbench.Config{Engine: routingbench.DefaultEngine}}
	fs := flag.NewFlagSet("bench-routing", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.workloads, "workload", workloadMooncake+","+workloadSharedPrefix, "comma-separated workloads: "+workloadMooncake+", "+workloadSharedPrefix)
	fs.StringVar(&o.trace, "trace", "pkg/routingbench/testdata/mooncake_synthetic_trace.jsonl", "Mooncake trace of the "+workloadMooncake+" workload")
	fs.StringVar(&o.policies, "policies", "", "comma-separated policies, in report order (default: "+
		strings.Join(routingbench.Policies(), ",")+"; with -overload "+strings.Join(routingbench.OverloadPolicies(), ",")+")")
	fs.BoolVar(&o.overload, "overload", false, "run the overload scenario: arrival rates stepped across the fleet's capacity within an SLO")
	fs.StringVar(&o.loads, "loads", "0.5,0.8,1,1.5,2,3", "overload: arrival rates as multiples of the fleet's capacity")
	fs.StringVar(&o.slo, "slo", "", "overload: the requests' objective, e.g. ttft:2s,ttft-per-token:400us,tpot:100ms,e2e:30s (default per workload)")
	fs.StringVar(&o.seeds, "seeds", "", "overload: comma-separated seeds, one run each (default: -seed)")
	fs.IntVar(&o.requests, "overload-requests", 1500, "overload: the first requests of each workload to play (0: all)")
	fs.Float64Var(&o.capacity, "capacity", 0, "overload: the fleet's capacity in requests per second (0: measure it per workload and seed)")
	fs.StringVar(&o.out, "out", "out/bench-routing", "directory for the reports (created)")
	fs.Uint64Var(&o.bench.Seed, "seed", 1, "seed of every random choice and of the generated workload")
	fs.IntVar(&o.bench.Parallel, "parallel", runtime.GOMAXPROCS(0), "policies simulated at once (results do not depend on it)")

	b, e := &o.bench, &o.bench.Engine
	fs.IntVar(&b.Engines, "engines", routingbench.DefaultEngines, "number of engines")
	fs.IntVar(&e.NumGPUBlocks, "cache-blocks", e.NumGPUBlocks, "KV-cache blocks per engine")
	fs.IntVar(&e.BlockSize, "block-size", e.BlockSize, "tokens per KV-cache block")
	fs.IntVar(&e.MaxNumSeqs, "max-num-seqs", e.MaxNumSeqs, "running requests per engine")
	fs.IntVar(&e.MaxNumBatchedTokens, "max-num-batched-tokens", e.MaxNumBatchedTokens, "tokens per engine step")
	fs.IntVar(&e.MaxModelLen, "max-model-len", 0, "longest prompt plus output per request (0: what the KV cache holds)")
	fs.DurationVar(&e.Latency.StepOverhead, "step-overhead", e.Latency.StepOverhead, "fixed cost of an engine step")
	fs.DurationVar(&e.Latency.PrefillPerToken, "prefill-per-token", e.Latency.PrefillPerToken, "cost of a prompt token")
	fs.DurationVar(&e.Latency.DecodePerToken, "decode-per-token", e.Latency.DecodePerToken, "cost of a decoding sequence in a step")
	fs.DurationVar(&b.ScrapeInterval, "scrape-interval", routingbench.DefaultScrapeInterval, "how often the gateway scrapes engine metrics")
	fs.DurationVar(&b.EventDelay, "event-delay", routingbench.DefaultEventDelay, "delay of KV events from engine to index")
	fs.IntVar(&b.Replicas, "replicas", 1, "gateway replicas every policy but the oracle runs as, requests spread over them in turn")
	fs.DurationVar(&b.ShareInterval, "share-interval", redisstate.DefaultSharedCountsInterval,
		"how often the replicas share what they have in flight, as KVGATE_SHARED_STATE_INTERVAL_MS")
	shared := fs.Bool("shared-state", true, "replicas share what they have in flight; false: each routes on its own requests alone")

	s := &o.shared
	*s = routingbench.DefaultSharedPrefix
	fs.IntVar(&s.Groups, "sp-groups", s.Groups, "shared-prefix: system prompts")
	fs.IntVar(&s.SystemPromptTokens, "sp-system-tokens", s.SystemPromptTokens, "shared-prefix: tokens per system prompt")
	fs.IntVar(&s.Conversations, "sp-conversations", s.Conversations, "shared-prefix: conversations")
	fs.IntVar(&s.Turns, "sp-turns", s.Turns, "shared-prefix: requests per conversation")
	fs.Float64Var(&s.ConversationsPerSecond, "sp-rate", s.ConversationsPerSecond, "shared-prefix: conversations started per second")
	fs.DurationVar(&s.MeanTurnGap, "sp-turn-gap", s.MeanTurnGap, "shared-prefix: mean time between a conversation's requests")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case o.policies != "":
		o.bench.Policies = strings.Split(o.policies, ",")
	case o.overload:
		o.bench.Policies = routingbench.OverloadPolicies()
	default:
		o.bench.Policies = routingbench.Policies()
	}
	s.Seed = o.bench.Seed
	o.bench.Unshared = !*shared
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if o.overload {
		return o.runOverload(ctx, stdout, stderr)
	}
	for i, name := range strings.Split(o.workloads, ",") {
		w, err := o.workload(name)
		if err != nil {
			return err
		}
		start := time.Now()
		rep, err := routingbench.Run(ctx, o.bench, w)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "%s: simulated %d policies in %v\n", name, len(rep.Results), time.Since(start).Round(time.Millisecond))
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if err := rep.WriteTable(stdout); err != nil {
			return err
		}
		if err := writeReports(o.out, rep); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "reports written to %s\n", o.out)
	return nil
}

// workload loads or generates the named workload.
func (o options) workload(name string) (routingbench.Workload, error) {
	switch name {
	case workloadMooncake:
		f, err := os.Open(o.trace)
		if err != nil {
			return routingbench.Workload{}, err
		}
		defer f.Close()
		return routingbench.LoadMooncake(f, workloadMooncake)
	case workloadSharedPrefix:
		return routingbench.GenerateSharedPrefix(o.shared)
	}
	return routingbench.Workload{}, fmt.Errorf("unknown workload %q (known: %s, %s)", name, workloadMooncake, workloadSharedPrefix)
}

// writeReports writes the report's table, CSV, JSON and PNG under dir,
// named after its workload.
func writeReports(dir string, rep *routingbench.Report) error {
	for _, f := range []struct {
		ext   string
		write func(io.Writer) error
	}{
		{".txt", rep.WriteTable},
		{".csv", rep.WriteCSV},
		{".json", rep.WriteJSON},
		{".png", rep.WritePNG},
	} {
		path := filepath.Join(dir, rep.Workload+f.ext)
		if err := writeFile(path, f.write); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
