package gateway

import (
	"cmp"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/discovery"
	"github.com/kvgate/kvgate/pkg/internal/apikey"
	"github.com/kvgate/kvgate/pkg/redisstate"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/slo"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"github.com/kvgate/kvgate/pkg/types"
)

// Defaults of Config's zero fields.
const (
	DefaultMaxRequestBodyBytes = 16 << 20
	// DefaultMaxHeldRequestBytes bounds the request bytes held at once.
	DefaultMaxHeldRequestBytes = 256 << 20
	// DefaultMaxClientConnections bounds the client connections the API
	// listener holds open at once.
	DefaultMaxClientConnections = 10000
	DefaultShutdownTimeout      = 30 * time.Second
	// DefaultRequestBodyTimeout bounds reading a request's body.
	DefaultRequestBodyTimeout = 30 * time.Second
	// DefaultClientWriteTimeout bounds each write to a client.
	DefaultClientWriteTimeout = time.Minute
	// DefaultDialTimeout bounds connecting to a pod; a pod that does not
	// accept within it is treated as unreachable and the request is
	// retried on another pod.
	DefaultDialTimeout = 5 * time.Second
	// DefaultFirstByteTimeout bounds the wait for a pod's response
	// headers: a completion that is not streamed answers only once it is
	// generated.
	DefaultFirstByteTimeout = 10 * time.Minute
	// DefaultUpstreamIdleTimeout bounds each wait for more of a response's
	// body, the next event of a stream among them.
	DefaultUpstreamIdleTimeout = 5 * time.Minute
	// DefaultResponseTimeout bounds a whole response, from the request
	// sent to a pod to the last byte written to the client.
	DefaultResponseTimeout = time.Hour
	// DefaultRequestTTL is how long a request may stay in flight without
	// an end before the request ledger reaps it: beyond the longest a
	// request is served with the default timeouts (see
	// Config.LongestRequest), 1 h 1 min 5 s.
	DefaultRequestTTL = 3700 * time.Second
	// DefaultMaxStreamEventBytes bounds the bytes of one server-sent event
	// of a pod's stream the gateway holds to read it.
	DefaultMaxStreamEventBytes = 1 << 20
	// DefaultMaxIdleConnsPerPod is how many keep-alive connections to each
	// pod are kept open between requests.
	DefaultMaxIdleConnsPerPod = 256
	// DefaultPodConnIdleTTL is how long a keep-alive connection to a pod
	// may stay unused before it is closed.
	DefaultPodConnIdleTTL = 90 * time.Second
)

