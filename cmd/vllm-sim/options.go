package main

import (
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simanthropic"
	"github.com/kvgate/kvgate/pkg/sim/simresponses"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// options are the command-line settings of vllm-sim.
type options struct {
	// model is the served model name; modelPath, when set, the model's
	// path listed as its root (-model given with -served-model-name).
	model     string
	modelPath string
	host      string
	port      int
	loras     string
	// runtimeLoRA serves the runtime LoRA loading endpoints.
	runtimeLoRA bool
	dpSize      int
	hashSeed    string
	// tokenizer is the directory of the model's tokenizer files, "" for
	// the simulator's own tokenizer.
	tokenizer string
	// reasoning is how assistant reasoning reaches the tokenizer's chat
	// template (-reasoning-passing).
	reasoning hf.ReasoningPassing
	engine    sim.EngineConfig
	// events configures the KV-event publishers when eventsOn; wire is
	// their wire format.
	events   kvEventsConfig
	eventsOn bool
	wire     wireFormat
	// delivery delays and loses the KV-event batches.
	delivery sim.EventDelivery
	// shutdownGrace bounds how long in-flight requests may take to finish
	// on SIGINT or SIGTERM.
	shutdownGrace time.Duration
	// apiKey, when set, is the key requests must present, as vLLM's
	// --api-key.
	apiKey string
	// responsesStore keeps Responses API responses (-responses-store, or
	// VLLM_ENABLE_RESPONSES_API_STORE), at most responsesStoreMax.
	responsesStore    bool
	responsesStoreMax int
	// cors is the CORS policy of -allowed-origins, -allowed-methods,
	// -allowed-headers and -allow-credentials.
	cors simserver.CORS
}

const usageHeader = `vllm-sim simulates a vLLM OpenAI-compatible server without GPUs: a paged KV
cache with prefix caching, vLLM's scheduler, a latency model, and vLLM's HTTP
API and metrics. It serves /v1/completions, /v1/chat/completions,
/v1/responses (as vLLM serves it for models other than gpt-oss), Anthropic's
/v1/messages and /v1/messages/count_tokens, /v1/models, /tokenize,
/reset_prefix_cache, /health and /metrics.

Usage: vllm-sim [flags]

Flags:
`

// parseOptions parses args (without the program name). Parse errors and
// -help are reported through fs's output.
func parseOptions(fs *flag.FlagSet, args []string) (options, error) {
	var o options
	e := &o.engine
	fs.StringVar(&o.model, "model", "sim-model",
		"served model name; with -served-model-name, the model's path or Hugging Face name, listed as its root in /v1/models")
	servedName := fs.String("served-model-name", "",
		"served model name, which requests name, as vLLM's --served-model-name; empty for -model")
	fs.StringVar(&o.host, "host", "0.0.0.0", "address to listen on")
	fs.IntVar(&o.port, "port", 8000, "port to serve the HTTP API on")
	fs.StringVar(&o.loras, "lora-modules", "",
		"comma-separated LoRA adapters served on top of the model, as name or name=path (the path is only listed in /v1/models)")
	fs.BoolVar(&o.runtimeLoRA, "allow-runtime-lora-updating", false,
		"serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter, as vLLM does with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
	fs.IntVar(&e.BlockSize, "block-size", 16, "tokens per KV-cache block")
	fs.IntVar(&e.NumGPUBlocks, "num-gpu-blocks", 4096, "KV-cache blocks per data-parallel rank (vLLM's --num-gpu-blocks-override)")
	fs.IntVar(&e.MaxNumSeqs, "max-num-seqs", 256, "most requests running at once per rank")
	fs.IntVar(&e.MaxNumBatchedTokens, "max-num-batched-tokens", 8192, "most tokens computed per scheduler step")
	fs.IntVar(&e.MaxModelLen, "max-model-len", 0,
		"most prompt plus output tokens per request (0: the smaller of 8192 and what the KV cache holds)")
	fs.DurationVar(&e.Latency.PrefillPerToken, "prefill-time-per-token", 50*time.Microsecond,
		"simulated compute time of one uncached prompt token")
	fs.DurationVar(&e.Latency.DecodePerToken, "decode-time-per-token", 100*time.Microsecond,
		"simulated compute time of one decoding sequence in a step")
	fs.DurationVar(&e.Latency.StepOverhead, "step-overhead", 5*time.Millisecond,
		"simulated fixed time of every scheduler step")
	fs.Float64Var(&e.Latency.AttentionPerContextToken, "attention-ns-per-context-token", 0,
		"simulated time, in nanoseconds, of one prompt token's attention to one earlier token of its sequence, cached or not "+
			"(prefill then grows with the square of the context: about 3.5 for an 8B model on an A100)")
	fs.Float64Var(&e.Latency.DecodePerContextToken, "decode-ns-per-context-token", 0,
		"simulated time, in nanoseconds, of one decoding sequence reading one token of its context's KV cache in a step "+
			"(about 64 for an 8B model on an A100)")
	fs.Float64Var(&e.Latency.Speed, "speed", 1,
		"relative speed of the simulated GPU: every step takes its time divided by it (2 for a GPU twice as fast)")
	fs.IntVar(&e.DefaultOutputTokens, "default-output-tokens", 128,
		"tokens generated, the last one EOS, for a request without max_tokens (a request with max_tokens gets exactly that many)")
	fs.IntVar(&o.dpSize, "data-parallel-size", 1, "data-parallel ranks, each an engine with its own KV cache and event stream")
	fs.StringVar(&o.hashSeed, "hash-seed", "",
		"seed of the block hashes, shared by all ranks (vLLM's PYTHONHASHSEED); empty: a random seed per rank, so no two engines share hashes")
	fs.Uint64Var(&e.OutputSeed, "seed", 0, "seed of the generated tokens")
	fs.StringVar(&o.tokenizer, "tokenizer", "",
		"directory of the model's Hugging Face tokenizer files (tokenizer.json, and tokenizer_config.json or chat_template.jinja "+
			"for chats) to tokenize prompts and render chats with, for /tokenize and the engines; empty: the simulator's own word-piece "+
			"tokenizer and ChatML template")
	reasoning := fs.String("reasoning-passing", "reasoning",
		"how an assistant message's reasoning reaches the -tokenizer's chat template, as vLLM's versions pass it: reasoning "+
			"(recent versions: the message's reasoning as both reasoning and reasoning_content, its reasoning_content dropped) "+
			"or reasoning_content (earlier versions: its reasoning_content as it is, its reasoning dropped)")
	eventsJSON := fs.String("kv-events-config", "",
		`KV-cache events, as vLLM's --kv-events-config JSON: {"enable_kv_cache_events": true, "publisher": "zmq", `+
			`"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "", "buffer_steps": 10000, `+
			`"hwm": 100000, "max_queue_size": 100000}; each data-parallel rank adds its rank to both ports. Empty: no events`)
	wire := fs.String("kv-events-wire", "v0.26",
		"wire format of the KV events, as the vLLM releases named send it: v0.26 (and later: events as maps, "+
			"replay replies with the topic), v0.24 (v0.24 and v0.25: replay replies without the topic), "+
			"v0.10 (v0.10 to v0.23: events as arrays)")
	fs.DurationVar(&o.delivery.Delay, "kv-events-delay", 0,
		"least time from the end of a step to the publication of its KV-event batch")
	fs.DurationVar(&o.delivery.Jitter, "kv-events-jitter", 0,
		"mean of an exponentially distributed time added to each KV-event batch's delay; batches keep their order, "+
			"so a late one holds back those after it")
	fs.Float64Var(&o.delivery.LossRate, "kv-events-loss", 0,
		"share of KV-event batches withheld from the live stream (0 to 1): subscribers see a gap in the sequence numbers "+
			"and replay the batch from the replay endpoint if there is one, or lose it")
	fs.StringVar(&o.apiKey, "api-key", "",
		"require \"Authorization: Bearer <key>\" on every path but /health and /metrics, as vLLM's --api-key does; empty for none")
	origins := fs.String("allowed-origins", "*",
		`origins browsers' cross-origin requests may come from, as vLLM's --allowed-origins: comma-separated, or a JSON list `+
			`as vLLM takes it (["https://app.example"]); "*" for any, empty for none`)
	methods := fs.String("allowed-methods", "*",
		`methods a CORS preflight may ask for, as vLLM's --allowed-methods: comma-separated or a JSON list; "*" for any`)
	headers := fs.String("allowed-headers", "*",
		`request headers a CORS preflight may ask for, besides the CORS-safelisted ones, as vLLM's --allowed-headers: `+
			`comma-separated or a JSON list; "*" for any`)
	fs.BoolVar(&o.cors.AllowCredentials, "allow-credentials", false,
		"allow cross-origin requests with credentials (Access-Control-Allow-Credentials: true), as vLLM's --allow-credentials")
	storeDefault, err := responsesStoreEnv(os.Getenv(responsesStoreVar))
	if err != nil {
		return o, err
	}
	fs.BoolVar(&o.responsesStore, "responses-store", storeDefault,
		"keep Responses API responses, as vLLM does with "+responsesStoreVar+"=1 (which sets this flag's default): "+
			"previous_response_id, background (streamed too), GET /v1/responses/{id} (?stream=true replays a background stream) "+
			"and POST /v1/responses/{id}/cancel work; "+
			"without it store is ignored, previous_response_id answered 404 and background 400")
	fs.IntVar(&o.responsesStoreMax, "responses-store-max", simserver.DefaultResponsesStoreMax,
		"most responses -responses-store keeps, the oldest forgotten first (vLLM keeps every one)")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", 10*time.Second,
		"on SIGINT or SIGTERM, how long running requests may take to finish before they are failed")
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
	if *servedName != "" {
		o.model, o.modelPath = *servedName, o.model
	}
	if o.dpSize < 1 {
		return o, fmt.Errorf("-data-parallel-size must be at least 1, got %d", o.dpSize)
	}
	if o.port < 0 || o.port > 65535 {
		return o, fmt.Errorf("-port %d is not a port", o.port)
	}
	if o.responsesStoreMax < 1 {
		return o, fmt.Errorf("-responses-store-max must be at least 1, got %d", o.responsesStoreMax)
	}
	var ok bool
	if o.wire, ok = wireFormats[*wire]; !ok {
		return o, fmt.Errorf("-kv-events-wire %q: want v0.26, v0.24 or v0.10", *wire)
	}
	if o.reasoning, ok = reasoningPassings[*reasoning]; !ok {
		return o, fmt.Errorf("-reasoning-passing %q: want reasoning or reasoning_content", *reasoning)
	}
	if err := o.delivery.Validate(); err != nil {
		return o, fmt.Errorf("-kv-events-delay, -kv-events-jitter, -kv-events-loss: %w", err)
	}
	if !(o.engine.Latency.Speed > 0) {
		return o, fmt.Errorf("-speed must be positive, got %v", o.engine.Latency.Speed)
	}
	for _, l := range []struct {
		flag  string
		value string
		dst   *[]string
	}{{"allowed-origins", *origins, &o.cors.AllowedOrigins}, {"allowed-methods", *methods, &o.cors.AllowedMethods},
		{"allowed-headers", *headers, &o.cors.AllowedHeaders}} {
		list, err := parseList(l.value)
		if err != nil {
			return o, fmt.Errorf("-%s: %w", l.flag, err)
		}
		*l.dst = list
	}
	o.events, o.eventsOn, err = parseKVEventsConfig(*eventsJSON)
	return o, err
}

// responsesStoreVar is vLLM's environment variable that keeps Responses
// API responses.
const responsesStoreVar = "VLLM_ENABLE_RESPONSES_API_STORE"

// responsesStoreEnv reads the value of VLLM_ENABLE_RESPONSES_API_STORE:
// unset or empty is false; vLLM reads an integer (0 or 1), and true and
// false are taken too.
func responsesStoreEnv(v string) (bool, error) {
	if v = strings.TrimSpace(v); v == "" {
		return false, nil
	}
	if n, err := strconv.Atoi(v); err == nil {
		return n != 0, nil
	}
	if b, err := strconv.ParseBool(v); err == nil {
		return b, nil
	}
	return false, fmt.Errorf("%s=%q: want 0 or 1", responsesStoreVar, v)
}

// reasoningPassings are the values of -reasoning-passing.
var reasoningPassings = map[string]hf.ReasoningPassing{
	"reasoning":         hf.VLLMReasoning,
	"reasoning_content": hf.VLLMReasoningContent,
}

// parseList parses a list flag: a JSON list of strings when it starts
// with "[", as vLLM's list flags are written, else comma-separated
// values, blanks trimmed and empty ones dropped.
func parseList(v string) ([]string, error) {
	list := []string{}
	if strings.HasPrefix(strings.TrimSpace(v), "[") {
		if err := json.Unmarshal([]byte(v), &list); err != nil {
			return nil, fmt.Errorf("not a JSON list of strings: %w", err)
		}
		return list, nil
	}
	for item := range strings.SplitSeq(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			list = append(list, item)
		}
	}
	return list, nil
}

