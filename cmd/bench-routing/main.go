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
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/redisstate"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/routingbench"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
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
	workloadMooncake         = "mooncake"
	workloadConversation     = "conversation"
	workloadSharedPrefix     = "shared-prefix"
	workloadSharedPrefixText = "shared-prefix-text"
)

// options are the command's flags.
type options struct {
	workloads string
	trace     string
	tokenizer string
	policies  string
	out       string
	engines   []int
	loads     []float64
	seeds     []uint64
	bench     routingbench.Config
	shared    routingbench.SharedPrefixConfig
	conv      routingbench.ConversationConfig

	overload bool
	slo      string
	requests int
	capacity float64
}

// overloadSLOs are the objectives of the overload scenario by workload,
// unless -slo sets one: Mooncake's prompts run from a few tokens to
// 190,000, and the conversations' contexts grow with their turns, so their
// objective grows with the prompt (2 s plus four times what an uncached
// prompt takes to prefill at 10,000 tokens per second); the shared-prefix
// chats are mostly cached, 2 s flat.
var overloadSLOs = map[string]string{
	workloadMooncake:         "ttft:2s,ttft-per-token:400us",
	workloadConversation:     "ttft:2s,ttft-per-token:400us",
	workloadSharedPrefix:     "ttft:2s",
	workloadSharedPrefixText: "ttft:2s",
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{bench: routingbench.Config{Engine: routingbench.DefaultEngine}}
	fs := flag.NewFlagSet("bench-routing", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.workloads, "workload", workloadMooncake+","+workloadConversation,
		"comma-separated workloads: "+workloadMooncake+", "+workloadConversation+", "+workloadSharedPrefix+", "+
			workloadSharedPrefixText+" (the shared-prefix chats as text, tokenized by the engines and by the gateway's tokenizer)")
	fs.StringVar(&o.tokenizer, "tokenizer", "",
		"directory of a model's Hugging Face tokenizer files for "+workloadSharedPrefixText+" (the engines tokenize with them, "+
			"the gateway in process once they agree); empty: the simulator's tokenizer, which the gateway asks the engines for")
	fs.StringVar(&o.trace, "trace", "pkg/routingbench/testdata/mooncake_synthetic_trace.jsonl", "Mooncake trace of the "+workloadMooncake+" workload")
	fs.StringVar(&o.policies, "policies", "", "comma-separated policies, in report order (default: "+
		strings.Join(routingbench.AllPolicies(), ",")+"; with -overload "+strings.Join(routingbench.OverloadPolicies(), ",")+")")
	fs.BoolVar(&o.overload, "overload", false, "run the overload scenario: arrival rates stepped across the fleet's capacity within an SLO")
	fs.StringVar(&o.slo, "slo", "", "overload: the requests' objective, e.g. ttft:2s,ttft-per-token:400us,tpot:100ms,e2e:30s (default per workload)")
	fs.IntVar(&o.requests, "overload-requests", 1500, "overload: the first requests of each workload to play (0: all)")
	fs.Float64Var(&o.capacity, "capacity", 0, "overload: the fleet's capacity in requests per second (0: measure it per workload and seed)")
	fs.StringVar(&o.out, "out", "out/bench-routing", "directory for the reports (created)")
	engines, loads, seeds := "8", "", "1"
	fs.StringVar(&engines, "engines", engines, "comma-separated fleet sizes")
	fs.StringVar(&loads, "loads", loads,
		"comma-separated loads, shares of the fleet's capacity each workload is scaled to (1: the most the fleet could sustain "+
			"with every hit a cache of the whole fleet's size finds); empty: each workload at its own rate, or with -overload "+
			joinFloats(routingbench.DefaultLoads))
	fs.StringVar(&seeds, "seeds", seeds, "comma-separated seeds of every random choice and of the generated workloads, one run each")
	fs.IntVar(&o.bench.Parallel, "parallel", runtime.GOMAXPROCS(0), "policies simulated at once (results do not depend on it)")

	b, e := &o.bench, &o.bench.Engine
	speeds := joinFloats(routingbench.DefaultSpeeds)
	fs.StringVar(&speeds, "speeds", speeds, "comma-separated relative speeds of the engines, cycled over them (1: identical engines)")
	fs.IntVar(&e.NumGPUBlocks, "cache-blocks", e.NumGPUBlocks, "KV-cache blocks per engine")
	fs.IntVar(&e.BlockSize, "block-size", e.BlockSize, "tokens per KV-cache block")
	fs.IntVar(&e.MaxNumSeqs, "max-num-seqs", e.MaxNumSeqs, "running requests per engine")
	fs.IntVar(&e.MaxNumBatchedTokens, "max-num-batched-tokens", e.MaxNumBatchedTokens, "tokens per engine step")
	fs.IntVar(&e.MaxModelLen, "max-model-len", 0, "longest prompt plus output per request (0: what the KV cache holds)")
	fs.DurationVar(&e.Latency.StepOverhead, "step-overhead", e.Latency.StepOverhead, "fixed cost of an engine step")
	fs.DurationVar(&e.Latency.PrefillPerToken, "prefill-per-token", e.Latency.PrefillPerToken, "cost of a prompt token, its attention aside")
	fs.Float64Var(&e.Latency.AttentionPerContextToken, "attention-ns", e.Latency.AttentionPerContextToken,
		"cost in nanoseconds of a prompt token's attention to one earlier token of its sequence")
	fs.DurationVar(&e.Latency.DecodePerToken, "decode-per-token", e.Latency.DecodePerToken, "cost of a decoding sequence in a step, its attention aside")
	fs.Float64Var(&e.Latency.DecodePerContextToken, "decode-context-ns", e.Latency.DecodePerContextToken,
		"cost in nanoseconds of a decoding sequence reading one token of its context")
	fs.DurationVar(&b.ScrapeInterval, "scrape-interval", routingbench.DefaultScrapeInterval, "how often the gateway scrapes engine metrics")
	b.Events = routingbench.DefaultEvents
	fs.DurationVar(&b.Events.Delay, "event-delay", b.Events.Delay, "least delay of KV events from engine to index")
	fs.DurationVar(&b.Events.Jitter, "event-jitter", b.Events.Jitter, "mean of an exponential delay added to each KV event batch")
	fs.Float64Var(&b.Events.LossRate, "event-loss", b.Events.LossRate, "share of KV event batches that never reach the index")
	fs.Float64Var(&b.RouterPrefillTokensPerSecond, "router-prefill-speed", routingbench.DefaultRouterPrefillTokensPerSecond,
		"prefill tokens per second the routers assume until they measure one")
	fs.Float64Var(&b.RouterMinFleetQueue, "router-min-fleet-queue", routing.DefaultMinFleetQueue,
		"prefills kv-aware and the SLO-aware algorithms take every pod to have queued at least, when pricing what a "+
			"prefill costs the fleet (KVGATE_ROUTING_MIN_FLEET_QUEUE; 0: none)")

	c := &o.conv
	*c = routingbench.DefaultConversation
	fs.IntVar(&c.Conversations, "conv-conversations", c.Conversations, "conversation: conversations")
	fs.IntVar(&c.SharedTokens, "conv-shared-tokens", c.SharedTokens, "conversation: tokens every prompt opens with")
	fs.IntVar(&c.MeanContextTokens, "conv-context-tokens", c.MeanContextTokens, "conversation: mean tokens of a conversation's own context")
	fs.IntVar(&c.MeanTurns, "conv-turns", c.MeanTurns, "conversation: mean requests per conversation")
	fs.IntVar(&c.MeanOutputTokens, "conv-output-tokens", c.MeanOutputTokens, "conversation: mean tokens of an answer")
	fs.Float64Var(&c.ConversationsPerSecond, "conv-rate", c.ConversationsPerSecond, "conversation: conversations started per second on average")
	fs.DurationVar(&c.MeanTurnGap, "conv-turn-gap", c.MeanTurnGap, "conversation: mean time between a conversation's requests")
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
	if o.bench.RouterMinFleetQueue < 0 {
		return o, fmt.Errorf("-router-min-fleet-queue %v: want a number >= 0", o.bench.RouterMinFleetQueue)
	}
	o.bench.RouterMinFleetQueue = routing.MinFleetQueueSetting(o.bench.RouterMinFleetQueue)
	switch {
	case o.policies != "":
		o.bench.Policies = strings.Split(o.policies, ",")
	case o.overload:
		o.bench.Policies = routingbench.OverloadPolicies()
	default:
		o.bench.Policies = routingbench.AllPolicies()
	}
	var err error
	if o.engines, err = parseList(engines, "-engines", strconv.Atoi); err != nil {
		return o, err
	}
	if o.loads, err = parseList(loads, "-loads", func(v string) (float64, error) { return strconv.ParseFloat(v, 64) }); err != nil {
		return o, err
	}
	if o.seeds, err = parseList(seeds, "-seeds", func(v string) (uint64, error) { return strconv.ParseUint(v, 10, 64) }); err != nil {
		return o, err
	}
	if o.bench.Speeds, err = parseList(speeds, "-speeds", func(v string) (float64, error) { return strconv.ParseFloat(v, 64) }); err != nil {
		return o, err
	}
	if o.tokenizer != "" {
		// The engines take the model's vocabulary.
		tk, err := hf.Load(o.tokenizer)
		if err != nil {
			return o, fmt.Errorf("-tokenizer: %w", err)
		}
		o.bench.Engine.VocabSize = max(tk.VocabSize(), sim.VocabSize)
	}
	o.bench.Unshared = !*shared
	return o, nil
}

