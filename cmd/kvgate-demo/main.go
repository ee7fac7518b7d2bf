// Command kvgate-demo shows KV-cache aware routing at work on one machine:
// it starts simulated vLLM engines (vllm-sim) and the gateway in static
// mode on 127.0.0.1, drives a shared-prefix chat workload through the
// gateway (users holding multi-turn conversations under a few shared
// system prompts, streaming their answers as chat completions or, with
// -api, through OpenAI's Responses or Anthropic's Messages API as Codex
// CLI and Claude Code send them), prints a live summary every few
// seconds, then runs the same workload under each routing algorithm in
// turn and ends with a comparison table.
//
// The engines and the gateway run in a process group of their own and are
// stopped on every exit, Ctrl-C included. Run kvgate-demo -help for the
// flags; make demo builds the binaries and runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/pkg/localfleet"
	"github.com/kvgate/kvgate/pkg/routingbench"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the demo until it is done or ctx ends, and returns the exit
// code. Whatever happens, the processes it started are stopped before it
// returns.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvgate-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o, err := parseOptions(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "kvgate-demo:", err)
		return exitUsage
	}
	o.chats.Conversations = o.conversations()
	var tx texter = routingbench.SimTexter{}
	engineArgs, gatewayArgs := o.engineArgs(), []string{"--shutdown-timeout", "5s"}
	if o.tokenizer != "" {
		wt, err := loadTexter(o.tokenizer)
		if err != nil {
			fmt.Fprintln(stderr, "kvgate-demo:", err)
			return exitFailed
		}
		tx = wt
	}
	work, err := newWorkload(o.chats, tx)
	if err != nil {
		fmt.Fprintln(stderr, "kvgate-demo:", err)
		return exitFailed
	}
	work.reasoning = o.reasoning
	fmt.Fprintf(stdout, "Starting %d simulated engines and %s (binaries in %s)...\n", o.engines, gatewaysNoun(o), o.binDir)
	fleet, err := localfleet.Start(ctx, localfleet.Config{
		BinDir:         o.binDir,
		Engines:        o.engines,
		EngineArgs:     engineArgs,
		GatewayArgs:    gatewayArgs,
		GatewayEnv:     o.gatewayEnv(),
		Tokenizer:      o.tokenizer,
		GatewayAddress: o.gatewayAdr,
		Gateways:       o.gateways,
		Redis:          o.gateways > 1 && o.sharedState,
		Dir:            o.workDir,
	})
	if err != nil {
		return failed(ctx, stdout, stderr, err)
	}
	defer func() {
		fleet.Close()
		fmt.Fprintf(stdout, "Stopped the engines and %s (process group %d).\n", gatewaysNoun(o), fleet.ProcessGroup())
	}()
	d := &demo{opts: o, out: stdout, fleet: fleet, work: work,
		client: chatClient{http: newHTTPClient(o.users), url: fleet.GatewayURL() + apiPaths[o.api], model: fleet.Model(), api: o.api}}
	// A connection the client dialed but never used holds a gateway's
	// shutdown up for seconds, as if a request were on it.
	defer d.client.http.CloseIdleConnections()
	if o.gateways > 1 {
		d.client.next = new(atomic.Uint64)
		for _, u := range fleet.GatewayURLs() {
			d.client.urls = append(d.client.urls, u+apiPaths[o.api])
		}
	}
	for _, e := range fleet.Engines() {
		d.pods = append(d.pods, e.PodKey)
	}
	printSetup(stdout, o, fleet)
	if err := d.runAll(ctx); err != nil {
		return failed(ctx, stdout, stderr, err)
	}
	return exitOK
}

// failed reports err, or the interruption when ctx ended, and returns the
// exit code.
func failed(ctx context.Context, stdout, stderr io.Writer, err error) int {
	if ctx.Err() != nil {
		fmt.Fprintln(stdout, "\nInterrupted: stopping the engines and the gateway.")
		return exitInterrupted
	}
	fmt.Fprintln(stderr, "kvgate-demo:", err)
	return exitFailed
}

// gatewaysNoun names the gateways the demo runs.
func gatewaysNoun(o options) string {
	switch {
	case o.gateways == 1:
		return "the gateway"
	case o.sharedState:
		return fmt.Sprintf("%d gateway replicas sharing state through Redis", o.gateways)
	}
	return fmt.Sprintf("%d gateway replicas that share no state", o.gateways)
}

