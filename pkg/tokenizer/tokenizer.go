package tokenizer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/internal/apikey"
	"github.com/kvgate/kvgate/pkg/internal/rawsock"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// Defaults used for the zero fields of a Config.
const (
	DefaultTimeout          = 5 * time.Second
	DefaultCacheMaxTokens   = 1 << 23 // a cache of 32 MiB
	DefaultMaxResponseBytes = 16 << 20
	// DefaultVerifyFraction is the share of in-process tokenizations
	// compared with the engine's.
	DefaultVerifyFraction = 0.01
	// DefaultMaxBackgroundCalls bounds the /tokenize calls made off the
	// request path.
	DefaultMaxBackgroundCalls = 8
	// DefaultLocalMaxBytes bounds the text of one request tokenized in
	// process: 1 MiB holds a 128k-token context in any language, and
	// about 256k tokens of English.
	DefaultLocalMaxBytes = 1 << 20
)

// Config configures a Tokenizer. The zero value is usable: every zero field
// takes its default.
type Config struct {
	// Timeout bounds one /tokenize call, from dialling to the last byte of
	// the response (AIBRIX_TOKENIZER_REQUEST_TIMEOUT). Zero means
	// DefaultTimeout.
	Timeout time.Duration
	// CacheMaxTokens bounds the memory of the cache of recent
	// tokenizations to 4 bytes times CacheMaxTokens
	// (KVGATE_TOKENIZER_CACHE_MAX_TOKENS): each tokenization is charged 4
	// bytes per id and 192 bytes for its bookkeeping, so that the bound
	// holds however short they are; the least recently used are evicted
	// beyond it. Zero means DefaultCacheMaxTokens.
	CacheMaxTokens int
	// MaxResponseBytes bounds the body of a /tokenize response; a larger one
	// fails with ReasonBadBody. Zero means DefaultMaxResponseBytes, room for
	// well over a million token ids.
	MaxResponseBytes int64
	// Transport sends the calls. Nil means a transport meant for pods
	// reached directly: no proxy, HTTP/1.1 keep-alive, up to 64 idle
	// connections per pod.
	Transport http.RoundTripper
	// Logger receives the Tokenizer's logs. The zero value means klog's
	// global logger.
	Logger klog.Logger
	// LocalDir, when set, holds the tokenizer files of models to tokenize
	// in process (KVGATE_TOKENIZER_DIR): LocalDir/<model>/tokenizer.json,
	// with tokenizer_config.json and chat_template.jinja beside it, where
	// <model> is the served model name ("Qwen/Qwen3-8B" is a directory
	// Qwen3-8B in a directory Qwen). Other models are tokenized by the
	// engines. See In-process tokenization in the package documentation.
	LocalDir string
	// VerifyFraction is the share of in-process tokenizations compared
	// with the engine's /tokenize off the request path
	// (KVGATE_TOKENIZER_VERIFY_FRACTION). Zero means
	// DefaultVerifyFraction; a negative value compares none.
	VerifyFraction float64
	// NoPrefixReuse makes a chat whose whole conversation is not cached
	// wait for the engine even when a prefix of its messages is
	// (KVGATE_TOKENIZER_PREFIX_REUSE=false). See Prefix reuse in the
	// package documentation.
	NoPrefixReuse bool
	// MaxBackgroundCalls bounds the /tokenize calls made off the request
	// path: tokenizations of whole chats answered from a prefix, and
	// comparisons of the in-process tokenizer with the engine
	// (KVGATE_TOKENIZER_MAX_BACKGROUND_CALLS). Zero means
	// DefaultMaxBackgroundCalls.
	MaxBackgroundCalls int
	// LocalMaxBytes bounds the text of one request tokenized in process
	// (KVGATE_TOKENIZER_LOCAL_MAX_BYTES): a completion's prompt as sent (a
	// JSON string), a chat's messages, tools, documents and
	// chat_template_kwargs as sent, and the chat they render. A larger
	// request of a model tokenized in process is tokenized by neither the
	// gateway nor the engine: it fails with ReasonTooLarge, to be routed on
	// load alone. Zero means DefaultLocalMaxBytes. See In-process
	// tokenization in the package documentation.
	LocalMaxBytes int
	// Reasoning is how the in-process tokenizer knows the way the engines
	// pass an assistant message's reasoning to a chat template that
	// mentions reasoning (KVGATE_TOKENIZER_REASONING): ReasoningAuto, or
	// empty, learns it from the model's engine when the chat form is
	// verified; ReasoningRecent and ReasoningEarlier take recent or
	// earlier vLLM versions' way for every model, without asking;
	// ReasoningEngine leaves chats carrying reasoning to the engines. See
	// In-process tokenization in the package documentation.
	Reasoning string
	// APIKey, when set, is sent as "Authorization: Bearer <APIKey>" on
	// every /tokenize call (KVGATE_ENGINE_API_KEY), for engines started
	// with vLLM's --api-key: recent vLLM versions refuse /tokenize
	// without it (older ones guard only the paths under /v1). The key is
	// never logged nor put in errors.
	APIKey string
}