// Config configures a Gateway: every setting typed, read from kvgate's
// environment variables and flags by LoadConfig. The library configurations
// it holds (Tokenizer, Routing, Cache) are completed by New with what the
// gateway owns: metrics registry, logger, Store and index.
type Config struct {
	// ListenAddress is where Run serves, host:port (KVGATE_LISTEN_ADDRESS).
	ListenAddress string
	// AdminListenAddress, when set, is where Run and Serve serve /metrics
	// and /debug/*, which the API's listener then does not serve; /healthz
	// and /readyz are served on both (KVGATE_ADMIN_LISTEN_ADDRESS). Empty
	// serves everything on the API's listener.
	AdminListenAddress string
	// MaxRequestBodyBytes bounds a request body; a larger one is answered
	// with 413 (KVGATE_MAX_REQUEST_BODY_BYTES, default 16 MiB).
	MaxRequestBodyBytes int64
	// ShutdownDelay is how long Serve goes on serving, with /readyz
	// answering 503, once its context ends, so that load balancers stop
	// sending requests before the listener closes (KVGATE_SHUTDOWN_DELAY,
	// which LoadConfig defaults to 5 s; zero stops at once). Responses of
	// the API listener meanwhile carry Connection: close.
	ShutdownDelay time.Duration
	// ShutdownTimeout bounds how long Serve then waits for requests in
	// flight (KVGATE_SHUTDOWN_TIMEOUT, default 30 s).
	ShutdownTimeout time.Duration
	// RequestBodyTimeout bounds reading a request's body, from its
	// headers; a slower body is answered with 408 and its connection
	// closed (KVGATE_REQUEST_BODY_TIMEOUT, DefaultRequestBodyTimeout when
	// 0).
	RequestBodyTimeout time.Duration
	// MaxHeldRequestBytes bounds the bytes of request bodies held at once,
	// over every request; one that would pass it is refused with 503
	// (KVGATE_MAX_HELD_REQUEST_BYTES, DefaultMaxHeldRequestBytes when 0).
	MaxHeldRequestBytes int64
	// MaxClientConnections bounds the client connections the API listener
	// holds open at once: at the bound, Serve accepts no more until one
	// closes, and the others wait in the kernel's listen backlog
	// (KVGATE_MAX_CLIENT_CONNECTIONS, DefaultMaxClientConnections when 0).
	// The admin listener has no bound.
	MaxClientConnections int
	// ClientWriteTimeout bounds each write to a client of the API
	// listener: a client that reads nothing for this long has its
	// connection closed and its request ended
	// (KVGATE_CLIENT_WRITE_TIMEOUT, DefaultClientWriteTimeout when 0).
	ClientWriteTimeout time.Duration
	// DialTimeout bounds connecting to a pod
	// (KVGATE_UPSTREAM_CONNECT_TIMEOUT, DefaultDialTimeout when 0).
	DialTimeout time.Duration
	// FirstByteTimeout bounds the wait for a pod's response headers once
	// the request was sent: 504 beyond it
	// (KVGATE_UPSTREAM_FIRST_BYTE_TIMEOUT, DefaultFirstByteTimeout when
	// 0).
	FirstByteTimeout time.Duration
	// UpstreamIdleTimeout bounds each wait for more of a response's body:
	// beyond it the response fails, with 504 when nothing was relayed yet
	// (KVGATE_UPSTREAM_IDLE_TIMEOUT, DefaultUpstreamIdleTimeout when 0).
	UpstreamIdleTimeout time.Duration
	// ResponseTimeout bounds a whole response, from the request sent to a
	// pod to the last byte written to the client, however steadily the pod
	// sends and the client reads: beyond it the response fails as after
	// UpstreamIdleTimeout, and the pod's connection is closed. It must be
	// at least FirstByteTimeout (KVGATE_UPSTREAM_RESPONSE_TIMEOUT,
	// DefaultResponseTimeout when 0).
	ResponseTimeout time.Duration
	// MaxStreamEventBytes bounds the bytes of a server-sent event of a
	// stream the gateway holds whole to read it; a longer event is relayed
	// as it comes, unread (a first token or usage it carries missed), and
	// counted (KVGATE_MAX_STREAM_EVENT_BYTES, DefaultMaxStreamEventBytes
	// when 0).
	MaxStreamEventBytes int
	// MaxStoredResponses bounds the OpenAI Responses API responses whose
	// engine the gateway remembers, so that the requests needing a
	// response an engine stored go to that engine: beyond it the oldest
	// are forgotten, and counted (KVGATE_MAX_STORED_RESPONSES,
	// DefaultMaxStoredResponses when 0).
	MaxStoredResponses int
	// MaxIdleConnsPerPod bounds the keep-alive connections kept to each
	// pod (DefaultMaxIdleConnsPerPod when 0).
	MaxIdleConnsPerPod int
	// DisableProxy keeps the OpenAI API off the listener, which then serves
	// the probes, /metrics and /debug alone, for a gateway that takes its
	// requests through an attached frontend only (KVGATE_PROXY_ENABLED
	// false).
	DisableProxy bool
	// DisableDPRankRouting keeps the gateway from naming the data-parallel
	// rank a request runs on (X-Data-Parallel-Rank) for pods serving
	// several ranks behind one port (KVGATE_DP_RANK_ROUTING false): the
	// engine then balances every request over its ranks by load.
	DisableDPRankRouting bool

	// Discovery says where pods come from, and Kubeconfig (KUBECONFIG, a
	// list of files) how to reach Kubernetes; empty means in-cluster.
	Discovery  config.Discovery
	Kubeconfig string
	// PodSource, when set, replaces the source Discovery describes, for a
	// program with discovery of its own; RestConfig is then handed to it.
	PodSource  cache.PodSource
	RestConfig *rest.Config
	// Objectives, when set, looks up the priority of the InferenceObjective
	// a request names (HeaderInferenceObjective) in place of the
	// InferenceObjectives the inferencepool discovery reads. Without it,
	// in the other discovery modes, every request has priority 0.
	Objectives ObjectivePriorities
	// ModelRewrites, when set, rewrites the model of each request before
	// it is routed (see HeaderModelRewrite, which wins over it). Unset,
	// inferencepool discovery (without PodSource) reads the
	// InferenceModelRewrites of the pools it follows
	// (discovery.ModelRewriteSource); other discovery rewrites by the
	// header alone.
	ModelRewrites ModelRewriter

	// KVSync configures KV event sync and the prefix index.
	KVSync config.KVSync

	// RemoteTokenizer tokenizes prompts with the engines' /tokenize
	// (AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER); TokenizerEndpointTemplate
	// is a pod's vLLM server URL with %s for its IP
	// (AIBRIX_VLLM_TOKENIZER_ENDPOINT_TEMPLATE, see TokenizerURL).
	RemoteTokenizer           bool
	TokenizerEndpointTemplate string
	// Tokenizer configures the tokenizer; its Logger is set by New.
	Tokenizer tokenizer.Config

	// Routing configures the router; Index, Registerer and Logger are set
	// by New.
	Routing routing.Config
	// Cache configures the Store; Registerer and Logger are set by New.
	Cache cache.Config
	// Predictor sizes the output predictors.
	Predictor cache.PredictorConfig
	// SLO sets the models' objectives and bounds their queues, for the
	// SLO-aware routing algorithms.
	SLO slo.Config
	// Saturation says when a model's pods are saturated, and its sheddable
	// requests refused; DefaultSaturation when zero.
	Saturation SaturationConfig
	// FlowControl holds the generating requests of the algorithms that
	// are not SLO-aware in their model's queue while its pods are
	// saturated (KVGATE_FLOW_CONTROL; see Gateway.queued).
	FlowControl bool
	// RequestTTL is how long a request may stay in flight without an end
	// before the request ledger reaps it (KVGATE_REQUEST_TTL_SECONDS,
	// DefaultRequestTTL when 0). It must exceed LongestRequest, so that
	// no request still being served is reaped.
	RequestTTL time.Duration
	// Redis is the Redis server and the state the gateway keeps there.
	Redis RedisConfig

	// ExtProc configures the Envoy external processor that cmd/gateway
	// attaches (see Attach and package extproc); the gateway itself only
	// carries it.
	ExtProc config.ExtProc

	// Logger receives the gateway's logs (klog's global logger when zero).
	Logger klog.Logger
}

