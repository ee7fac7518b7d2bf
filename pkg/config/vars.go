package config

// Sections of the configuration reference, in the order they are rendered.
const (
	SectionGateway   = "Gateway"
	SectionKVSync    = "KV event sync"
	SectionIndex     = "Prefix index"
	SectionTokenizer = "Tokenizer"
	SectionRouting   = "Routing"
	SectionMetrics   = "Pod metrics"
	SectionRedis     = "Redis: request traces, shared counts, GPU profiles"
)

// Sections lists the configuration reference's sections in order.
var Sections = []string{SectionGateway, SectionExtProc, SectionDiscovery, SectionKVSync, SectionIndex, SectionTokenizer,
	SectionRouting, SectionSLO, SectionMetrics, SectionRedis}

// Gateway.
var (
	ListenAddress = Var{
		Name:    "KVGATE_LISTEN_ADDRESS",
		Default: ":8080",
		Section: SectionGateway,
		Doc: "Address the gateway serves the OpenAI API, /healthz and /readyz on, as host:port, and /metrics and /debug " +
			"unless KVGATE_ADMIN_LISTEN_ADDRESS is set.",
		Flag: "listen-address",
	}
	AdminListenAddress = Var{
		Name:    "KVGATE_ADMIN_LISTEN_ADDRESS",
		Default: "",
		Section: SectionGateway,
		Doc: "When set (host:port, e.g. 127.0.0.1:9090), /metrics and /debug are served only on this address, which " +
			"clients of the API need not reach, and /healthz and /readyz on both; empty serves everything on " +
			"KVGATE_LISTEN_ADDRESS. Go's profiles (/debug/pprof/) are served only here. None of the endpoints authenticate.",
		Flag: "admin-listen-address",
	}
	MaxRequestBodyBytes = Var{
		Name:    "KVGATE_MAX_REQUEST_BODY_BYTES",
		Default: "16777216",
		Section: SectionGateway,
		Doc:     "Largest request body accepted, in bytes; a larger one is refused with 413.",
		Flag:    "max-request-body-bytes",
	}
	MaxHeldRequestBytes = Var{
		Name:    "KVGATE_MAX_HELD_REQUEST_BYTES",
		Default: "268435456",
		Section: SectionGateway,
		Doc: "Most bytes of request bodies the gateway holds at once, over every request being read, waiting for a " +
			"pod or in an SLO queue, and being forwarded, through the proxy and ext_proc alike; a request that would " +
			"pass it is refused with 503 gateway_overloaded and a Retry-After. At least " +
			"KVGATE_MAX_REQUEST_BODY_BYTES.",
		Flag: "max-held-request-bytes",
	}
	MaxClientConnections = Var{
		Name:    "KVGATE_MAX_CLIENT_CONNECTIONS",
		Default: "10000",
		Section: SectionGateway,
		Doc: "Most client connections the API listener (KVGATE_LISTEN_ADDRESS) holds open at once. At the bound the " +
			"gateway accepts no more until one closes: new connections wait in the kernel's listen backlog " +
			"(net.core.somaxconn) and their clients for the connection's first answer; beyond the backlog the " +
			"kernel drops connection attempts, which clients retry for seconds before they time out. Each time " +
			"the bound is reached is counted in kvgate_gateway_client_connection_limit_waits_total. An idle " +
			"keep-alive connection costs the gateway about 27 KB of memory (its read and write buffers and its " +
			"goroutine's stack: 270 MB at the default); one reading or answering a request holds that request's " +
			"buffers besides. The admin listener (KVGATE_ADMIN_LISTEN_ADDRESS), for " +
			"operators, has no bound. At least 1.",
		Flag: "max-client-connections",
	}
	ShutdownTimeout = Var{
		Name:    "KVGATE_SHUTDOWN_TIMEOUT",
		Default: "30",
		Section: SectionGateway,
		Doc: "Once the gateway stops accepting connections on SIGINT or SIGTERM, how long requests in flight (streams included) " +
			"may take to finish before they are cut, in seconds or with a unit (\"1m\").",
		Flag: "shutdown-timeout",
	}
	RequestTTL = Var{
		Name:    "KVGATE_REQUEST_TTL_SECONDS",
		Default: "3700",
		Section: SectionGateway,
		Doc: "A request in flight whose end the gateway never recorded stops counting after this long, in seconds or " +
			"with a unit (\"1h\"): as load on its pod, as prefill work queued there, in request traces and shared " +
			"counts. Requests that outlive it are counted in kvgate_cache_requests_expired_total. It must exceed the " +
			"longest a request is served: AIBRIX_TOKENIZER_REQUEST_TIMEOUT (with the remote tokenizer) + " +
			"KVGATE_SLO_QUEUE_MAX_WAIT + KVGATE_UPSTREAM_RESPONSE_TIMEOUT. Under ext_proc, Envoy's route timeout bounds a " +
			"response instead, and must leave the same margin.",
	}
	ShutdownDelay = Var{
		Name:    "KVGATE_SHUTDOWN_DELAY",
		Default: "5",
		Section: SectionGateway,
		Doc: "On SIGINT or SIGTERM, how long the gateway keeps serving, with /readyz answering 503, before it stops " +
			"accepting connections, in seconds or with a unit (\"500ms\"): load balancers and Kubernetes endpoints " +
			"see the drain and stop sending requests before connections are refused. Meanwhile every API response carries " +
			"Connection: close and its connection closes, so that keep-alive clients reconnect elsewhere. Kubernetes takes " +
			"a few seconds to remove a terminating pod's endpoint everywhere; 0 stops at once.",
		Flag: "shutdown-delay",
	}
	RequestBodyTimeout = Var{
		Name:    "KVGATE_REQUEST_BODY_TIMEOUT",
		Default: "30",
		Section: SectionGateway,
		Doc: "Longest time a request's body may take to arrive once its headers have, in seconds or with a unit (\"10s\"); " +
			"a slower one is answered with 408 and its connection closed, so that clients holding bodies open cannot " +
			"hold connections. Headers must arrive within 10 s.",
		Flag: "request-body-timeout",
	}
	ClientWriteTimeout = Var{
		Name:    "KVGATE_CLIENT_WRITE_TIMEOUT",
		Default: "60",
		Section: SectionGateway,
		Doc: "Longest time one write to a client may block, in seconds or with a unit (\"30s\"): a client that reads " +
			"nothing of its response for this long has its connection closed and its request ended, so that it " +
			"cannot hold a pod's generation, a connection and the request's buffers. Each write has the whole time: " +
			"a slow reader that keeps reading is not cut.",
		Flag: "client-write-timeout",
	}
	UpstreamConnectTimeout = Var{
		Name:    "KVGATE_UPSTREAM_CONNECT_TIMEOUT",
		Default: "5",
		Section: SectionGateway,
		Doc: "Longest time connecting to a pod may take, in seconds or with a unit (\"500ms\"); a pod that does not " +
			"accept in time is ejected from routing like one that refuses, and the request goes to another pod.",
		Flag: "upstream-connect-timeout",
	}
	UpstreamFirstByteTimeout = Var{
		Name:    "KVGATE_UPSTREAM_FIRST_BYTE_TIMEOUT",
		Default: "600",
		Section: SectionGateway,
		Doc: "Longest wait for a pod's response headers once the request was sent, in seconds or with a unit (\"2m\"); " +
			"beyond it the request fails with 504 upstream_timeout. A completion that is not streamed answers only " +
			"once it is generated: allow for the longest generation.",
		Flag: "upstream-first-byte-timeout",
	}
	UpstreamIdleTimeout = Var{
		Name:    "KVGATE_UPSTREAM_IDLE_TIMEOUT",
		Default: "300",
		Section: SectionGateway,
		Doc: "Longest wait for more of a pod's response body, the next event of a stream among them, in seconds or " +
			"with a unit (\"1m\"); beyond it the response fails: 504 upstream_timeout when nothing was relayed yet, an " +
			"error event and a cut connection otherwise.",
		Flag: "upstream-idle-timeout",
	}
	UpstreamResponseTimeout = Var{
		Name:    "KVGATE_UPSTREAM_RESPONSE_TIMEOUT",
		Default: "3600",
		Section: SectionGateway,
		Doc: "Longest time a response may take, from the request sent to a pod to the last byte written to the " +
			"client, in seconds or with a unit (\"30m\"), however steadily the engine sends and the client reads; " +
			"beyond it the response fails and the pod's connection is closed, which cancels the generation: 504 " +
			"upstream_timeout when nothing was relayed yet, an error event and a cut connection otherwise. At least " +
			"KVGATE_UPSTREAM_FIRST_BYTE_TIMEOUT.",
		Flag: "upstream-response-timeout",
	}
	MaxStreamEventBytes = Var{
		Name:    "KVGATE_MAX_STREAM_EVENT_BYTES",
		Default: "1048576",
		Section: SectionGateway,
		Doc: "Longest server-sent event of a pod's stream the gateway holds whole to read it (its first token, its " +
			"usage), in bytes. A longer event is passed on to the client as it comes, unread, and counted (by the " +
			"proxy and under ext_proc alike): the first token or usage it carries is missed, and a usage chunk the " +
			"gateway asked for on the client's behalf reaches the client. Raise it when long answers end in " +
			"oversized events (OpenAI Responses' response.completed carries the whole output).",
		Flag: "max-stream-event-bytes",
	}
	MaxStoredResponses = Var{
		Name:    "KVGATE_MAX_STORED_RESPONSES",
		Default: "100000",
		Section: SectionGateway,
		Doc: "Most OpenAI Responses API responses whose engine the gateway remembers (about 200 bytes each), the oldest " +
			"forgotten first. vLLM started with VLLM_ENABLE_RESPONSES_API_STORE=1 keeps the responses it makes in its own " +
			"memory: a request naming one as its previous_response_id goes to the engine that made it, and so do GET " +
			"/v1/responses/{id} and POST /v1/responses/{id}/cancel; a response the gateway forgot is answered 404 by them, " +
			"and its follow-up is routed as any request. Each gateway replica remembers the responses it relayed and, with " +
			"Redis, those the others relayed within KVGATE_STORED_RESPONSE_TTL_SECONDS (KVGATE_SHARED_STORED_RESPONSES).",
		Flag: "max-stored-responses",
	}
	EngineAPIKey = Var{
		Name:    "KVGATE_ENGINE_API_KEY",
		Default: "",
		Section: SectionGateway,
		Doc: "API key of engines started with vLLM's --api-key (or VLLM_API_KEY), sent as \"Authorization: Bearer " +
			"<key>\" on the gateway's own requests to the paths vLLM refuses without it: the reads of GET /v1/models " +
			"that discover LoRA adapters, and the remote tokenizer's POST /tokenize (refused by recent vLLM versions). " +
			"The scrapes of /metrics, which vLLM serves to anyone, go without it, and client requests keep the " +
			"client's own Authorization header, never this key. Printable ASCII, never logged; set it from a Secret. " +
			"Empty sends none.",
		Secret: true,
	}
	Kubeconfig = Var{
		Name:    "KUBECONFIG",
		Default: "",
		Section: SectionDiscovery,
		Doc:     "Kubeconfig file of kubernetes discovery; empty uses the in-cluster service account.",
		Flag:    "kubeconfig",
	}
)