// Tokenizer computes prompts' token ids with vLLM's own tokenizer, through
// POST /tokenize on a pod of the model, and caches recent results. It is
// safe for concurrent use. Create one with New and release it with Close.
//
// The ids are those the engine computes for the same request, so that the
// prefix index, which keys KV blocks by the engine's ids, can be queried
// with them. Results are cached by a digest of the model, the request form
// and every field that changes the result, never by the pod asked: all pods
// of a model are assumed to serve the same tokenizer and chat template.
//
// A slice returned by a Tokenizer is shared with its cache and with other
// callers: it must not be modified.
type Tokenizer struct {
	client *http.Client
	// authorization is the Authorization header of every call, shared by
	// them and never modified; nil without an API key.
	authorization    []string
	timeout          time.Duration
	maxResponseBytes int64
	seed             uint64
	cache            *cache
	m                *metrics
	log              klog.Logger
	local            map[string]*localModel // by model name
	verifyFraction   float64
	prefixReuse      bool
	localMaxBytes    int
	reasoning        string        // Config.Reasoning, ReasoningAuto when empty
	background       chan struct{} // a token per background call in flight

	ctx    context.Context // ends on Close; parent of every call
	cancel context.CancelFunc
	mu     sync.Mutex // guards closed and calls.Add against Close
	closed bool
	calls  sync.WaitGroup
}

