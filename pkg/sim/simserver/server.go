// Package simserver serves simulated vLLM engines over vLLM's HTTP API: the
// OpenAI-compatible completions, chat completions, Responses
// (/v1/responses) and models endpoints, Anthropic's Messages API
// (/v1/messages and /v1/messages/count_tokens),
// /tokenize, /metrics with vLLM's metric names, /health and
// /reset_prefix_cache. Each data-parallel rank is an engine core from
// package sim, stepped in wall time by its own loop and publishing its
// KV-cache events to its own EventSink; requests are spread over the ranks
// as vLLM's data-parallel load balancer does, to the least loaded, but for
// a request whose X-data-parallel-rank header (HeaderDataParallelRank, in
// any case) names a rank: it runs there, on any generating endpoint, and a
// value that is no integer or no rank's index is answered 400, as vLLM
// refuses it.
//
// Prompts are tokenized, and chats rendered, with the simulator's own
// tokenizer and ChatML template, or with a model's own tokenizer files
// (Config.Tokenizer, package hf), whose ids the engines then cache and
// publish. A chat's template sees what vLLM's chat endpoint gives it, as
// the gateway's tokenizer does (package tokenizer): chat_template_kwargs
// with the chat's documents and reasoning_effort set over its own members
// of those names, and enable_thinking set to reasoning_effort != "none"
// when there is a reasoning effort and chat_template_kwargs does not set
// it. POST /tokenize, as vLLM's, reads neither documents nor
// reasoning_effort. An assistant message's reasoning reaches the model's
// template as Config.Reasoning says, recent vLLM's way by default (its
// reasoning under both reasoning and reasoning_content) or earlier vLLM's
// (its reasoning_content alone), in every chat rendered: chat
// completions, /tokenize, and the chats of Messages and Responses
// requests.
//
// POST /v1/messages is served as vLLM serves it: the body becomes the chat
// completion request vLLM builds from it (Config.Anthropic, which package
// simanthropic sets to tokenizer.ChatFromAnthropic),
// which is rendered, generated and published as that chat would be, so
// its prompt's token ids and KV events are the chat's; the answer is an
// Anthropic message or, with stream, vLLM's Anthropic events
// (message_start, content_block_start, content_block_delta,
// content_block_stop, message_delta with the usage, message_stop). Its
// errors, and those of /v1/messages/count_tokens, which answers the
// prompt's length, are Anthropic's error objects whose type is the OpenAI
// error's (BadRequestError, ...). A body vLLM refuses (no max_tokens, say)
// is answered 400, and so is one vLLM would render in a way the simulator
// cannot reproduce (images, among others: see tokenizer.ChatFromAnthropic),
// with a message saying so. The stream member is read as laxly as the
// OpenAI requests' members are; output_config.effort becomes the chat's
// reasoning_effort, as in vLLM, whose token count reads no output_config.
//
// POST /v1/responses is served as vLLM serves it for models it does not
// render with harmony (all but gpt-oss): the body becomes the chat vLLM
// renders it as (Config.Responses, which package simresponses sets to
// tokenizer.ChatFromResponses), which is rendered, generated and published
// as that chat would be. The answer is vLLM's response object (id resp_...,
// status "completed", or "incomplete" with incomplete_details when
// max_output_tokens ran out; one assistant message with an output_text
// part, none when no text was generated; usage with input_tokens,
// input_tokens_details.cached_tokens, output_tokens,
// output_tokens_details.reasoning_tokens, always 0, and total_tokens) or,
// with stream, vLLM's events, each framed "event: <type>" and
// "data: <json>" with a sequence_number and no closing [DONE]:
// response.created and response.in_progress at once, before the request
// reaches an engine; response.output_item.added and
// response.content_part.added with the first text, a
// response.output_text.delta per token with text; then
// response.output_text.done, response.content_part.done,
// response.output_item.done and response.completed with the whole
// response. A stream whose engine stops is broken off, as vLLM's is.
// max_output_tokens bounds the generation (without it the engine's
// DefaultOutputTokens are generated, and the response reports the room the
// prompt leaves, as vLLM does). The request's other members (instructions,
// tools, tool_choice, temperature, ...) are echoed back as sent, where vLLM
// echoes them as its request models re-serialize them, with vLLM's
// defaults for those left out; reasoning.effort becomes the chat's
// reasoning_effort, as in vLLM. By default store is ignored and no
// response is kept, as in vLLM without VLLM_ENABLE_RESPONSES_API_STORE:
// previous_response_id, GET /v1/responses/{response_id} and POST
// /v1/responses/{response_id}/cancel are answered 404 "Response with id
// '...' not found.", and background 400.
// Errors are OpenAI error objects with vLLM's status and wording: 400 for a
// body vLLM refuses, for one the simulator cannot render (as for
// /v1/messages), for max_output_tokens beyond the model length and for a
// prompt that does not fit with it; 404 for an unknown model.
//
// With Config.ResponsesStore, responses are kept as vLLM with
// VLLM_ENABLE_RESPONSES_API_STORE=1 keeps them: the response of a request
// with store (true by default), whole or as its stream's response.completed
// carries it, is kept under its id with the input items the request was
// rendered from (its instructions as a system message, the conversation it
// continued, then its input). A request naming a kept previous_response_id
// is rendered from its own instructions as a system message, the kept items
// of the previous response (its own instructions' message included), an
// assistant message of each content part of the previous response's output
// messages, then its input (the body, previous_response_id left out and
// those items put before its input, is converted by Config.Responses), so
// that the prompt of a follow-up without instructions begins with the
// previous turn's and finds it in the prefix cache of the engine that
// served it; an unknown one is answered 404 as above. GET
// /v1/responses/{response_id} answers the kept response. Where vLLM keeps
// every response, the server keeps at most Config.ResponsesStoreMax
// (DefaultResponsesStoreMax), forgetting the oldest kept first (a forgotten
// background response's generation runs on, its end not kept); what it
// keeps of each is bounded by the body size limit (64 MiB) and the model
// length its prompt fits.
//
// In store mode a request with background (which needs store: 400
// "background can only be used when `store` is true") is answered at once
// with the response queued (status "queued", output [], usage null), which
// is kept, while its generation runs on, its client gone or not; the kept
// response becomes the completed one when it ends, or "failed" when its
// engine fails. POST /v1/responses/{response_id}/cancel cancels a queued or
// in-progress response: its status becomes "cancelled", its generation is
// aborted (before the answer, 200 with the response) and it is not
// overwritten when the generation ends; 404 for an unknown id and 400
// "Cannot cancel a synchronous response." for a response neither queued nor
// in progress.
//
// A background stream's events, streamed as usual, are kept with its
// response: GET /v1/responses/{response_id}?stream=true replays them, after
// the sequence number starting_after when given, and those still to come,
// ending with response.completed or, where vLLM's replay waits on, when the
// generation is cancelled or fails. Replaying a response that was not a
// background stream breaks the answer off after it began, as vLLM's fails;
// a stream or starting_after that reads as no boolean or integer is
// answered 400 (vLLM: 422).
//
// With Config.AllowRuntimeLoRAUpdating, POST /v1/load_lora_adapter and POST
// /v1/unload_lora_adapter load and unload LoRA adapters as vLLM's do.
//
// The request members the simulator reads (max_tokens,
// max_completion_tokens, n, seed, stream, stream_options' include_usage and
// continuous_usage_stats, add_special_tokens, add_generation_prompt and
// continue_final_message) are read as vLLM's request validation (pydantic
// in lax mode) reads them: an integer may also be written 100.0, 1e2,
// "100" or true, a boolean 1, "true", "yes" or "off"; what vLLM refuses
// (max_tokens 1.5, stream "maybe", a seed beyond int64, null for a member
// vLLM does not declare optional) is answered 400.
//
// Where the API differs from vLLM's:
//   - usage always carries prompt_tokens_details.cached_tokens, which vLLM
//     sends only with --enable-prompt-tokens-details;
//   - sampling parameters (temperature, stop, logprobs, ...) are accepted and
//     ignored, and content parts other than text are refused;
//   - POST /reset_prefix_cache answers 409 when an engine refuses because
//     requests hold blocks, where vLLM answers 200 either way;
//   - a request without max_tokens generates the engine's
//     DefaultOutputTokens (ending with EOS) rather than vLLM's 16 for
//     completions; one with max_tokens generates exactly that many;
//   - a LoRA adapter named like the base model is refused, at start or
//     when loaded.
//
// With Config.APIKeys, as vLLM with --api-key (or VLLM_API_KEY), every
// request but GET /health and GET /metrics must carry "Authorization:
// Bearer <key>" with one of the keys; others are answered 401 with
// {"error": "Unauthorized"}. This is what vLLM's recent versions guard:
// every route but its public ones (/health, /ping, /load, /version,
// /metrics and the API docs), /tokenize included. Older versions guard
// only the paths under /v1 (and later /v2, /inference and /cohere).
// OPTIONS requests are never guarded, as in vLLM.
//
// As vLLM's API server, with its CORS middleware (Config.CORS, the
// policy of vLLM's --allowed-origins, --allowed-methods,
// --allowed-headers and --allow-credentials), the server answers a
// browser's CORS preflight (OPTIONS with Origin and
// Access-Control-Request-Method) to any path itself: 200 "OK" with the
// Access-Control-Allow-* headers and Access-Control-Max-Age 600 when the
// policy allows the origin, the method and the requested headers (echoed
// back when every header is allowed), else 400 "Disallowed CORS origin",
// "method" or "headers". The responses to other requests carrying Origin
// get Access-Control-Allow-Origin ("*", or the origin when the policy
// names origins or the request carries cookies). A request refused for
// its key gets none, as the key check precedes the CORS middleware in
// vLLM.
package simserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// Rank configures one data-parallel rank.
type Rank struct {
	// Engine configures the rank's engine core. Its DataParallelRank is set
	// to the rank's index, and its Events to whether Sink is set.
	Engine sim.EngineConfig
	// Sink receives the rank's KV-event batches; nil for an engine that
	// publishes none (vLLM without --kv-events-config).
	Sink EventSink
}