// KV event sync.
var (
	KVEventSyncEnabled = Var{
		Name:    "AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED",
		Aliases: []string{"AIBRIX_KV_EVENT_SYNC_ENABLED"},
		Default: "true",
		Section: SectionKVSync,
		Doc: "Subscribe to the KV-cache events of every eligible vLLM pod and keep the prefix index. " +
			"Needs the remote tokenizer: the gateway refuses to start when this is true and " +
			"AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER is false.",
	}
	UseRemoteTokenizer = Var{
		Name:    "AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER",
		Aliases: []string{"AIBRIX_USE_REMOTE_TOKENIZER"},
		Default: "true",
		Section: SectionTokenizer,
		Doc: "Tokenize prompts with the engine's own tokenizer (vLLM's POST /tokenize on a ready pod of the model). " +
			"When false, requests carry no token ids and every algorithm routes on load alone.",
	}
)

// Prefix index (pkg/indexer).
var (
	SyncMaxContexts = Var{
		Name:    "AIBRIX_SYNC_MAX_CONTEXTS",
		Default: "1000",
		Section: SectionIndex,
		Doc: "Most models the prefix index keeps (a LoRA adapter shares its base model's context, as it shares the engine's cache); " +
			"the least recently used model is dropped whole beyond it.",
	}
	SyncMaxPrefixesPerContext = Var{
		Name:    "AIBRIX_SYNC_MAX_PREFIXES_PER_CONTEXT",
		Default: "4194304",
		Section: SectionIndex,
		Doc: "Most distinct blocks the prefix index keeps per model, whatever the number of pods holding each. Beyond it the " +
			"engines holding the most blocks give up their least recently stored or matched ones, so that a pod flooding the " +
			"index evicts only its own. AIBrix's default of 10000 covers a fraction of one GPU's cache, " +
			"hence the larger default (a few dozen pods of some 100,000 blocks each).",
	}
	SyncMaxPrefixes = Var{
		Name:    "KVGATE_SYNC_MAX_PREFIXES",
		Default: "8388608",
		Section: SectionIndex,
		Doc: "Most distinct blocks the prefix index keeps over all models; beyond it the least recently used model gives up " +
			"blocks as above. Bounds the index's memory: about 63 bytes a block held by one pod, 25 more per other pod holding it.",
	}
	SyncEvictionInterval = Var{
		Name:    "AIBRIX_SYNC_EVICTION_INTERVAL_SECONDS",
		Default: "60",
		Section: SectionIndex,
		Doc:     "How often the prefix index sweeps for idle pods.",
	}
	SyncEvictionDuration = Var{
		Name:    "AIBRIX_SYNC_EVICTION_DURATION_MINUTES",
		Default: "20",
		Section: SectionIndex,
		Doc:     "A pod that has sent no KV event and matched no request for this long is purged from the prefix index.",
	}
)