// printSetup describes the fleet and the workload.
func printSetup(w io.Writer, o options, f *localfleet.Fleet) {
	e, c := o.engine, o.chats
	fmt.Fprintf(w, "\nEngines: %d x vllm-sim serving %s, each with a KV cache of %d blocks of %d tokens (%d tokens);\n",
		o.engines, f.Model(), e.blocks, e.blockSize, e.blocks*e.blockSize)
	fmt.Fprintf(w, "  prefill %v per uncached token (%d tokens cold: %.2f s), decode steps of %v + %v per request.\n",
		e.prefill, c.SystemPromptTokens, (time.Duration(c.SystemPromptTokens) * e.prefill).Seconds(), e.step, e.decode)
	fmt.Fprintf(w, "Workload: %d users in conversations of %d turns under %d system prompts of %d tokens\n",
		o.users, c.Turns, c.Groups, c.SystemPromptTokens)
	fmt.Fprintf(w, "  (an engine's cache holds %d of them); user messages of %d-%d tokens, answers of %d-%d,\n",
		e.blocks*e.blockSize/c.SystemPromptTokens, c.MinUserTokens, c.MaxUserTokens, c.MinAnswerTokens, c.MaxAnswerTokens)
	fmt.Fprintf(w, "  think time %v on average; %s, TTFT measured by the client.\n", c.MeanTurnGap, apiNoun(o.api))
	if o.tokenizer != "" {
		fmt.Fprintf(w, "Tokenizer: the model's own files in %s; the engines tokenize with them and the gateway in process,\n", o.tokenizer)
		fmt.Fprintf(w, "  once the engines' /tokenize agreed with it on sample prompts.\n")
	} else {
		fmt.Fprintf(w, "Tokenizer: the simulator's own; the gateway asks the engines' /tokenize, and answers a follow-up turn\n")
		fmt.Fprintf(w, "  at once with the tokens of the turns before (make demo sets up a real model's tokenizer files).\n")
	}
	fmt.Fprintf(w, "Gateway: %s (try %s/debug/kvcache while it runs)\n", f.GatewayURL(), f.GatewayURL())
	if o.gateways > 1 {
		fmt.Fprintf(w, "  %s, requests spread over them in turn: %s\n", gatewaysNoun(o), strings.Join(f.GatewayURLs(), ", "))
	}
	if o.overload {
		fmt.Fprintf(w, "Overload: %d users, more than the fleet serves within the objective of %v to the first token\n", o.users, o.sloTTFT)
		if o.flowControl {
			fmt.Fprintf(w, "  (KVGATE_SLO_TTFT). With flow control, kv-aware's requests wait in the gateway's queue while every engine\n")
			fmt.Fprintf(w, "  is saturated; the SLO-aware algorithms hold there what no engine can serve in time; both refuse (429)\n")
			fmt.Fprintf(w, "  what waited too long (try %s/debug/slo).\n", f.GatewayURL())
		} else {
			fmt.Fprintf(w, "  (KVGATE_SLO_TTFT). kv-aware sends every request on; the SLO-aware algorithms hold in the gateway's\n")
			fmt.Fprintf(w, "  queue what no engine can serve in time and refuse (429) what can no longer be (try %s/debug/slo).\n", f.GatewayURL())
		}
	}
	var procs []string
	for _, e := range f.Engines() {
		procs = append(procs, fmt.Sprintf("%s %d", e.Name, e.PID))
	}
	for _, g := range f.Gateways() {
		procs = append(procs, fmt.Sprintf("%s %d", g.Name, g.PID))
	}
	if r := f.Redis(); r != nil {
		procs = append(procs, fmt.Sprintf("redis-server %d (%s)", r.PID, f.RedisAddress()))
	}
	fmt.Fprintf(w, "Processes (group %d): %s; logs in %s\n", f.ProcessGroup(), strings.Join(procs, ", "), f.Dir())
	fmt.Fprintf(w, "Per run: pods show their prefix-cache hit ratio (cached / prompt tokens) and requests served;\n")
	fmt.Fprintf(w, "  decisions are the gateway's routing decisions by algorithm and outcome.\n")
}