// Config configures a Server.
type Config struct {
	// Model is the served model name, which requests must name (or omit).
	Model string
	// ModelPath is the model's path or Hugging Face name, which
	// /v1/models lists as the root of Model's card, as vLLM started with
	// --model ModelPath --served-model-name Model does; empty for Model.
	ModelPath string
	// LoRAModules are the LoRA adapters served on top of Model from the
	// start. A request naming adapter i runs with it (engine adapter id
	// i+1): its blocks are hashed apart from the base model's and its
	// events carry the adapter.
	LoRAModules []LoRAModule
	// AllowRuntimeLoRAUpdating serves POST /v1/load_lora_adapter and POST
	// /v1/unload_lora_adapter, as vLLM does when
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING is true. Adapters loaded at runtime
	// get the next engine ids.
	AllowRuntimeLoRAUpdating bool
	// Ranks configures the data-parallel ranks; at least one.
	Ranks []Rank
	// Registry receives the server's metrics and is served at /metrics; nil
	// for a new registry of its own.
	Registry *prometheus.Registry
	// Logger receives the server's logs; the zero value discards them.
	Logger klog.Logger
	// Tokenizer, when set, tokenizes prompts and renders chats with a
	// model's own tokenizer files instead of the simulator's tokenizer
	// (sim.Tokenizer), for /tokenize and for the engines: the ids the
	// engines cache and publish are then that model's. The simulated model
	// still generates from the simulator's output vocabulary.
	Tokenizer *hf.Tokenizer
	// Reasoning is how the engine passes an assistant message's reasoning
	// to Tokenizer's chat template, as vLLM's versions do differently:
	// hf.VLLMReasoning, recent versions' (a message's reasoning under both
	// reasoning and reasoning_content, its reasoning_content dropped), or
	// hf.VLLMReasoningContent, earlier versions' (its reasoning_content as
	// it is, its reasoning dropped). The zero value is hf.VLLMReasoning.
	Reasoning hf.ReasoningPassing
	// Anthropic converts the body of an Anthropic Messages request into
	// the chat completion request vLLM serves it as (package simanthropic
	// gives vLLM's conversion); without it, /v1/messages and
	// /v1/messages/count_tokens answer 404. It is a setting rather than an
	// import so that the tokenizer, whose conversion it is, may run
	// simulated engines in its own tests.
	Anthropic AnthropicConverter
	// Responses converts the body of a Responses request into the chat
	// vLLM renders it as (package simresponses gives vLLM's conversion);
	// without it, /v1/responses answers 404. It is a setting for the same
	// reason as Anthropic.
	Responses ResponsesConverter
	// ResponsesStore keeps responses, as vLLM does with
	// VLLM_ENABLE_RESPONSES_API_STORE=1: a Responses request with store
	// (true by default) has its response kept, which later requests may
	// continue (previous_response_id) and GET /v1/responses/{response_id}
	// returns, and background requests run on their own, streamed or not,
	// until POST /v1/responses/{response_id}/cancel cancels them (see the
	// package documentation). Without it, store is ignored,
	// previous_response_id answered 404 and background 400, as by vLLM
	// without the variable.
	ResponsesStore bool
	// ResponsesStoreMax bounds the responses kept in store mode: beyond
	// it the oldest kept is forgotten. 0 is DefaultResponsesStoreMax.
	ResponsesStoreMax int
	// APIKeys, when not empty, are the keys requests must present, as
	// vLLM's --api-key: see the package documentation for the paths
	// guarded.
	APIKeys []string
	// CORS is the cross-origin policy the server answers browsers' CORS
	// preflights with and marks responses by, as vLLM's CORS flags set
	// it; nil for vLLM's default, DefaultCORS.
	CORS *CORS
}