// Tokenizer.
var (
	TokenizerEndpointTemplate = Var{
		Name:    "AIBRIX_VLLM_TOKENIZER_ENDPOINT_TEMPLATE",
		Default: "http://%s:8000",
		Section: SectionTokenizer,
		Doc:     "URL of a pod's vLLM HTTP server; %s is replaced by the pod's IP.",
	}
	TokenizerRequestTimeout = Var{
		Name:    "AIBRIX_TOKENIZER_REQUEST_TIMEOUT",
		Default: "5",
		Section: SectionTokenizer,
		Doc:     "Timeout of one /tokenize call, in seconds or with a unit (\"500ms\"). On timeout the request is routed on load alone.",
	}
	TokenizerCacheMaxTokens = Var{
		Name:    "KVGATE_TOKENIZER_CACHE_MAX_TOKENS",
		Default: "8388608",
		Section: SectionTokenizer,
		Doc: "Memory of the cache of recent tokenizations, in token ids of 4 bytes (the default is 32 MiB): each " +
			"tokenization is charged 4 bytes per id and 192 bytes of bookkeeping, so that the bound holds however short " +
			"they are, and the least recently used are evicted beyond it. A repeated prompt found in the cache costs no " +
			"/tokenize call.",
	}
	TokenizerDir = Var{
		Name:    "KVGATE_TOKENIZER_DIR",
		Section: SectionTokenizer,
		Doc: "Directory of the models' Hugging Face tokenizer files, to tokenize in process: <dir>/<model>/tokenizer.json " +
			"with tokenizer_config.json or chat_template.jinja beside it, <model> being the served model name " +
			"(Qwen/Qwen3-8B is Qwen3-8B in Qwen). Read at start: a file that cannot be used stops the gateway. " +
			"A model's files are used once the engine's /tokenize agreed with them on sample prompts; other models, " +
			"and a model whose engine disagreed, are tokenized by the engines. Needs the remote tokenizer. " +
			"See docs/deployment.md.",
		Flag: "tokenizer-dir",
	}
	TokenizerVerifyFraction = Var{
		Name:    "KVGATE_TOKENIZER_VERIFY_FRACTION",
		Default: "0.01",
		Section: SectionTokenizer,
		Doc: "Share of the prompts tokenized in process that are also sent to the engine's /tokenize, off the " +
			"request path, to compare; a difference sends the model back to the engine. 0 compares none after the start.",
	}
	TokenizerReasoning = Var{
		Name:    "KVGATE_TOKENIZER_REASONING",
		Default: "auto",
		Section: SectionTokenizer,
		Doc: "How the engines pass an assistant message's reasoning to the chat template of a model tokenized in process " +
			"whose template mentions reasoning, which vLLM versions do differently: auto learns it from the engine's " +
			"/tokenize when the model's chats are verified (kvgate_tokenizer_reasoning_probes_total); reasoning takes " +
			"recent vLLM's way (the message's reasoning as both reasoning and reasoning_content) and reasoning_content " +
			"earlier vLLM's (its reasoning_content as it is) for every model, without asking; engine leaves chats " +
			"carrying reasoning to the engines. /debug/kvcache shows each model's.",
	}
	TokenizerPrefixReuse = Var{
		Name:    "KVGATE_TOKENIZER_PREFIX_REUSE",
		Default: "true",
		Section: SectionTokenizer,
		Doc: "Answer a chat the engine must tokenize at once with the cached ids of its longest message prefix " +
			"(the earlier turns; only prefixes that leave out at most its last 64 messages are looked up), " +
			"tokenizing the whole chat in the background for the next turn.",
	}
	TokenizerMaxBackgroundCalls = Var{
		Name:    "KVGATE_TOKENIZER_MAX_BACKGROUND_CALLS",
		Default: "8",
		Section: SectionTokenizer,
		Doc: "Most /tokenize calls made off the request path at once (whole chats answered from a prefix, " +
			"comparisons of the in-process tokenizer); beyond it a chat waits for its own ids and a comparison is skipped.",
	}
	TokenizerLocalMaxBytes = Var{
		Name:    "KVGATE_TOKENIZER_LOCAL_MAX_BYTES",
		Default: "1048576",
		Section: SectionTokenizer,
		Doc: "Most bytes of text of one request tokenized in process (KVGATE_TOKENIZER_DIR): a completion's prompt, " +
			"a chat's messages, tools, documents and chat_template_kwargs as sent, and the chat they render. A larger " +
			"request of a model tokenized in process is routed on load alone, tokenized neither by the gateway nor by the " +
			"engine, and counted in kvgate_tokenizer_local_fallbacks_total{reason=\"too_large\"}. The default holds a " +
			"128k-token context in any language; raise it for models with longer contexts. A MiB costs about 15 ms of CPU " +
			"for prose, a quarter of a second at most.",
	}
)