// parseList parses a comma-separated list of values; empty is none.
func parseList[T any](text, flagName string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(text, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := parse(f)
		if err != nil {
			return nil, fmt.Errorf("%s: invalid value %q", flagName, f)
		}
		out = append(out, v)
	}
	return out, nil
}

func joinFloats(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.FormatFloat(x, 'g', -1, 64)
	}
	return strings.Join(parts, ",")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var sources []routingbench.WorkloadSource
	for _, name := range strings.Split(o.workloads, ",") {
		src, err := o.workload(ctx, name, stderr)
		if err != nil {
			return err
		}
		sources = append(sources, src)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if o.overload {
		return o.runOverload(ctx, sources, stdout, stderr)
	}
	start := time.Now()
	printed := 0
	sw, err := routingbench.RunSweep(ctx, routingbench.SweepConfig{Base: o.bench, Engines: o.engines, Loads: o.loads, Seeds: o.seeds},
		sources, func(rep *routingbench.Report) error {
			fmt.Fprintf(stderr, "%s on %d engines, seed %d: simulated %d policies (%v so far)\n",
				rep.Workload, rep.Setup.Engines, rep.Setup.Seed, len(rep.Results), time.Since(start).Round(time.Millisecond))
			if printed++; printed > 1 {
				fmt.Fprintln(stdout)
			}
			if err := rep.WriteTable(stdout); err != nil {
				return err
			}
			return writeReports(o.out, reportName(rep), rep)
		})
	if err != nil {
		return err
	}
	if printed > 1 {
		fmt.Fprintln(stdout)
		if err := sw.WriteTable(stdout); err != nil {
			return err
		}
		for _, f := range []struct {
			name  string
			write func(io.Writer) error
		}{
			{"summary.txt", sw.WriteTable},
			{"summary.md", sw.WriteMarkdown},
			{"summary.json", sw.WriteJSON},
		} {
			path := filepath.Join(o.out, f.name)
			if err := writeFile(path, f.write); err != nil {
				return fmt.Errorf("write %s: %w", path, err)
			}
		}
	}
	fmt.Fprintf(stderr, "reports written to %s\n", o.out)
	return nil
}