// Server is a simulated vLLM API server.
type Server struct {
	model       string
	modelPath   string
	loras       loraRegistry
	maxModelLen int
	runners     []*runner
	registry    *prometheus.Registry
	log         klog.Logger
	tokenizer   promptTokenizer
	anthropic   AnthropicConverter
	responses   ResponsesConverter
	store       *responseStore // nil without store mode
	created     int64
	handler     http.Handler
}

// New returns a server whose engines are idle until Run.
func New(cfg Config) (*Server, error) {
	if cfg.Model == "" {
		return nil, errors.New("simserver: a model name is required")
	}
	if len(cfg.Ranks) == 0 {
		return nil, errors.New("simserver: at least one rank is required")
	}
	s := &Server{
		model:     cfg.Model,
		modelPath: cmp.Or(cfg.ModelPath, cfg.Model),
		registry:  cfg.Registry,
		anthropic: cfg.Anthropic,
		responses: cfg.Responses,
		log:       cfg.Logger.WithValues("model", cfg.Model),
		created:   time.Now().Unix(),
	}
	if cfg.ResponsesStoreMax < 0 {
		return nil, fmt.Errorf("simserver: ResponsesStoreMax %d is negative", cfg.ResponsesStoreMax)
	}
	if cfg.ResponsesStore {
		s.store = newResponseStore(cmp.Or(cfg.ResponsesStoreMax, DefaultResponsesStoreMax))
	}
	s.tokenizer = simTokenizer{}
	if cfg.Tokenizer != nil {
		s.tokenizer = hfTokenizer{tk: cfg.Tokenizer, reasoning: cmp.Or(cfg.Reasoning, hf.VLLMReasoning)}
	}
	if s.registry == nil {
		s.registry = prometheus.NewRegistry()
	}
	for _, m := range cfg.LoRAModules {
		if err := s.loras.load(cfg.Model, m); err != nil {
			return nil, fmt.Errorf("simserver: LoRA module %q: %w", m.Name, err)
		}
	}
	m, err := newMetrics(s.registry, cfg.Model)
	if err != nil {
		return nil, err
	}
	for i, rank := range cfg.Ranks {
		ec := rank.Engine
		ec.DataParallelRank = i
		ec.Events = rank.Sink != nil
		if cfg.Tokenizer != nil && ec.VocabSize == 0 {
			ec.VocabSize = cfg.Tokenizer.VocabSize()
		}
		engine, err := sim.NewEngine(ec)
		if err != nil {
			return nil, fmt.Errorf("simserver: rank %d: %w", i, err)
		}
		s.runners = append(s.runners, newRunner(i, engine, rank.Sink, m.forRank(i, engine.Config()), s.log.WithValues("rank", i)))
	}
	s.maxModelLen = s.runners[0].engine.Config().MaxModelLen
	cors := DefaultCORS()
	if cfg.CORS != nil {
		cors = *cfg.CORS
	}
	// As in vLLM, the key check comes first and lets every OPTIONS
	// request through: preflights, which browsers send without
	// credentials, are answered by the CORS policy alone.
	s.handler = withCORS(s.routes(cfg.AllowRuntimeLoRAUpdating), cors)
	if len(cfg.APIKeys) > 0 {
		s.handler = requireAPIKey(s.handler, cfg.APIKeys)
	}
	return s, nil
}

