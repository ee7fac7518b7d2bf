package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/routingbench"
)

// options are kvgate-demo's command-line settings.
type options struct {
	binDir     string
	workDir    string
	gatewayAdr string
	algorithms []string
	phase      time.Duration
	interval   time.Duration
	drain      time.Duration
	users      int
	engines    int
	// gateways is the number of gateway replicas; sharedState has them
	// share state through a redis-server the demo starts.
	gateways    int
	sharedState bool
	// api is the API the users send their conversations through: apiChat,
	// apiResponses or apiMessages.
	api string
	// reasoning sends every answer back with the reasoning that preceded
	// it, as clients of thinking models do.
	reasoning bool
	// tokenizer is the directory of a model's tokenizer files, "" for the
	// simulator's own tokenizer.
	tokenizer string
	// overload runs more users than the fleet serves within sloTTFT, the
	// gateway's time-to-first-token objective (KVGATE_SLO_TTFT), and
	// reports queued and refused requests and SLO attainment.
	overload bool
	sloTTFT  time.Duration
	// flowControl holds the requests of every algorithm in the gateway
	// while every engine is saturated (KVGATE_FLOW_CONTROL).
	flowControl bool
	engine      engineOptions
	chats       routingbench.SharedPrefixConfig
}

// engineOptions shape every simulated engine.
type engineOptions struct {
	blocks     int
	blockSize  int
	prefill    time.Duration
	decode     time.Duration
	step       time.Duration
	maxBatched int
}

const usageHeader = `kvgate-demo runs simulated vLLM engines and the kvgate gateway on 127.0.0.1,
drives a shared-prefix chat workload through the gateway (as chat
completions, or through the Responses or Messages API: -api) with each
routing algorithm in turn (the engines' caches reset in between), prints a
live summary every few seconds and ends with a comparison table. Ctrl-C
stops everything it started.

Usage: kvgate-demo [flags]

Flags:
`