// Routing.
var (
	RoutingAlgorithm = Var{
		Name:    "KVGATE_ROUTING_ALGORITHM",
		Aliases: []string{"ROUTING_ALGORITHM"},
		Default: "kv-aware",
		Section: SectionRouting,
		Doc: "Routing algorithm of requests without a routing-strategy header: random, least-request, least-kv-cache, " +
			"least-latency, prefix-cache, kv-aware (the least cost in delay: the predicted time to first token and what " +
			"the prefill holds up), or an SLO-aware one: slo, slo-least-load, slo-least-load-pulling or slo-pack-load.",
		Flag: "routing-algorithm",
	}
	RoutingCPUCacheWeight = Var{
		Name:    "KVGATE_ROUTING_CPU_CACHE_WEIGHT",
		Default: "0.8",
		Section: SectionRouting,
		Doc: "prefix-cache and kv-aware: share of a prompt token's prefill time saved when its KV cache is held only in CPU memory " +
			"or storage (GPU-resident tokens save all of it). A number in (0, 1].",
	}
	RoutingDefaultPrefillSpeed = Var{
		Name:    "KVGATE_ROUTING_DEFAULT_PREFILL_TOKENS_PER_SECOND",
		Default: "10000",
		Section: SectionRouting,
		Doc: "kv-aware: prefill speed assumed for the pods of a model until one of them has a measured speed " +
			"(pods not yet measured otherwise take the median of the measured ones). A number >= 1.",
	}
	RoutingTieTolerance = Var{
		Name:    "KVGATE_ROUTING_TTFT_TIE_TOLERANCE",
		Default: "0.05",
		Section: SectionRouting,
		Doc: "kv-aware: costs (the predicted time to first token and what the prefill holds up) within this fraction " +
			"of the lowest count as equal, and the request goes to the one of those pods with the least prefill work " +
			"(the longest cached prefix), then the fewest requests in flight. A number >= 0; 0 counts only equal costs as equal.",
	}
	RoutingMinFleetQueue = Var{
		Name:    "KVGATE_ROUTING_MIN_FLEET_QUEUE",
		Default: "0.5",
		Section: SectionRouting,
		Doc: "kv-aware and the SLO-aware algorithms: the least number of prefills every pod is taken to have queued when " +
			"pricing the delay a prefill's work adds across the fleet. Higher keeps more cache hits at and below the fleet's " +
			"capacity, for longer queues on the pods holding hot prefixes beyond it; 0 counts that delay only once every " +
			"pod has a prefill queued. A number >= 0.",
	}
	RoutingMaxInFlightPrefixBlocks = Var{
		Name:    "KVGATE_ROUTING_MAX_INFLIGHT_PREFIX_BLOCKS",
		Default: "1048576",
		Section: SectionRouting,
		Doc: "kv-aware and the SLO-aware algorithms credit a pod with the prompt blocks of the requests in flight on it, " +
			"which it computes before any request sent after them; this bounds the blocks remembered, counted per request " +
			"(8 bytes each). Requests beyond it are not remembered, and counted.",
	}
	DPRankRouting = Var{
		Name:    "KVGATE_DP_RANK_ROUTING",
		Default: "true",
		Section: SectionRouting,
		Doc: "For a pod serving several data-parallel ranks behind one port from rank 0 (kvgate.io/dp-size above 1, " +
			"kvgate.io/dp-start-rank 0), send a request routed by a prefix algorithm with X-Data-Parallel-Rank naming the " +
			"rank that holds more of its prompt's prefix than the pod's other ranks, so that vLLM runs it there rather than " +
			"where its load balancer would. A rank gets none (kvgate_gateway_dp_rank_requests_total{result=\"balanced\"}) when it " +
			"already runs at least 2 requests the gateway pinned and twice the mean of the pod's other ranks, or when the " +
			"engine's latest scrape shows it with at least 2 requests waiting and a load (waiting x4 + running, plus the " +
			"requests pinned since) of at least twice the mean of the other ranks'. " +
			"A request carrying its own X-Data-Parallel-Rank keeps it. false leaves every rank to the engine's balancer.",
	}
	PrefixCacheImbalanceAbsCount = Var{
		Name:    "AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT",
		Default: "8",
		Section: SectionRouting,
		Doc: "prefix-cache algorithm: when the most and least loaded candidate pods differ by more than this many running requests, " +
			"the request goes to the least loaded pod regardless of prefix matches.",
	}
	PrefixCacheStdDevFactor = Var{
		Name:    "AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR",
		Default: "1",
		Section: SectionRouting,
		Doc: "prefix-cache algorithm: a pod with more running requests than mean + factor x standard deviation is not chosen " +
			"for its prefix match. A number >= 0; 0 bounds the load at the mean.",
	}
)