// Run steps every rank's engine in wall time until ctx ends, then fails the
// requests still open and returns.
func (s *Server) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range s.runners {
		wg.Go(func() { r.run(ctx) })
	}
	s.log.Info("Simulated engines running", "ranks", len(s.runners))
	wg.Wait()
}

// Handler returns the server's HTTP API.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) routes(runtimeLoRA bool) http.Handler {
	mux := http.NewServeMux()
	if runtimeLoRA {
		mux.HandleFunc("POST /v1/load_lora_adapter", s.handleLoadLoRA)
		mux.HandleFunc("POST /v1/unload_lora_adapter", s.handleUnloadLoRA)
	}
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChatCompletions)
	if s.anthropic != nil {
		mux.HandleFunc("POST /v1/messages", s.handleMessages)
		mux.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
	}
	if s.responses != nil {
		mux.HandleFunc("POST /v1/responses", s.handleResponses)
		mux.HandleFunc("GET /v1/responses/{response_id}", s.handleGetResponse)
		mux.HandleFunc("POST /v1/responses/{response_id}/cancel", s.handleCancelResponse)
	}
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("POST /tokenize", s.handleTokenize)
	mux.HandleFunc("POST /reset_prefix_cache", s.handleResetPrefixCache)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	return mux
}

// lora resolves the model a request names: "" or the served model give
// the base model (nil), an adapter name its adapter.
func (s *Server) lora(model string) (*sim.LoRA, error) {
	if model == "" || model == s.model {
		return nil, nil
	}
	if l, ok := s.loras.find(model); ok {
		return l, nil
	}
	return nil, &notFound{msg: fmt.Sprintf("The model `%s` does not exist.", model)}
}