// RedisConfig locates the Redis server and says what the gateway keeps
// there (see package redisstate). Each feature needs Address.
type RedisConfig struct {
	// Address is host:port; empty runs without Redis
	// (KVGATE_REDIS_ADDRESS).
	Address string
	// Password authenticates, empty for none (KVGATE_REDIS_PASSWORD).
	Password string

	// RequestTraces writes per-model request traces
	// (AIBRIX_GPU_OPTIMIZER_TRACING_FLAG), windows of Traces.Interval.
	RequestTraces bool
	Traces        redisstate.TracerConfig
	// GPUProfiles loads the GPU profiles of deployments
	// (AIBRIX_MODEL_GPU_PROFILE_CACHING_FLAG), every
	// Profiles.RefreshInterval.
	GPUProfiles bool
	Profiles    redisstate.ProfileLoaderConfig
	// SharedCounts shares the running requests of gateway replicas, their
	// prompt blocks in flight and output histories
	// (KVGATE_SHARED_REQUEST_COUNTS), configured by Shared
	// (KVGATE_SHARED_STATE_*, KVGATE_SHARED_MAX_BLOCKS).
	SharedCounts bool
	Shared       redisstate.SharedCountsConfig
	// StoredResponses shares which engine made each Responses API
	// response the replicas relayed (KVGATE_SHARED_STORED_RESPONSES),
	// configured by Stored (KVGATE_STORED_RESPONSE_TTL_SECONDS,
	// KVGATE_STORED_RESPONSE_LOOKUP_TIMEOUT_MS).
	StoredResponses bool
	Stored          redisstate.StoredResponsesConfig
}