// New returns a Tokenizer configured by cfg whose metrics are registered
// on reg. It fails if cfg holds a negative value, a VerifyFraction above 1
// or not a number, a Reasoning not among ReasoningSettings, or if the metrics cannot be registered, for example
// because reg already holds another Tokenizer's.
func New(cfg Config, reg prometheus.Registerer) (*Tokenizer, error) {
	if cfg.Timeout < 0 || cfg.CacheMaxTokens < 0 || cfg.MaxResponseBytes < 0 || cfg.MaxBackgroundCalls < 0 || cfg.LocalMaxBytes < 0 {
		return nil, fmt.Errorf("tokenizer config: negative value among Timeout %v, CacheMaxTokens %d, MaxResponseBytes %d, "+
			"MaxBackgroundCalls %d, LocalMaxBytes %d", cfg.Timeout, cfg.CacheMaxTokens, cfg.MaxResponseBytes,
			cfg.MaxBackgroundCalls, cfg.LocalMaxBytes)
	}
	if !(cfg.VerifyFraction <= 1) {
		return nil, fmt.Errorf("tokenizer config: VerifyFraction %v is not a number at most 1", cfg.VerifyFraction)
	}
	if !slices.Contains(ReasoningSettings, cmp.Or(cfg.Reasoning, ReasoningAuto)) {
		return nil, fmt.Errorf("tokenizer config: Reasoning %q is not one of %s", cfg.Reasoning, strings.Join(ReasoningSettings, ", "))
	}
	if err := apikey.Check(cfg.APIKey); err != nil {
		return nil, fmt.Errorf("tokenizer config: APIKey: %w", err)
	}
	if reg == nil {
		return nil, errors.New("tokenizer: nil prometheus.Registerer")
	}
	cfg = cfg.withDefaults()
	var local map[string]*localModel
	if cfg.LocalDir != "" {
		var err error
		if local, err = loadLocalModels(cfg.LocalDir); err != nil {
			return nil, err
		}
	}
	m, err := newMetrics(reg, local)
	if err != nil {
		return nil, err
	}
	var authorization []string
	if cfg.APIKey != "" {
		authorization = []string{"Bearer " + cfg.APIKey}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Tokenizer{
		authorization:    authorization,
		client:           &http.Client{Transport: cfg.Transport, Timeout: cfg.Timeout},
		timeout:          cfg.Timeout,
		maxResponseBytes: cfg.MaxResponseBytes,
		seed:             rand.Uint64(),
		cache:            newCache(4*cfg.CacheMaxTokens, m),
		m:                m,
		log:              cfg.Logger.WithName("tokenizer"),
		local:            local,
		verifyFraction:   max(cfg.VerifyFraction, 0),
		prefixReuse:      !cfg.NoPrefixReuse,
		localMaxBytes:    cfg.LocalMaxBytes,
		reasoning:        cmp.Or(cfg.Reasoning, ReasoningAuto),
		background:       make(chan struct{}, cfg.MaxBackgroundCalls),
		ctx:              ctx,
		cancel:           cancel,
	}, nil
}

func (cfg Config) withDefaults() Config {
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.CacheMaxTokens = cmp.Or(cfg.CacheMaxTokens, DefaultCacheMaxTokens)
	cfg.MaxResponseBytes = cmp.Or(cfg.MaxResponseBytes, DefaultMaxResponseBytes)
	cfg.VerifyFraction = cmp.Or(cfg.VerifyFraction, DefaultVerifyFraction)
	cfg.MaxBackgroundCalls = cmp.Or(cfg.MaxBackgroundCalls, DefaultMaxBackgroundCalls)
	cfg.LocalMaxBytes = cmp.Or(cfg.LocalMaxBytes, DefaultLocalMaxBytes)
	if cfg.Transport == nil {
		cfg.Transport = podTransport()
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	return cfg
}

// podTransport returns the default transport: pods are dialled directly by
// IP, so environment proxies do not apply, a busy gateway keeps enough
// idle connections per pod to avoid a handshake per call, and the
// connections read and write with raw system calls (package rawsock).
func podTransport() *http.Transport {
	d := &net.Dialer{KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return rawsock.Wrap(c), nil
		},
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
}

// Close cancels the calls in flight, waits for them to end and closes idle
// connections. Cached results are still served after Close; misses fail
// with ReasonCanceled.
func (t *Tokenizer) Close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	t.calls.Wait()
	t.client.CloseIdleConnections()
}

// TokenizeCompletion returns the token ids vLLM computes for req's prompt,
// asking the vLLM server at baseURL (e.g. "http://10.0.3.7:8000") when they
// are not cached. A prompt of token ids is returned as it is, without a
// call. The returned slice must not be modified.
//
// At most one call is made, bounded by Config.Timeout; concurrent identical
// requests share it. If ctx ends first, TokenizeCompletion returns at once
// and the call completes in the background, still filling the cache. A
// prompt tokenized in process is tokenized on the caller's goroutine,
// until ctx ends. Every error is an *Error.
func (t *Tokenizer) TokenizeCompletion(ctx context.Context, baseURL string, req *CompletionRequest) ([]uint32, error) {
	if err := checkTruncation(req.Model, req.TruncatePromptTokens, req.TruncationSide); err != nil {
		return nil, err
	}
	text, ids, err := req.prompt()
	if err != nil {
		return nil, inputError(req.Model, err)
	}
	if text == nil {
		return req.truncate(result{tokens: ids})
	}
	key := req.key(t.seed, text)
	for {
		res, cl, leader, hit := t.cache.acquire(key)
		if hit {
			return req.truncate(res)
		}
		if leader {
			if res, ok, err := t.localCompletion(ctx, req, text, baseURL); ok || err != nil {
				return t.completeLocal(key, cl, req, res, err)
			}
			body, err := req.body(text)
			t.start(key, cl, baseURL, req.Model, body, err, false)
		}
		if ids, again, err := t.await(ctx, cl, req.Model, req); !again {
			return ids, err
		}
	}
}

// TokenizeChat returns the token ids vLLM computes for req's conversation
// rendered by the model's chat template, asking the vLLM server at baseURL
// when they are not cached. It makes calls, shares them and returns like
// TokenizeCompletion, with one exception: when the engine must be asked
// and the cache holds the ids of a prefix of the conversation's messages,
// it returns those at once and asks the engine in the background (see
// Prefix reuse in the package documentation).
func (t *Tokenizer) TokenizeChat(ctx context.Context, baseURL string, req *ChatRequest) ([]uint32, error) {
	if err := checkTruncation(req.Model, req.TruncatePromptTokens, req.TruncationSide); err != nil {
		return nil, err
	}
	key := req.key(t.seed)
	for {
		res, cl, leader, hit := t.cache.acquire(key)
		if hit {
			return req.truncate(res)
		}
		if leader {
			if res, ok, err := t.localChat(ctx, req, baseURL); ok || err != nil {
				return t.completeLocal(key, cl, req, res, err)
			}
		}
		if ids, ok := t.prefix(req, key, cl, leader, baseURL); ok {
			return ids, nil
		}
		if leader {
			body, err := req.body()
			t.start(key, cl, baseURL, req.Model, body, err, false)
		}
		if ids, again, err := t.await(ctx, cl, req.Model, req); !again {
			return ids, err
		}
	}
}

// truncater is a request whose ids are truncated as vLLM truncates them.
type truncater interface {
	truncate(result) ([]uint32, error)
}

// completeLocal ends the leader's call with the outcome of its
// tokenization in process, and returns what the leader gets.
func (t *Tokenizer) completeLocal(key digest, cl *call, req truncater, res result, err error) ([]uint32, error) {
	t.cache.complete(key, cl, res, err)
	if err != nil {
		return nil, err
	}
	return req.truncate(res)
}

// await returns what a caller that waits for cl gets. again reports that
// it should try again instead: it shared the tokenization in process of a
// caller that left, and is still waiting itself.
func (t *Tokenizer) await(ctx context.Context, cl *call, model string, req truncater) (ids []uint32, again bool, err error) {
	res, err := t.wait(ctx, cl, model)
	switch {
	case errors.Is(err, errLeft) && ctx.Err() == nil:
		return nil, true, nil
	case err != nil:
		return nil, false, err
	}
	ids, err = req.truncate(res)
	return ids, false, err
}

// start completes cl: at once with an input error when the request could
// not be encoded, otherwise with the result of a call made in the
// background, so that the leader's caller can stop waiting without failing
// the callers that share the call. slot says the call holds a background
// slot, released when the call ends. It reports whether it made the call.
func (t *Tokenizer) start(key digest, cl *call, baseURL, model string, body []byte, err error, slot bool) bool {
	var req *http.Request
	if err == nil {
		req, err = t.newCallRequest(baseURL, body)
	}
	if err != nil {
		t.cache.complete(key, cl, result{}, inputError(model, err))
		return false
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.cache.complete(key, cl, result{}, &Error{Reason: ReasonCanceled, Model: model,
			Endpoint: req.URL.String(), Err: errors.New("tokenizer closed")})
		return false
	}
	t.calls.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.calls.Done()
		if slot {
			defer t.releaseBackgroundSlot()
		}
		res, err := t.call(req, model)
		t.cache.complete(key, cl, res, err)
	}()
	return true
}

// wait returns cl's outcome, or a ReasonCanceled error when ctx ends first.
func (t *Tokenizer) wait(ctx context.Context, cl *call, model string) (result, error) {
	select {
	case <-cl.done:
		return cl.res, cl.err
	case <-ctx.Done():
		return result{}, &Error{Reason: ReasonCanceled, Model: model, Err: ctx.Err()}
	}
}
