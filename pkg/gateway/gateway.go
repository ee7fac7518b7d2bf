package gateway

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/internal/budget"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
	"github.com/kvgate/kvgate/pkg/redisstate"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/slo"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// Gateway is kvgate's inference gateway: an OpenAI-compatible proxy that
// routes each request to a vLLM pod with the routing algorithm it names,
// over the pods its discovery finds, the metrics the Store scrapes and the
// prefix index its KV event sync keeps. See the package documentation for
// its HTTP API.
//
// A Gateway serves once: New builds it and wires its components, Serve (or
// Run) runs them until its context ends and releases everything it holds
// when it returns. The gateway is the one place that starts and stops
// components; each of them runs until the context it is given ends.
type Gateway struct {
	cfg      Config
	log      klog.Logger
	registry *prometheus.Registry
	metrics  *metrics
	// stored remembers the engine of each Responses API response relayed.
	stored *storedResponses
	store  *cache.Store
	router *routing.Router
	ledger *inflight.Ledger
	// pins counts the attempts in flight pinned to a data-parallel rank.
	pins rankPins
	// capacity is held for writing while the ledger frees a pod's capacity
	// and tells the SLO queues, and for reading while a queue tries a
	// request (slo.Config.Capacity).
	capacity sync.RWMutex
	// profiles, predictors and pendingLoad serve the request path: the
	// pending load of a request from its pod's GPU profile, its predicted
	// output length.
	profiles    *cache.Profiles
	predictors  *cache.OutputPredictors
	pendingLoad *cache.PendingLoadProvider
	// objectives and queues serve the SLO-aware algorithms: each model's
	// objective and its queue.
	objectives *slo.Objectives
	queues     *slo.Routers
	sloMetrics *slo.Metrics
	// The components keeping state in Redis; nil when off.
	tracer        *redisstate.Tracer
	profileLoader *redisstate.ProfileLoader
	shared        *redisstate.SharedCounts
	index         *indexer.SyncPrefixHashTable // nil without KV event sync
	manager       *manager.KVEventManager      // nil without KV event sync
	// follower is the KV event manager as the gateway runs it; nil
	// without KV event sync.
	follower   podFollower
	tokenizer  *tokenizer.Tokenizer // nil without the remote tokenizer
	tokenURL   urlTemplate
	redis      *redis.Client // nil without Redis
	restConfig *rest.Config
	source     cache.PodSource
	// priorities looks up the requests' InferenceObjectives; nil when the
	// gateway reads none.
	priorities ObjectivePriorities
	rewrites   modelRewrites
	// pods holds the keep-alive connections to the pods.
	pods    *podPool
	handler http.Handler
	// adminHandler serves /metrics and /debug/* apart from the API; nil
	// when handler serves them.
	adminHandler http.Handler
	// frontends are served beside the HTTP API (see Attach).
	frontends []attached
	started   time.Time

	// backend is set once the Store has synced; until then the inference
	// and debug endpoints answer 503.
	backend atomic.Pointer[backend]
	// draining is set when shutdown begins.
	draining atomic.Bool

	// bodies bounds the bytes of request bodies held at once, over every
	// request: those being read, waiting for a pod or in an SLO queue, and
	// being forwarded (Config.MaxHeldRequestBytes). A request that would
	// pass it is refused with 503.
	bodies *budget.Budget

	// matchSlots holds a token per /debug/match request being served.
	matchSlots chan struct{}

	idPrefix     string
	nextID       atomic.Uint64
	nextTokenize atomic.Uint64
}

// backend is what serving requests needs once the pods are known.
type backend struct {
	store  *cache.Store
	router *routing.Router
}