// reportName names the files of a report: the workload (with its load),
// then the fleet size and seed.
func reportName(rep *routingbench.Report) string {
	return fmt.Sprintf("%s-e%d-s%d", rep.Workload, rep.Setup.Engines, rep.Setup.Seed)
}

// workload returns the source of the named workload; a text workload
// reports its tokenization to stderr.
func (o options) workload(ctx context.Context, name string, stderr io.Writer) (routingbench.WorkloadSource, error) {
	switch name {
	case workloadMooncake:
		f, err := os.Open(o.trace)
		if err != nil {
			return routingbench.WorkloadSource{}, err
		}
		defer f.Close()
		w, err := routingbench.LoadMooncake(f, workloadMooncake)
		if err != nil {
			return routingbench.WorkloadSource{}, err
		}
		return routingbench.WorkloadSource{Name: name, Make: func(uint64) (routingbench.Workload, error) { return w, nil }}, nil
	case workloadConversation:
		return routingbench.WorkloadSource{Name: name, Make: func(seed uint64) (routingbench.Workload, error) {
			c := o.conv
			c.Seed = seed
			return routingbench.GenerateConversations(c)
		}}, nil
	case workloadSharedPrefix:
		return routingbench.WorkloadSource{Name: name, Make: func(seed uint64) (routingbench.Workload, error) {
			s := o.shared
			s.Seed = seed
			return routingbench.GenerateSharedPrefix(s)
		}}, nil
	case workloadSharedPrefixText:
		return routingbench.WorkloadSource{Name: name, Make: func(seed uint64) (routingbench.Workload, error) {
			s := o.shared
			s.Seed = seed
			w, st, err := routingbench.TokenizeSharedPrefix(ctx, s, o.tokenizer)
			if err == nil {
				fmt.Fprintf(stderr, "%s, seed %d: the gateway (%s, in process %v) tokenized %d of %d prompts as the engines, %d as a prefix of theirs, %d otherwise\n",
					name, seed, st.Tokenizer, st.InProcess, st.Equal, st.Requests, st.Prefix, st.Differ)
			}
			return w, err
		}}, nil
	}
	return routingbench.WorkloadSource{}, fmt.Errorf("unknown workload %q (known: %s, %s, %s, %s)",
		name, workloadMooncake, workloadConversation, workloadSharedPrefix, workloadSharedPrefixText)
}

// writeReports writes the report's table, CSV, JSON and PNG under dir,
// named name.
func writeReports(dir, name string, rep *routingbench.Report) error {
	for _, f := range []struct {
		ext   string
		write func(io.Writer) error
	}{
		{".txt", rep.WriteTable},
		{".csv", rep.WriteCSV},
		{".json", rep.WriteJSON},
		{".png", rep.WritePNG},
	} {
		path := filepath.Join(dir, name+f.ext)
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