// loraModules returns the adapters of -lora-modules.
func (o *options) loraModules() []simserver.LoRAModule {
	var mods []simserver.LoRAModule
	for _, m := range strings.Split(o.loras, ",") {
		name, path, _ := strings.Cut(strings.TrimSpace(m), "=")
		if name = strings.TrimSpace(name); name != "" {
			mods = append(mods, simserver.LoRAModule{Name: name, Path: strings.TrimSpace(path)})
		}
	}
	return mods
}

// serverConfig builds the simulated server's configuration, drawing random
// hash seeds from random when -hash-seed is empty.
func (o *options) serverConfig(random io.Reader) (simserver.Config, error) {
	cors := o.cors
	cfg := simserver.Config{Model: o.model, ModelPath: o.modelPath, LoRAModules: o.loraModules(), AllowRuntimeLoRAUpdating: o.runtimeLoRA,
		Anthropic: simanthropic.Convert, Responses: simresponses.Convert, CORS: &cors,
		ResponsesStore: o.responsesStore, ResponsesStoreMax: o.responsesStoreMax}
	if o.apiKey != "" {
		cfg.APIKeys = []string{o.apiKey}
	}
	if o.tokenizer != "" {
		tk, err := hf.Load(o.tokenizer)
		if err != nil {
			return cfg, fmt.Errorf("-tokenizer: %w", err)
		}
		cfg.Tokenizer = tk
	}
	cfg.Reasoning = o.reasoning
	for range o.dpSize {
		ec := o.engine
		ec.HashSeed = o.hashSeed
		if ec.HashSeed == "" {
			var b [16]byte
			if _, err := io.ReadFull(random, b[:]); err != nil {
				return cfg, fmt.Errorf("draw a hash seed: %w", err)
			}
			ec.HashSeed = hex.EncodeToString(b[:])
		}
		cfg.Ranks = append(cfg.Ranks, simserver.Rank{Engine: ec})
	}
	return cfg, nil
}