// notFound reports a request for a model or adapter the server does not
// serve.
type notFound struct{ msg string }

func (e *notFound) Error() string { return e.msg }

// pickRunner returns the rank of index rank, or the least loaded rank (the
// lowest on ties) when rank is -1.
func (s *Server) pickRunner(rank int) *runner {
	if rank >= 0 {
		return s.runners[rank]
	}
	best, bestLoad := s.runners[0], s.runners[0].load()
	for _, r := range s.runners[1:] {
		if l := r.load(); l < bestLoad {
			best, bestLoad = r, l
		}
	}
	return best
}

// HeaderDataParallelRank is the request header naming the data-parallel
// rank a request runs on, as vLLM reads it (X-data-parallel-rank, in any
// case): a router that knows which rank caches a prompt's prefix sends
// the request there, which vLLM's own balancing across ranks, by load,
// does not.
const HeaderDataParallelRank = "X-Data-Parallel-Rank"

// requestedRank returns the index of the rank r asks for in
// HeaderDataParallelRank, -1 when it names none; it fails, as vLLM does,
// for a value that is no integer or no rank of the server.
func (s *Server) requestedRank(r *http.Request) (int, error) {
	v := r.Header.Get(HeaderDataParallelRank)
	if v == "" {
		return -1, nil
	}
	rank, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return -1, badRequestf("invalid literal for int() with base 10: %q", v)
	}
	if rank < 0 || rank >= len(s.runners) {
		return -1, badRequestf("data_parallel_rank %d is out of range [0, %d).", rank, len(s.runners))
	}
	return rank, nil
}
