package cache

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
)

// Store is the gateway's registry of inference pods: the pods and the
// models they serve, the metrics scraped from them, and which of them
// requests could not connect to. Each pod's load record (the requests in
// flight on it, kept by the request ledger, see package inflight) lives
// with the pod (see PodLoad), so that a routing decision reads all it needs
// of a candidate in one snapshot (see Snapshots). Reads never wait for I/O. All methods are safe
// for concurrent use.
type Store struct {
	cfg     Config
	log     klog.Logger
	metrics *storeMetrics

	reg       *registry
	scraper   *scrapePool // nil when scraping and adapter listing are disabled
	subMu     sync.Mutex
	selection atomic.Pointer[metricSelection]

	// now is the clock of ejections.
	now func() time.Time
}

// podState is what the Store keeps about a pod for as long as it keeps its
// UID: its latest metrics, its load, its ejection and the model cards its
// engine listed last (those of the models it serves, sorted by ID).
type podState struct {
	metrics atomic.Pointer[podMetrics]
	load    *inflight.PodLoad
	health  podHealth
	cards   atomic.Pointer[[]ModelCard]
}

func newPodState(id string) *podState { return &podState{load: inflight.NewPodLoad(id)} }

// New returns a Store with an empty pod registry and its metrics
// registered; Run scrapes the pods' metrics and lists their LoRA adapters.
// It fails when cfg is invalid or the Store's metrics cannot be registered.
// The registry is fed with AddOrUpdatePod and DeletePod, by hand or by a
// PodSource (see RunPodSource).
func New(cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Store{
		cfg: cfg,
		log: cfg.Logger.WithName("cache"),
		reg: newRegistry(cfg.EndpointOptions()),
		now: time.Now,
	}
	s.selection.Store(newMetricSelection(map[string]struct{}{}))
	if cfg.PodMetricRefreshInterval > 0 || cfg.AdapterRefreshInterval > 0 {
		s.scraper = &scrapePool{
			reg:      s.reg,
			interval: cfg.PodMetricRefreshInterval, adapterInterval: cfg.AdapterRefreshInterval, maxAdapters: cfg.MaxAdaptersPerPod,
			timeout: cfg.PodMetricScrapeTimeout, window: cfg.RecentMetricsWindow, prefillWindow: cfg.PrefillSpeedWindow,
			selection: s.selection.Load, publishAdapters: s.setDiscoveredAdapters, readmit: s.readmit, onScrape: cfg.OnScrape,
			log: s.log, nudge: make(chan struct{}, 1), loops: map[endpoint.Key]*runningLoop{},
			idle: map[endpoint.Key]struct{}{},
		}
		if cfg.EngineAPIKey != "" {
			s.scraper.modelsAuthorization = "Bearer " + cfg.EngineAPIKey
		}
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

// Run scrapes the routable pods' metrics and lists their LoRA adapters
// until ctx ends; it then stops every loop, unregisters the Store's metrics
// and returns nil. Run is called once. The Store's lookups work before,
// during and after Run.
func (s *Store) Run(ctx context.Context) error {
	s.log.V(1).Info("Cache store running", "scrapeInterval", s.cfg.PodMetricRefreshInterval,
		"adapterRefreshInterval", s.cfg.AdapterRefreshInterval)
	if s.scraper != nil {
		s.scraper.run(ctx)
	} else {
		<-ctx.Done()
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
		ejectedPods: s.ejectedPods,
	}
}