// New builds a gateway from cfg without starting anything: its metrics
// registry, the Store, the router, the prefix index and KV event manager
// (with KV sync), tokenizer (with the remote tokenizer), pod source, Redis
// client and the pool of connections to pods. It fails when cfg is invalid, the
// Kubernetes client configuration cannot be loaded, or a component refuses
// its settings (Redis features without a Redis address among them).
func New(cfg Config) (*Gateway, error) {
	cfg = cfg.withDefaults()
	if err := cfg.SLO.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if err := cfg.Saturation.validate(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if cfg.MaxHeldRequestBytes < cfg.MaxRequestBodyBytes {
		return nil, fmt.Errorf("gateway: the request bytes held at once (%d) must be at least the largest request body (%d)",
			cfg.MaxHeldRequestBytes, cfg.MaxRequestBodyBytes)
	}
	if cfg.MaxClientConnections < 1 {
		return nil, fmt.Errorf("gateway: the client connections held open at once (%d) must be at least 1",
			cfg.MaxClientConnections)
	}
	if err := cfg.checkRequestTTL(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if cfg.ResponseTimeout < cfg.FirstByteTimeout {
		return nil, fmt.Errorf("gateway: the response timeout %s (%v) must be at least the first-byte timeout %s (%v)",
			config.UpstreamResponseTimeout.Name, cfg.ResponseTimeout, config.UpstreamFirstByteTimeout.Name, cfg.FirstByteTimeout)
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger.WithName("gateway"), registry: prometheus.NewRegistry(), started: time.Now(),
		matchSlots: make(chan struct{}, maxConcurrentMatches), bodies: budget.New(cfg.MaxHeldRequestBytes)}
	g.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var err error
	if g.tokenURL, err = parseTokenizerTemplate(cfg.TokenizerEndpointTemplate); err != nil {
		return nil, fmt.Errorf("gateway: tokenizer endpoint template %q: %w", cfg.TokenizerEndpointTemplate, err)
	}
	if cfg.KVSync.Enabled && !cfg.RemoteTokenizer {
		return nil, errors.New("gateway: KV event sync needs the remote tokenizer: the prefix index holds the engines' token ids")
	}
	if g.metrics, err = newMetrics(g.registry, g.bodies); err != nil {
		return nil, err
	}
	if g.stored, err = newStoredResponses(cfg.MaxStoredResponses, g.registry); err != nil {
		return nil, err
	}
	if cfg.KVSync.Enabled {
		if err := g.newKVSync(); err != nil {
			return nil, err
		}
	}
	if cfg.RemoteTokenizer {
		tc := cfg.Tokenizer
		tc.Logger = cfg.Logger
		if g.tokenizer, err = tokenizer.New(tc, g.registry); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	g.pods = newPodPool(cfg.DialTimeout, cfg.MaxIdleConnsPerPod, DefaultPodConnIdleTTL, g.log)
	if g.source, g.restConfig, g.priorities, err = newPodSource(cfg); err != nil {
		g.release()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if err := g.newModelRewrites(); err != nil {
		g.release()
		return nil, err
	}
	if cfg.Redis.Address != "" {
		// Every operation's context bounds it: a stored response's
		// look-up waits no longer than its timeout.
		g.redis = redis.NewClient(&redis.Options{Addr: cfg.Redis.Address, Password: cfg.Redis.Password,
			ContextTimeoutEnabled: true})
	}
	if err := g.newStore(); err != nil {
		g.release()
		return nil, err
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	g.idPrefix = "kvgate-" + hex.EncodeToString(id[:]) + "-"
	g.handler, g.adminHandler = g.routes()
	return g, nil
}

// withDefaults returns c with its zero fields defaulted.
func (c Config) withDefaults() Config {
	c.MaxRequestBodyBytes = cmp.Or(c.MaxRequestBodyBytes, DefaultMaxRequestBodyBytes)
	c.MaxHeldRequestBytes = cmp.Or(c.MaxHeldRequestBytes, DefaultMaxHeldRequestBytes)
	c.MaxClientConnections = cmp.Or(c.MaxClientConnections, DefaultMaxClientConnections)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.RequestBodyTimeout = cmp.Or(c.RequestBodyTimeout, DefaultRequestBodyTimeout)
	c.ClientWriteTimeout = cmp.Or(c.ClientWriteTimeout, DefaultClientWriteTimeout)
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	c.FirstByteTimeout = cmp.Or(c.FirstByteTimeout, DefaultFirstByteTimeout)
	c.UpstreamIdleTimeout = cmp.Or(c.UpstreamIdleTimeout, DefaultUpstreamIdleTimeout)
	c.ResponseTimeout = cmp.Or(c.ResponseTimeout, DefaultResponseTimeout)
	c.MaxStreamEventBytes = cmp.Or(c.MaxStreamEventBytes, DefaultMaxStreamEventBytes)
	c.MaxStoredResponses = cmp.Or(c.MaxStoredResponses, DefaultMaxStoredResponses)
	c.MaxIdleConnsPerPod = cmp.Or(c.MaxIdleConnsPerPod, DefaultMaxIdleConnsPerPod)
	c.SLO.MaxWait = cmp.Or(c.SLO.MaxWait, slo.DefaultMaxWait)
	c.RequestTTL = cmp.Or(c.RequestTTL, DefaultRequestTTL)
	c.Saturation = cmp.Or(c.Saturation, DefaultSaturation)
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return c
}

// newKVSync builds the prefix index and the KV event manager feeding it.
func (g *Gateway) newKVSync() error {
	k := g.cfg.KVSync
	var err error
	g.index, err = indexer.NewSyncPrefixHashTable(indexer.Config{
		MaxContexts:           k.MaxContexts,
		MaxPrefixesPerContext: k.MaxPrefixesPerContext,
		MaxPrefixes:           k.MaxPrefixes,
		EvictionInterval:      k.EvictionInterval,
		EvictionDuration:      k.EvictionDuration,
		Logger:                g.cfg.Logger,
	}, g.registry)
	if err != nil {
		return fmt.Errorf("gateway: prefix index: %w", err)
	}
	mc := manager.ManagerConfig{
		Index: kvIndex{table: g.index},
		Streams: manager.StreamDefaults{PubPort: k.PubPort, ReplayPort: k.ReplayPort, Topic: k.Topic,
			EnginePort: cmp.Or(g.cfg.Cache.DefaultEnginePort, endpoint.DefaultEnginePort)},
		Client:         streamClientConfig(k),
		DeadPodTimeout: k.DeadPodTimeout,
		// The Store is built after the manager, which reads it only
		// once started.
		LastScraped: func(pod endpoint.Key) time.Time { return g.store.PodLastScraped(pod) },
		Registerer:  g.registry,
		Logger:      g.cfg.Logger,
	}
	if k.BindEndpoint != "" {
		mc.Bind = &transport.BindConfig{Endpoint: k.BindEndpoint, Ranks: k.BindRanks,
			AllowAnyPeer: k.BindAllowAnyPeer, LivenessTimeout: k.BindLivenessTimeout, ReadInterval: k.ReadInterval}
	}
	if g.manager, err = manager.NewKVEventManager(mc); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.follower = g.manager
	return nil
}

// streamClientConfig returns the configuration every connect-mode stream
// starts from: the transport's defaults, with the bounds and the read
// interval k sets (a zero leaves the default; a negative read interval
// reads each batch as it comes, as in BindConfig).
func streamClientConfig(k config.KVSync) *transport.ZMQClientConfig {
	client := transport.DefaultZMQClientConfig("", "", "")
	client.MaxMessageBytes = cmp.Or(k.MaxMessageBytes, client.MaxMessageBytes)
	client.ReceiveBufferBytes = cmp.Or(k.ReceiveBufferBytes, client.ReceiveBufferBytes)
	client.MaxPendingBytes = cmp.Or(k.PendingBufferBytes, client.MaxPendingBytes)
	client.MaxReplayBatches = cmp.Or(k.MaxReplayBatches, client.MaxReplayBatches)
	client.MaxReplayDuration = cmp.Or(k.MaxReplayDuration, client.MaxReplayDuration)
	if k.ReadInterval != 0 {
		client.ReadInterval = max(k.ReadInterval, 0)
	}
	return client
}

// newStore builds the Store, the request ledger, the router reading both,
// the GPU profiles, the output predictors and the components keeping state
// in Redis, and wires them: the router, the predictors and the request
// traces observe the ledger.
func (g *Gateway) newStore() error {
	cc := g.cfg.Cache
	cc.Registerer, cc.Logger = g.registry, g.cfg.Logger
	cc.OnScrape = func() { g.queues.Trigger() }
	var err error
	if g.store, err = cache.New(cc); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if g.ledger, err = inflight.New(inflight.Config{TTL: g.cfg.RequestTTL, Registerer: g.registry, Logger: g.cfg.Logger,
		Frees: &g.capacity}); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if g.profiles, err = cache.NewProfiles(g.cfg.Cache.EndpointOptions(), g.registry); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	rc := g.cfg.Routing
	rc.Registerer, rc.Logger, rc.Profiles = g.registry, g.cfg.Logger, g.profiles
	if g.index != nil {
		rc.Index = g.index
	}
	if g.router, err = routing.New(rc); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.ledger.Observe(g.router.Observer())
	g.ledger.Observe(inflight.Observer{Closed: g.unpinRank})
	g.pendingLoad = cache.NewPendingLoadProvider(g.store, g.profiles)
	if g.predictors, err = cache.NewOutputPredictors(g.store, g.cfg.Predictor); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.ledger.Observe(g.predictors.Observer())
	if err := g.newSLO(); err != nil {
		return err
	}
	return g.newRedisState()
}

// servedProfileKeys returns the GPU profile keys of the models the
// registered pods serve on their deployments (see cache.ModelGPUProfileKey).
func (g *Gateway) servedProfileKeys() []string {
	var keys []string
	for _, ep := range g.store.ListPods() {
		if ep.Deployment == "" {
			continue
		}
		models, _ := g.store.ListModelsByPod(ep.Key)
		for _, m := range models {
			keys = append(keys, cache.ModelGPUProfileKey(m, ep.Deployment))
		}
	}
	return keys
}

// newRedisState builds the components that keep state in Redis, those the
// configuration turns on; each needs a Redis address.
func (g *Gateway) newRedisState() error {
	rcfg := g.cfg.Redis
	var errs []error
	for _, f := range []struct {
		on   bool
		name string
	}{{rcfg.RequestTraces, "RequestTraces"}, {rcfg.GPUProfiles, "GPUProfiles"}, {rcfg.SharedCounts, "SharedCounts"},
		{rcfg.StoredResponses, "StoredResponses"}} {
		if f.on && g.redis == nil {
			errs = append(errs, fmt.Errorf("%s needs a Redis client: set Redis.Address", f.name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	m, err := redisstate.NewMetrics(g.registry)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if rcfg.RequestTraces {
		tc := rcfg.Traces
		tc.Logger = g.cfg.Logger
		if g.tracer, err = redisstate.NewTracer(g.redis, g.ledger, m, tc); err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		g.ledger.Observe(g.tracer.Observer())
	}
	if rcfg.GPUProfiles {
		pc := rcfg.Profiles
		pc.Logger, pc.Served = g.cfg.Logger, g.servedProfileKeys
		if g.profileLoader, err = redisstate.NewProfileLoader(g.redis, g.profiles, m, pc); err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
	}
	if rcfg.SharedCounts {
		sc := rcfg.Shared
		sc.Logger, sc.Prefixes, sc.Predictors = g.cfg.Logger, g.router, g.predictors
		if g.cfg.KVSync.Enabled && g.cfg.KVSync.BindEndpoint != "" {
			sc.SoleReplica = "in bind mode each engine publishes its KV events to one replica, so the others route " +
				"without its blocks: run one replica in bind mode, or use connect mode (see docs/discovery-modes.md)"
		}
		if g.shared, err = redisstate.NewSharedCounts(g.redis, g.store, m, sc); err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
	}
	if rcfg.StoredResponses {
		st := rcfg.Stored
		st.Logger = g.cfg.Logger
		if g.stored.shared, err = redisstate.NewStoredResponses(g.redis, m, st); err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
	}
	return nil
}

// Handler returns the handler of the gateway's API listener: the OpenAI
// endpoints and the probes, and /metrics and /debug/* unless the
// configuration has an admin listen address. Until Serve has synced the
// pods, the inference and debug endpoints answer 503.
func (g *Gateway) Handler() http.Handler { return g.handler }

// requestID returns a new id, unique among this process's requests, under
// which the Store tracks a request.
func (g *Gateway) requestID() string {
	var buf [40]byte
	b := append(buf[:0], g.idPrefix...)
	return string(strconv.AppendUint(b, g.nextID.Add(1), 10))
}

// ready returns the backend, nil before the Store synced.
func (g *Gateway) ready() *backend { return g.backend.Load() }

// readiness says whether the gateway should receive traffic, and why not.
func (g *Gateway) readiness() (bool, string) {
	switch {
	case g.draining.Load():
		return false, "shutting down: requests in flight are draining"
	case g.ready() == nil:
		return false, "starting: waiting for the pod source (" + g.sourceName() + ") to deliver the pods"
	}
	msg := "ready: pods synced from " + g.sourceName()
	if g.follower != nil {
		msg += "; KV event sync running"
	}
	return true, msg
}

// sourceName describes where pods come from, for readiness and logs.
func (g *Gateway) sourceName() string {
	if g.cfg.PodSource != nil {
		return fmt.Sprintf("%T", g.cfg.PodSource)
	}
	return g.cfg.Discovery.String()
}

// shutdown fails readiness, keeps serving for the shutdown delay (when the
// gateway got to serve at all), lets the requests in flight finish within
// the shutdown timeout, the API's and the frontends' first so that the admin
// listener serves metrics while they drain, then stops the components, in the reverse
// order of their start, and releases what the gateway holds.
func (g *Gateway) shutdown(servers []httpServer, comps *components, served bool) {
	g.draining.Store(true)
	if served && g.cfg.ShutdownDelay > 0 {
		g.log.Info("Failing readiness before closing the listeners", "delay", g.cfg.ShutdownDelay)
		time.Sleep(g.cfg.ShutdownDelay)
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.ShutdownTimeout)
	defer cancel()
	// Requests waiting for capacity would hold the drain up to the queue's
	// wait bound: they are answered 503 at once.
	g.queues.Close()
	g.shutdownFrontends(ctx, func() {
		for _, srv := range servers {
			if err := srv.Shutdown(ctx); err != nil {
				g.log.Info("Requests still in flight after the shutdown timeout are cut", "timeout", g.cfg.ShutdownTimeout)
				_ = srv.Close()
			}
		}
	})
	comps.stop()
	g.release()
}