// parseOptions parses args (without the program name). Parse errors and
// -help are reported through fs's output.
func parseOptions(fs *flag.FlagSet, args []string) (options, error) {
	o := options{chats: routingbench.SharedPrefixConfig{
		Groups: 16, SystemPromptTokens: 8192, Turns: 4,
		MinUserTokens: 100, MaxUserTokens: 400, MinAnswerTokens: 16, MaxAnswerTokens: 48,
		MeanTurnGap: 2 * time.Second, Seed: 1,
	}}
	fs.StringVar(&o.binDir, "bin-dir", defaultBinDir(), "directory holding the gateway and vllm-sim binaries")
	fs.StringVar(&o.workDir, "work-dir", "",
		"directory for the endpoints file and the processes' logs, kept afterwards (default: a temporary directory, removed)")
	fs.StringVar(&o.gatewayAdr, "gateway-address", "", "address the gateway listens on, host:port (default: a free port on 127.0.0.1)")
	algs := fs.String("algorithms", strings.Join([]string{routing.KVAware, routing.LeastRequest, routing.Random}, ","),
		"routing algorithms to compare, in order, comma-separated")
	fs.DurationVar(&o.phase, "duration", 40*time.Second, "how long users send requests under each algorithm")
	fs.DurationVar(&o.interval, "interval", 2*time.Second, "how often the live summary is printed")
	fs.DurationVar(&o.drain, "drain-timeout", time.Minute, "how long the requests in flight at the end of a run may take to finish")
	fs.IntVar(&o.users, "users", 24, "concurrent users, each holding one conversation at a time")
	fs.IntVar(&o.engines, "engines", 4, "simulated engines")
	fs.IntVar(&o.gateways, "gateways", 1, "gateway replicas over the same engines, requests spread over them in turn")
	fs.BoolVar(&o.sharedState, "shared-state", true,
		"with several gateways, start a redis-server on 127.0.0.1 and have the replicas share what they have in flight through it; "+
			"false: each replica routes on its own requests alone")
	fs.StringVar(&o.api, "api", apiChat,
		"API the users send their conversations through: chat (POST /v1/chat/completions), responses (OpenAI's Responses API, "+
			"POST /v1/responses, shaped as Codex CLI sends it: the system prompt as instructions, the history as input items, "+
			"nothing stored) or messages (Anthropic's Messages API, POST /v1/messages, shaped as Claude Code sends it; it "+
			"reports no cached tokens, so the hit ratios show -)")
	fs.BoolVar(&o.reasoning, "reasoning", false,
		"send every answer back with the reasoning a thinking model gave before it, as its clients do (a chat's reasoning, "+
			"a Responses reasoning item, a Messages thinking block); with a template that reads reasoning (Qwen3's), the "+
			"gateway renders such chats in process as it learned the engines pass reasoning")
	fs.StringVar(&o.tokenizer, "tokenizer", "",
		"directory of a model's Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json with a chat template): "+
			"the engines tokenize with them and the gateway tokenizes in process with them, verified against the engines "+
			"(make demo installs Qwen3's with hack/install-tokenizers.sh); empty: the simulator's own tokenizer, which the "+
			"gateway asks the engines' /tokenize for, reusing the tokens of earlier turns")
	fs.BoolVar(&o.overload, "overload", false,
		"overload the fleet: "+strconv.Itoa(overloadUsers)+" users thinking "+overloadThinkTime.String()+" unless -users and -think-time "+
			"say otherwise, the gateway's time-to-first-token "+
			"objective set to -slo-ttft, and kv-aware compared with slo-least-load-pulling unless -algorithms says otherwise; "+
			"the summaries add the requests waiting in the gateway's SLO queue, those refused (429) and SLO attainment")
	fs.DurationVar(&o.sloTTFT, "slo-ttft", 2*time.Second, "with -overload: the time-to-first-token objective of every request")
	fs.BoolVar(&o.flowControl, "flow-control", false,
		"turn the gateway's flow control on ("+config.FlowControl.Name+"): the requests of every algorithm wait in the "+
			"gateway's queue while every engine is saturated, as the Gateway API Inference Extension's flow control holds "+
			"them; with -overload the summaries show kv-aware's waiting and refused requests too")
	fs.IntVar(&o.engine.blocks, "engine-blocks", 3072, "KV-cache blocks per engine")
	fs.IntVar(&o.engine.blockSize, "block-size", 16, "tokens per KV-cache block")
	fs.DurationVar(&o.engine.prefill, "prefill-time-per-token", 60*time.Microsecond, "engines' compute time per uncached prompt token")
	fs.DurationVar(&o.engine.decode, "decode-time-per-token", 500*time.Microsecond, "engines' compute time per decoding request in a step")
	fs.DurationVar(&o.engine.step, "step-overhead", 10*time.Millisecond, "engines' fixed time per scheduler step")
	fs.IntVar(&o.engine.maxBatched, "max-num-batched-tokens", 8192, "most tokens an engine computes per step")
	c := &o.chats
	fs.IntVar(&c.Groups, "system-prompts", c.Groups, "system prompts, each shared by the conversations of one group of users")
	fs.IntVar(&c.SystemPromptTokens, "system-tokens", c.SystemPromptTokens, "tokens per system prompt")
	fs.IntVar(&c.Turns, "turns", c.Turns, "requests per conversation")
	fs.IntVar(&c.MinUserTokens, "min-user-tokens", c.MinUserTokens, "shortest user message, in tokens")
	fs.IntVar(&c.MaxUserTokens, "max-user-tokens", c.MaxUserTokens, "longest user message, in tokens")
	fs.IntVar(&c.MinAnswerTokens, "min-answer-tokens", c.MinAnswerTokens, "shortest answer, in tokens")
	fs.IntVar(&c.MaxAnswerTokens, "max-answer-tokens", c.MaxAnswerTokens, "longest answer, in tokens")
	fs.DurationVar(&c.MeanTurnGap, "think-time", c.MeanTurnGap, "mean time a user takes to answer before the next turn (exponentially distributed)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the workload: the same seed gives the same conversations")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHeader)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.overload {
		if !set["algorithms"] {
			*algs = routing.KVAware + "," + routing.SLOLeastLoadPulling
		}
		if !set["users"] {
			o.users = overloadUsers
		}
		if !set["think-time"] {
			o.chats.MeanTurnGap = overloadThinkTime
		}
	}
	for _, a := range strings.Split(*algs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			o.algorithms = append(o.algorithms, a)
		}
	}
	return o, o.validate()
}