// LoadConfig reads a Config from e, recording in e every malformed value
// and every combination that cannot work: an admin address equal to the
// listen address, an unknown routing algorithm, a
// tokenizer template that is not a URL, KV event sync without the remote
// tokenizer, a static endpoints file or kubeconfig that cannot be read, or
// a Redis feature enabled explicitly without a Redis address. A Redis
// feature on by default is turned off without Redis. Check e.Err() before
// using the result.
func LoadConfig(e *config.Env) Config {
	cfg := Config{
		ListenAddress:             e.String(config.ListenAddress),
		AdminListenAddress:        e.String(config.AdminListenAddress),
		MaxRequestBodyBytes:       int64(e.Int(config.MaxRequestBodyBytes, 1)),
		MaxHeldRequestBytes:       int64(e.Int(config.MaxHeldRequestBytes, 1)),
		MaxClientConnections:      e.Int(config.MaxClientConnections, 1),
		ShutdownDelay:             e.DurationOrZero(config.ShutdownDelay, time.Second),
		ShutdownTimeout:           e.Duration(config.ShutdownTimeout, time.Second),
		RequestBodyTimeout:        e.Duration(config.RequestBodyTimeout, time.Second),
		ClientWriteTimeout:        e.Duration(config.ClientWriteTimeout, time.Second),
		DialTimeout:               e.Duration(config.UpstreamConnectTimeout, time.Second),
		FirstByteTimeout:          e.Duration(config.UpstreamFirstByteTimeout, time.Second),
		UpstreamIdleTimeout:       e.Duration(config.UpstreamIdleTimeout, time.Second),
		ResponseTimeout:           e.Duration(config.UpstreamResponseTimeout, time.Second),
		MaxStreamEventBytes:       e.Int(config.MaxStreamEventBytes, 1),
		MaxStoredResponses:        e.Int(config.MaxStoredResponses, 1),
		DisableProxy:              !e.Bool(config.ProxyEnabled),
		DisableDPRankRouting:      !e.Bool(config.DPRankRouting),
		Discovery:                 config.LoadDiscovery(e),
		Kubeconfig:                e.String(config.Kubeconfig),
		KVSync:                    config.LoadKVSync(e),
		RemoteTokenizer:           e.Bool(config.UseRemoteTokenizer),
		TokenizerEndpointTemplate: e.String(config.TokenizerEndpointTemplate),
		Tokenizer:                 loadTokenizer(e),
		Routing:                   loadRouting(e),
		SLO:                       loadSLO(e),
		RequestTTL:                e.Duration(config.RequestTTL, time.Second),
		Redis:                     loadRedis(e),
		ExtProc:                   config.LoadExtProc(e),
	}
	cfg.Cache = loadCache(e)
	cfg.Saturation = loadSaturation(e, cfg.Cache.PodMetricRefreshInterval)
	cfg.FlowControl = e.Bool(config.FlowControl)
	cfg.Cache.EngineAPIKey = e.String(config.EngineAPIKey)
	cfg.Tokenizer.APIKey = cfg.Cache.EngineAPIKey
	if err := apikey.Check(cfg.Cache.EngineAPIKey); err != nil {
		e.Errorf("%s: %v", config.EngineAPIKey.Name, err) // never the key itself
	}
	if _, _, err := net.SplitHostPort(cfg.ListenAddress); err != nil {
		e.Errorf("%s=%q: want host:port, e.g. :8080: %v", config.ListenAddress.Name, cfg.ListenAddress, err)
	}
	if a := cfg.AdminListenAddress; a != "" {
		if _, _, err := net.SplitHostPort(a); err != nil {
			e.Errorf("%s=%q: want host:port, e.g. 127.0.0.1:9090, or empty: %v", config.AdminListenAddress.Name, a, err)
		} else if a == cfg.ListenAddress {
			e.Errorf("%s=%q is also %s: the admin endpoints need an address of their own", config.AdminListenAddress.Name, a,
				config.ListenAddress.Name)
		}
	}
	if cfg.Tokenizer.LocalDir != "" && !cfg.RemoteTokenizer {
		e.Errorf("%s is set but %s is false: in-process tokenization is verified against the engines' and falls back to it",
			config.TokenizerDir.Name, config.UseRemoteTokenizer.Name)
	}
	if _, err := parseTokenizerTemplate(cfg.TokenizerEndpointTemplate); err != nil {
		e.Errorf("%s=%q: %v", config.TokenizerEndpointTemplate.Name, cfg.TokenizerEndpointTemplate, err)
	}
	checkDeadPodTimeout(e, cfg)
	if err := cfg.withDefaults().checkRequestTTL(); err != nil {
		e.Errorf("%v", err)
	}
	checkFiles(e, cfg)
	return cfg
}