// Pod metrics.
var (
	PodMetricRefreshInterval = Var{
		Name:    "AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS",
		Default: "50",
		Section: SectionMetrics,
		Doc: "How often each ready pod's /metrics is scraped, in milliseconds. Each scrape costs every gateway " +
			"replica about 0.13 ms of CPU (measured against vllm-sim's page): at the default, some 0.25% of a core per pod.",
	}
)

// Redis and the features that need it.
var (
	RedisAddress = Var{
		Name:    "KVGATE_REDIS_ADDRESS",
		Default: "",
		Section: SectionRedis,
		Doc: "Redis server as host:port (REDIS_HOST and REDIS_PORT when unset). Empty runs without Redis: request " +
			"traces, shared request counts, shared stored responses and GPU profiles are off.",
		Flag: "redis-address",
	}
	RedisHost = Var{
		Name:    "REDIS_HOST",
		Default: "",
		Section: SectionRedis,
		Doc:     "AIBrix's name of the Redis server's host: with REDIS_PORT, the Redis server of KVGATE_REDIS_ADDRESS, which may be left unset.",
	}
	RedisPort = Var{
		Name:    "REDIS_PORT",
		Default: "6379",
		Section: SectionRedis,
		Doc:     "AIBrix's name of the Redis server's port, used with REDIS_HOST.",
	}
	RedisPassword = Var{
		Name:    "KVGATE_REDIS_PASSWORD",
		Aliases: []string{"REDIS_PASSWORD"},
		Default: "",
		Section: SectionRedis,
		Doc:     "Password of the Redis server; empty for none.",
		Secret:  true,
	}
	RequestTracing = Var{
		Name:    "AIBRIX_GPU_OPTIMIZER_TRACING_FLAG",
		Default: "false",
		Section: SectionRedis,
		Doc: "Write per-model request traces (request counts by input and output token sizes) to Redis every 10 s " +
			"for the GPU optimizer. Needs Redis.",
	}
	ProfileCaching = Var{
		Name:    "AIBRIX_MODEL_GPU_PROFILE_CACHING_FLAG",
		Default: "true",
		Section: SectionRedis,
		Doc: "Load the GPU profiles of deployments from Redis and refresh them every 10 s: at most 256 profiles (those of the " +
			"models and deployments the fleet serves first) of at most 256 KiB, with at most 2 index dimensions of 64 values; the others are skipped and counted " +
			"(kvgate_cache_gpu_profile_rejects_total{reason}). Off without Redis unless set explicitly.",
	}
	SharedRequestCounts = Var{
		Name:    "KVGATE_SHARED_REQUEST_COUNTS",
		Default: "true",
		Section: SectionRedis,
		Doc: "Share each pod's running-request count with the other gateway replicas through Redis, so that " +
			"load-aware routing sees the requests of the whole fleet, with their pending load, queued prefill work and " +
			"prompt blocks, and the output predictors' history. Off without Redis unless set explicitly.",
	}
	SharedStateInterval = Var{
		Name:    "KVGATE_SHARED_STATE_INTERVAL_MS",
		Default: "200",
		Section: SectionRedis,
		Doc: "How often, in milliseconds, each gateway replica publishes to Redis what it has in flight (running requests, " +
			"pending load, queued prefill work, prompt blocks) and its output predictors' history, and reads the other " +
			"replicas'. Routing never waits for Redis: what it reads of the others is at most about two intervals old.",
	}
	SharedStateTTL = Var{
		Name:    "KVGATE_SHARED_STATE_TTL_MS",
		Default: "5000",
		Section: SectionRedis,
		Doc: "How long, in milliseconds, a replica's shared state outlives its last publication, so that a crashed " +
			"replica's requests stop counting; also how long a replica keeps the others' state while Redis cannot be read " +
			"before routing on its own alone (kvgate_cache_shared_counts_local_only_total). Must exceed the interval.",
	}
	SharedMaxBlocks = Var{
		Name:    "KVGATE_SHARED_MAX_BLOCKS",
		Default: "32768",
		Section: SectionRedis,
		Doc: "Most prompt-block keys of its requests in flight a replica publishes per interval (8 bytes each), so that " +
			"the others' kv-aware credits a pod with the prefixes sent there; a cut keeps each request's leading blocks " +
			"and is counted (kvgate_cache_shared_blocks_truncated_total). Replicas must agree on it: a longer list from " +
			"another replica is dropped (kvgate_cache_shared_state_rejects_total).",
	}
	SharedStoredResponses = Var{
		Name:    "KVGATE_SHARED_STORED_RESPONSES",
		Default: "true",
		Section: SectionRedis,
		Doc: "Share through Redis which engine made each OpenAI Responses API response a gateway replica relayed " +
			"(see KVGATE_MAX_STORED_RESPONSES), so that a follow-up naming it as its previous_response_id, GET " +
			"/v1/responses/{id} and POST /v1/responses/{id}/cancel reach that engine through any replica. A replica " +
			"writes each record in the background, and asks Redis only for a response it has no record of, waiting at " +
			"most KVGATE_STORED_RESPONSE_LOOKUP_TIMEOUT_MS; requests naming one response at once share one look-up, and " +
			"at most 64 look-ups per replica wait for Redis at once: a request beyond them does not wait, and is served " +
			"as one for a response the gateway has no record of (kvgate_cache_stored_response_lookups_total" +
			"{result=\"busy\"}). Off without Redis unless set explicitly.",
	}
	StoredResponseTTL = Var{
		Name:    "KVGATE_STORED_RESPONSE_TTL_SECONDS",
		Default: "3600",
		Section: SectionRedis,
		Doc: "How long, in seconds, the record of a response's engine lives in Redis: a follow-up sent later through " +
			"another replica than the one that relayed the response is routed as any request. Each record takes about " +
			"330 bytes of Redis memory (measured on Redis 7.0: MEMORY USAGE 264 bytes for a vLLM response id and a " +
			"141-byte record of pod, UID, address and model, plus the key and expiry tables), about 32 MiB per 100,000 " +
			"responses made within the TTL.",
	}
	StoredResponseLookupTimeout = Var{
		Name:    "KVGATE_STORED_RESPONSE_LOOKUP_TIMEOUT_MS",
		Default: "50",
		Section: SectionRedis,
		Doc: "Longest wait, in milliseconds, for Redis to say which engine made a response a replica has no record of: " +
			"a request naming the response waits for it. A look-up that times out or fails is counted " +
			"(kvgate_cache_stored_response_lookups_total) and the request is served as one for a response the gateway " +
			"has no record of.",
	}
	PodDeploymentLabel = Var{
		Name:    "AIBRIX_POD_DEPLOYMENT_LABEL",
		Default: "app.kubernetes.io/name",
		Section: SectionRedis,
		Doc:     "Pod label naming the deployment whose GPU profile applies to the pod; without it, the owning ReplicaSet's deployment. Ignored on Ray nodes (label ray.io/is-ray-node), which KubeRay labels with its own name.",
	}
	PodRayClusterFleetLabel = Var{
		Name:    "AIBRIX_POD_RAYCLUSTERFLEET_LABEL",
		Default: "orchestration.aibrix.ai/raycluster-fleet-name",
		Section: SectionRedis,
		Doc: "Pod label naming the AIBrix RayClusterFleet a multi-node engine's pods belong to; when set, it names the deployment whose GPU profile applies, before AIBRIX_POD_DEPLOYMENT_LABEL. " +
			"Without either, a Ray node's deployment is its RayCluster. Ray worker pods (ray.io/node-type: worker) are never routed to: the head serves the requests.",
	}
)

