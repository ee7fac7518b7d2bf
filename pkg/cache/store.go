package cache

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// Store is the gateway's central cache: the registry of inference pods and
// the models they serve, the metrics scraped from them, the requests in
// flight and their traces, per-model output predictors and GPU profiles.
// Routing reads load and latency from it without blocking on I/O. All
// methods are safe for concurrent use.
type Store struct {
	cfg     Config
	log     klog.Logger
	redis   *redis.Client
	metrics *storeMetrics

	reg       *registry
	scraper   *scrapePool // nil when scraping and adapter listing are disabled
	subMu     sync.Mutex
	selection atomic.Pointer[metricSelection]

	requests    *requestTracker
	tracer      *tracer // nil without request traces
	predictors  sync.Map
	profiles    profileCache
	pendingLoad *PendingLoadProvider
	shared      *sharedCounts // nil unless counts are shared

	// now is the clock of ejections.
	now func() time.Time
}

// podState is what the Store keeps about a pod for as long as it keeps its
// UID: its latest metrics, its requests in flight and its ejection.
type podState struct {
	metrics atomic.Pointer[podMetrics]
	load    podLoad
	health  podHealth
}

func newPodState() *podState { return &podState{} }

// New returns a Store with an empty pod registry and its metrics registered;
// Run does the background work cfg asks for (metric scraping, LoRA adapter
// listing, request trace flushes, GPU profile refreshes, shared request
// counts). redisClient may be nil when no enabled feature needs Redis; New
// fails when one does, or when cfg is invalid, or when the Store's metrics
// cannot be registered. The registry is fed with AddOrUpdatePod and
// DeletePod, by hand or by a PodSource (see RunPodSource).
func New(redisClient *redis.Client, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(redisClient != nil); err != nil {
		return nil, err
	}
	s := &Store{
		cfg:      cfg,
		log:      cfg.Logger.WithName("cache"),
		redis:    redisClient,
		reg:      newRegistry(endpoint.Options{DefaultPort: cfg.DefaultEnginePort, DeploymentLabel: cfg.DeploymentLabel}),
		now:      time.Now,
		requests: newRequestTracker(),
		profiles: profileCache{profiles: map[string]*cachedProfile{}},
	}
	s.selection.Store(newMetricSelection(map[string]struct{}{}))
	s.pendingLoad = NewPendingLoadProvider(s, s)
	if cfg.PodMetricRefreshInterval > 0 || cfg.AdapterRefreshInterval > 0 {
		s.scraper = &scrapePool{
			reg: s.reg, client: newScrapeClient(cfg.PodMetricScrapeTimeout),
			interval: cfg.PodMetricRefreshInterval, adapterInterval: cfg.AdapterRefreshInterval,
			timeout: cfg.PodMetricScrapeTimeout, window: cfg.RecentMetricsWindow, prefillWindow: cfg.PrefillSpeedWindow,
			selection: s.selection.Load, publishAdapters: s.setDiscoveredAdapters, readmit: s.readmit,
			log: s.log, nudge: make(chan struct{}, 1), loops: map[endpoint.Key]*runningLoop{},
		}
	}
	if cfg.EnableRequestTrace {
		s.tracer = newTracer(cfg.RequestTraceInterval)
	}
	if cfg.SharedRequestCounts {
		s.shared = newSharedCounts(s, cfg.GatewayID)
	}
	m, err := newStoreMetrics(cfg.Registerer, s.gauges())
	if err != nil {
		return nil, err
	}
	s.metrics = m
	if s.scraper != nil {
		s.scraper.metrics = m
	}

	return s, nil
}

// Run does the Store's background work until ctx ends: it scrapes the
// routable pods' metrics and lists their LoRA adapters, and with the
// features that need Redis, writes request traces, refreshes GPU profiles
// and shares request counts; it also drops requests tracked for longer than
// the request TTL. Once ctx ends it stops all of it, writes the request
// traces of the window in progress, withdraws this replica's shared counts,
// unregisters the Store's metrics and returns nil. Run is called once. The
// Store's lookups work before, during and after Run.
func (s *Store) Run(ctx context.Context) error {
	s.log.V(1).Info("Cache store running", "scrapeInterval", s.cfg.PodMetricRefreshInterval,
		"adapterRefreshInterval", s.cfg.AdapterRefreshInterval,
		"requestTrace", s.cfg.EnableRequestTrace, "profileCache", s.cfg.EnableProfileCache,
		"sharedRequestCounts", s.cfg.SharedRequestCounts)
	var wg sync.WaitGroup
	run := func(f func(context.Context)) { wg.Go(func() { f(ctx) }) }
	if s.scraper != nil {
		run(s.scraper.run)
	}
	if s.tracer != nil {
		run(s.runTraceFlusher)
	}
	if s.cfg.EnableProfileCache {
		run(s.runProfileRefresher)
	}
	if s.shared != nil {
		run(s.shared.run)
	}
	run(s.runRequestReaper)
	wg.Wait()
	if s.tracer != nil {
		s.flushPartialTraces()
	}
	if s.shared != nil {
		s.shared.withdraw()
	}
	if s.scraper != nil {
		s.scraper.client.CloseIdleConnections()
	}
	s.metrics.unregister()
	s.log.V(1).Info("Cache store stopped")
	return nil
}

// gauges reads the Store's gauges for its metrics.
func (s *Store) gauges() storeGauges {
	return storeGauges{
		scrapeTargets: func() float64 {
			if s.scraper == nil {
				return 0
			}
			return float64(s.scraper.targets())
		},
		stalePods: func() float64 {
			n := 0
			for _, e := range s.reg.entries() {
				if m := e.state.metrics.Load(); e.ep.Ready() && m != nil && m.stale {
					n++
				}
			}
			return float64(n)
		},
		ejectedPods:     s.ejectedPods,
		trackedRequests: func() float64 { return float64(s.requests.size.Load()) },
		profiles:        func() float64 { return float64(s.profiles.size()) },
	}
}

// runRequestReaper drops requests tracked for longer than the request TTL,
// whose completion was lost, so that they stop counting as load.
func (s *Store) runRequestReaper(ctx context.Context) {
	t := time.NewTicker(max(min(s.cfg.RequestTTL/4, time.Minute), 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n := s.requests.expire(now.Add(-s.cfg.RequestTTL)); n > 0 {
				s.metrics.requestsExpired.Add(float64(n))
				s.log.Info("Dropped requests tracked without completion", "count", n, "ttl", s.cfg.RequestTTL)
			}
		}
	}
}