// LongestRequest returns the longest the gateway serves a request, of a
// Config with its defaults, from its admission to the request ledger
// (once its body was read) to its end: its tokenization with the remote
// tokenizer, its wait in its model's SLO queue, and its response.
func (c Config) LongestRequest() time.Duration {
	d := c.SLO.MaxWait + c.ResponseTimeout
	if c.RemoteTokenizer {
		d += cmp.Or(c.Tokenizer.Timeout, tokenizer.DefaultTimeout)
	}
	return d
}

// checkRequestTTL refuses, in a Config with its defaults, a request TTL
// that does not exceed LongestRequest: the ledger would reap a request
// still being served, and forget its load on its pod.
func (c Config) checkRequestTTL() error {
	longest := c.LongestRequest()
	if c.RequestTTL > longest {
		return nil
	}
	parts := ""
	if c.RemoteTokenizer {
		parts = fmt.Sprintf("%s (%v) + ", config.TokenizerRequestTimeout.Name, cmp.Or(c.Tokenizer.Timeout, tokenizer.DefaultTimeout))
	}
	return fmt.Errorf("%s (%v) must exceed %v, the longest a request is served once admitted: %s%s (%v) + %s (%v); "+
		"a request still served beyond the TTL is dropped from its pod's load", config.RequestTTL.Name, c.RequestTTL, longest,
		parts, config.SLOQueueMaxWait.Name, c.SLO.MaxWait, config.UpstreamResponseTimeout.Name, c.ResponseTimeout)
}

// checkDeadPodTimeout records a dead-pod timeout too short for the scrapes
// to speak for an engine whose events are quiet: it must hold two whole
// scrapes.
func checkDeadPodTimeout(e *config.Env, cfg Config) {
	k, c := cfg.KVSync, cfg.Cache
	scrape := c.PodMetricRefreshInterval + cmp.Or(c.PodMetricScrapeTimeout, cache.DefaultPodMetricScrapeTimeout)
	if k.Enabled && c.PodMetricRefreshInterval > 0 && k.DeadPodTimeout > 0 && k.DeadPodTimeout <= 2*scrape {
		e.Errorf("%s=%v must exceed %v, twice %s (%v) plus the %v scrape timeout: an engine whose events are quiet "+
			"must have two chances to answer its scrapes within it", config.KVEventsDeadPodTimeout.Name, k.DeadPodTimeout,
			2*scrape, config.PodMetricRefreshInterval.Name, c.PodMetricRefreshInterval,
			cmp.Or(c.PodMetricScrapeTimeout, cache.DefaultPodMetricScrapeTimeout))
	}
}