// Vars lists every environment variable kvgate reads.
var Vars = []Var{
	ListenAddress,
	AdminListenAddress,
	MaxRequestBodyBytes,
	MaxHeldRequestBytes,
	MaxClientConnections,
	ShutdownTimeout,
	ShutdownDelay,
	RequestBodyTimeout,
	ClientWriteTimeout,
	UpstreamConnectTimeout,
	UpstreamFirstByteTimeout,
	UpstreamIdleTimeout,
	UpstreamResponseTimeout,
	MaxStreamEventBytes,
	MaxStoredResponses,
	EngineAPIKey,
	RequestTTL,
	ExtProcListenAddress,
	ExtProcFailOpen,
	ExtProcTLS,
	ExtProcCertDir,
	ExtProcMaxStreams,
	ExtProcMaxConnections,
	ExtProcMaxMessageTimeout,
	ProxyEnabled,
	Kubeconfig,
	KVEventSyncEnabled,
	UseRemoteTokenizer,
	KVEventsPubPort,
	KVEventsReplayPort,
	KVEventsTopic,
	KVEventsBindEndpoint,
	KVEventsBindRanks,
	KVEventsBindAllowAnyPeer,
	KVEventsBindLivenessTimeout,
	KVEventsDeadPodTimeout,
	KVEventsMaxMessageBytes,
	KVEventsReceiveBufferBytes,
	KVEventsPendingBufferBytes,
	KVEventsMaxReplayBatches,
	KVEventsMaxReplayDuration,
	KVEventsReadInterval,
	PodDiscovery,
	StaticEndpointsFile,
	PodNamespace,
	PodLabelSelector,
	InferencePools,
	AdapterRefreshInterval,
	MaxAdaptersPerPod,
	SyncMaxContexts,
	SyncMaxPrefixesPerContext,
	SyncMaxPrefixes,
	SyncEvictionInterval,
	SyncEvictionDuration,
	TokenizerEndpointTemplate,
	TokenizerRequestTimeout,
	TokenizerCacheMaxTokens,
	TokenizerDir,
	TokenizerVerifyFraction,
	TokenizerReasoning,
	TokenizerPrefixReuse,
	TokenizerMaxBackgroundCalls,
	TokenizerLocalMaxBytes,
	RoutingAlgorithm,
	RoutingCPUCacheWeight,
	RoutingDefaultPrefillSpeed,
	RoutingTieTolerance,
	RoutingMinFleetQueue,
	PrefixCacheImbalanceAbsCount,
	PrefixCacheStdDevFactor,
	RoutingMaxInFlightPrefixBlocks,
	DPRankRouting,
	SLOTTFT,
	SLOTTFTPerPromptToken,
	SLOTPOT,
	SLOE2E,
	SLOModels,
	SLOQueueMaxLength,
	SLOQueueMaxWait,
	SLOQueueFairness,
	SaturationQueueDepth,
	SaturationKVCacheUtilization,
	SaturationMetricsStaleness,
	FlowControl,
	PodMetricRefreshInterval,
	RedisAddress,
	RedisHost,
	RedisPort,
	RedisPassword,
	RequestTracing,
	ProfileCaching,
	SharedRequestCounts,
	SharedStateInterval,
	SharedStateTTL,
	SharedMaxBlocks,
	SharedStoredResponses,
	StoredResponseTTL,
	StoredResponseLookupTimeout,
	PodDeploymentLabel,
	PodRayClusterFleetLabel,
}