func (o *options) validate() error {
	var errs []error
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(!slices.Contains(apiNames, o.api), "-api: unknown API %q (want one of %s)", o.api, strings.Join(apiNames, ", "))
	check(len(o.algorithms) == 0, "-algorithms names none")
	for _, a := range o.algorithms {
		check(!slices.Contains(routing.Algorithms(), a), "-algorithms: unknown algorithm %q", a)
	}
	check(o.phase <= 0 || o.interval <= 0 || o.drain <= 0, "-duration, -interval and -drain-timeout must be positive")
	check(o.users < 1, "-users must be at least 1")
	check(o.overload && o.sloTTFT <= 0, "-slo-ttft must be positive")
	check(o.engines < 1, "-engines must be at least 1")
	check(o.gateways < 1, "-gateways must be at least 1")
	check(o.chats.Groups < 1 || o.chats.SystemPromptTokens < 1 || o.chats.Turns < 1,
		"-system-prompts, -system-tokens and -turns must be at least 1")
	check(o.chats.MinUserTokens < 1 || o.chats.MinAnswerTokens < 1, "-min-user-tokens and -min-answer-tokens must be at least 1")
	check(o.chats.MinUserTokens > o.chats.MaxUserTokens, "-min-user-tokens exceeds -max-user-tokens")
	check(o.chats.MinAnswerTokens > o.chats.MaxAnswerTokens, "-min-answer-tokens exceeds -max-answer-tokens")
	check(o.chats.MeanTurnGap < 0, "-think-time must not be negative")
	if need, have := o.maxModelLen(), (o.engine.blocks-1)*o.engine.blockSize; need > have {
		errs = append(errs, fmt.Errorf("a whole conversation (%d tokens) does not fit in an engine's KV cache (%d tokens): raise -engine-blocks or shorten the conversations",
			need, have))
	}
	return errors.Join(errs...)
}

// The users of -overload and their mean think time: several times what
// the default fleet serves within the default objective.
const (
	overloadUsers     = 240
	overloadThinkTime = time.Second
)

// gatewayEnv is the gateway's environment beyond its flags: with
// -overload, the objective of every request; with -flow-control, flow
// control on.
func (o *options) gatewayEnv() []string {
	var env []string
	if o.overload {
		env = append(env, "KVGATE_SLO_TTFT="+o.sloTTFT.String())
	}
	if o.flowControl {
		env = append(env, config.FlowControl.Name+"=true")
	}
	return env
}

// chatTemplateTokens bounds the tokens the chat template adds per message.
const chatTemplateTokens = 8

// maxModelLen is the longest a conversation grows: the system prompt and
// every turn's longest message and answer, with the chat template's tokens.
func (o *options) maxModelLen() int {
	c := o.chats
	return c.SystemPromptTokens + chatTemplateTokens +
		c.Turns*(c.MaxUserTokens+c.MaxAnswerTokens+3*chatTemplateTokens)
}

// Bounds of the conversations a workload holds.
const (
	// minTurnTime is the least time a turn takes with engines of no
	// latency: a round trip through the gateway.
	minTurnTime = 10 * time.Millisecond
	// maxConversations bounds the memory of a workload (tens of MB).
	maxConversations = 20_000
)

// conversations returns how many conversations to generate: more than
// the users can hold in a run, since every turn takes at least its
// shortest answer's decode steps.
func (o *options) conversations() int {
	c := o.chats
	turn := max(time.Duration(c.MinAnswerTokens)*o.engine.step, minTurnTime)
	perUser := int(o.phase/(time.Duration(c.Turns)*turn)) + 1
	return min(o.users*perUser, maxConversations)
}

// engineArgs are the vllm-sim flags of every engine.
func (o *options) engineArgs() []string {
	e := o.engine
	return []string{
		"-block-size", strconv.Itoa(e.blockSize),
		"-num-gpu-blocks", strconv.Itoa(e.blocks),
		"-max-model-len", strconv.Itoa(o.maxModelLen()),
		"-max-num-batched-tokens", strconv.Itoa(e.maxBatched),
		"-prefill-time-per-token", e.prefill.String(),
		"-decode-time-per-token", e.decode.String(),
		"-step-overhead", e.step.String(),
		"-shutdown-grace", "2s",
	}
}

// defaultBinDir is the directory of the running executable (make build
// puts kvgate-demo beside the gateway and vllm-sim), or bin.
func defaultBinDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "bin"
	}
	return filepath.Dir(exe)
}