// loadRouting reads the router's settings.
func loadRouting(e *config.Env) routing.Config {
	r := routing.Config{
		DefaultAlgorithm:              e.String(config.RoutingAlgorithm),
		CPUCacheWeight:                e.Float(config.RoutingCPUCacheWeight, 0),
		DefaultPrefillTokensPerSecond: e.Float(config.RoutingDefaultPrefillSpeed, routing.MinPrefillTokensPerSecond),
		TieTolerance:                  routing.TieToleranceSetting(e.Float(config.RoutingTieTolerance, 0)),
		MinFleetQueue:                 e.Float(config.RoutingMinFleetQueue, 0),
		ImbalanceAbsCount:             e.Int(config.PrefixCacheImbalanceAbsCount, 1),
		StdDevFactor:                  routing.StdDevFactorSetting(e.Float(config.PrefixCacheStdDevFactor, 0)),
		MaxInFlightPrefixBlocks:       e.Int(config.RoutingMaxInFlightPrefixBlocks, 1),
	}
	if !routing.IsAlgorithm(r.DefaultAlgorithm) {
		e.Errorf("%s=%q: want one of %s", config.RoutingAlgorithm.Name, r.DefaultAlgorithm,
			strings.Join(routing.Algorithms(), ", "))
	}
	if r.CPUCacheWeight <= 0 || r.CPUCacheWeight > 1 {
		e.Errorf("%s=%v: want a number in (0, 1]", config.RoutingCPUCacheWeight.Name, r.CPUCacheWeight)
	}
	r.MinFleetQueue = routing.MinFleetQueueSetting(r.MinFleetQueue)
	return r
}

// loadSLO reads the objectives and the queues' bounds.
func loadSLO(e *config.Env) slo.Config {
	c := slo.Config{
		Default: types.SLO{
			TTFT:               e.DurationOrZero(config.SLOTTFT, time.Second),
			TTFTPerPromptToken: e.DurationOrZero(config.SLOTTFTPerPromptToken, time.Second),
			TPOT:               e.DurationOrZero(config.SLOTPOT, time.Second),
			E2E:                e.DurationOrZero(config.SLOE2E, time.Second),
		},
		MaxQueueLength: e.Int(config.SLOQueueMaxLength, 1),
		MaxWait:        e.Duration(config.SLOQueueMaxWait, time.Second),
		Fairness:       e.String(config.SLOQueueFairness),
	}
	if !slices.Contains(slo.FairnessPolicies, c.Fairness) {
		e.Errorf("%s=%q: want one of %s", config.SLOQueueFairness.Name, c.Fairness, strings.Join(slo.FairnessPolicies, ", "))
	}
	models, err := slo.ParseModels(e.String(config.SLOModels))
	if err != nil {
		e.Errorf("%s: %v", config.SLOModels.Name, err)
	}
	c.Models = models
	return c
}

// loadCache reads the Store's settings.
func loadCache(e *config.Env) cache.Config {
	adapters := e.DurationOrZero(config.AdapterRefreshInterval, time.Second)
	if adapters == 0 {
		adapters = -1 // the Store's way of saying off
	}
	return cache.Config{
		PodMetricRefreshInterval: e.Duration(config.PodMetricRefreshInterval, time.Millisecond),
		AdapterRefreshInterval:   adapters,
		MaxAdaptersPerPod:        e.Int(config.MaxAdaptersPerPod, 1),
		DeploymentLabel:          e.String(config.PodDeploymentLabel),
		RayClusterFleetLabel:     e.String(config.PodRayClusterFleetLabel),
	}
}

// loadRedis reads the Redis server, from KVGATE_REDIS_ADDRESS or AIBrix's
// REDIS_HOST and REDIS_PORT (which may not name another server), and its
// features. Features on by
// default are off without Redis; one enabled explicitly without Redis is
// an error.
func loadRedis(e *config.Env) RedisConfig {
	rc := RedisConfig{Address: e.String(config.RedisAddress), Password: e.String(config.RedisPassword)}
	host, port := e.String(config.RedisHost), e.Int(config.RedisPort, 1)
	if host != "" {
		aibrix := net.JoinHostPort(host, strconv.Itoa(port))
		switch rc.Address {
		case "":
			rc.Address = aibrix
		case aibrix:
		default:
			e.Errorf("%s=%q and %s=%q with %s name different Redis servers: set only one", config.RedisAddress.Name, rc.Address,
				config.RedisHost.Name, host, config.RedisPort.Name)
		}
	}
	feature := func(v config.Var) bool {
		on := e.Bool(v)
		if on && rc.Address == "" {
			if e.IsSet(v) {
				e.Errorf("%s is true but needs Redis: set %s", v.Name, config.RedisAddress.Name)
			}
			return false
		}
		return on
	}
	rc.RequestTraces = feature(config.RequestTracing)
	rc.GPUProfiles = feature(config.ProfileCaching)
	rc.SharedCounts = feature(config.SharedRequestCounts)
	rc.Shared.Interval = e.Duration(config.SharedStateInterval, time.Millisecond)
	rc.Shared.TTL = e.Duration(config.SharedStateTTL, time.Millisecond)
	rc.Shared.MaxBlocks = e.Int(config.SharedMaxBlocks, 1)
	rc.StoredResponses = feature(config.SharedStoredResponses)
	rc.Stored.TTL = e.Duration(config.StoredResponseTTL, time.Second)
	rc.Stored.LookupTimeout = e.Duration(config.StoredResponseLookupTimeout, time.Millisecond)
	if rc.Stored.TTL%time.Second != 0 {
		e.Errorf("%s (%v) must be a whole number of seconds", config.StoredResponseTTL.Name, rc.Stored.TTL)
	}
	if rc.Shared.TTL <= rc.Shared.Interval {
		e.Errorf("%s (%v) must exceed %s (%v)", config.SharedStateTTL.Name, rc.Shared.TTL, config.SharedStateInterval.Name, rc.Shared.Interval)
	}
	return rc
}

// checkFiles records the files cfg names that cannot be used: a static
// endpoints file that cannot be read or parsed, a kubeconfig that does not
// exist.
func checkFiles(e *config.Env, cfg Config) {
	switch cfg.Discovery.Mode {
	case config.DiscoveryStatic:
		if cfg.Discovery.StaticFile == "" {
			return
		}
		data, err := os.ReadFile(cfg.Discovery.StaticFile)
		if err == nil {
			_, err = discovery.ParseStaticFile(data)
		}
		if err != nil {
			e.Errorf("%s=%q: %v", config.StaticEndpointsFile.Name, cfg.Discovery.StaticFile, err)
		}
	case config.DiscoveryKubernetes, config.DiscoveryInferencePool:
		for _, path := range filepath.SplitList(cfg.Kubeconfig) {
			if _, err := os.Stat(path); err != nil {
				e.Errorf("%s=%q: %v", config.Kubeconfig.Name, cfg.Kubeconfig, err)
			}
		}
	}
}

// loadTokenizer reads the tokenizer's settings.
func loadTokenizer(e *config.Env) tokenizer.Config {
	c := tokenizer.Config{
		Timeout:            e.Duration(config.TokenizerRequestTimeout, time.Second),
		CacheMaxTokens:     e.Int(config.TokenizerCacheMaxTokens, 1),
		LocalDir:           e.String(config.TokenizerDir),
		VerifyFraction:     e.Float(config.TokenizerVerifyFraction, 0),
		NoPrefixReuse:      !e.Bool(config.TokenizerPrefixReuse),
		MaxBackgroundCalls: e.Int(config.TokenizerMaxBackgroundCalls, 1),
		LocalMaxBytes:      e.Int(config.TokenizerLocalMaxBytes, 1),
		Reasoning:          e.String(config.TokenizerReasoning),
	}
	if !slices.Contains(tokenizer.ReasoningSettings, c.Reasoning) {
		e.Errorf("%s=%q: want one of %s", config.TokenizerReasoning.Name, c.Reasoning, strings.Join(tokenizer.ReasoningSettings, ", "))
	}
	switch {
	case c.VerifyFraction > 1:
		e.Errorf("%s=%v: want a share between 0 and 1", config.TokenizerVerifyFraction.Name, c.VerifyFraction)
	case c.VerifyFraction == 0:
		c.VerifyFraction = -1 // tokenizer.Config's "none"
	}
	return c
}
