package cache

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/internal/apikey"
)

// Defaults of Config's zero fields.
const (
	DefaultPodMetricRefreshInterval = 50 * time.Millisecond
	DefaultPodMetricScrapeTimeout   = time.Second
	DefaultAdapterRefreshInterval   = 10 * time.Second
	DefaultMaxAdaptersPerPod        = 256
	DefaultRecentMetricsWindow      = 10 * time.Second
	DefaultPrefillSpeedWindow       = time.Minute
	DefaultEjectionBackoff          = time.Second
	DefaultMaxEjectionBackoff       = 30 * time.Second
)

// Config configures a Store. The zero value is a Store that scrapes pod
// metrics with the defaults. Fields name the AIBrix
// environment variable that sets them where there is one; the variables are
// parsed by the binary, not here.
type Config struct {
	// PodMetricRefreshInterval is how often each routable pod's /metrics is
	// scraped (AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS). Zero means
	// DefaultPodMetricRefreshInterval; negative disables scraping.
	PodMetricRefreshInterval time.Duration
	// PodMetricScrapeTimeout bounds one scrape of a pod's /metrics or
	// /v1/models (default 1 s).
	PodMetricScrapeTimeout time.Duration
	// AdapterRefreshInterval is how often each routable pod's /v1/models is
	// read to learn the LoRA adapters its engine serves, those loaded at
	// runtime included: vLLM lists an adapter with the base model as its
	// "parent". The pod serves these adapters besides those it declares
	// (endpoint.LoraAdaptersAnnotation) and those set with SetPodAdapters.
	// Zero means DefaultAdapterRefreshInterval (10 s); negative disables
	// the listing.
	AdapterRefreshInterval time.Duration
	// MaxAdaptersPerPod bounds the adapters taken from one pod's
	// /v1/models (KVGATE_MAX_ADAPTERS_PER_POD, default 256): each becomes
	// a model of the registry, with state of its own in the gateway
	// (queues, predictors, metric series). The adapters the pod was last
	// known to serve are kept first, then the others in name order;
	// requests for those left out are not routed to the pod. vLLM lists
	// every adapter it was started with or loaded at runtime, however few
	// it keeps loaded.
	MaxAdaptersPerPod int
	// RecentMetricsWindow is how far back the recent rates and means
	// (PrefixCacheHitRate, the Avg* latencies) reach (default 10 s). A
	// window shorter than the refresh interval compares each scrape with
	// the previous one.
	RecentMetricsWindow time.Duration
	// PrefillSpeedWindow is how far back PrefillTokensPerSecond reaches
	// (default 1 min). A pod's prefill speed is a property of its hardware
	// and model, and each prefill measures it roughly: the longer window
	// averages out what the prefills the pod happened to run do to it.
	PrefillSpeedWindow time.Duration
	// DefaultEnginePort is the engine port of pods that declare none
	// (endpoint.ModelPortLabel), for requests and /metrics (default
	// endpoint.DefaultEnginePort, 8000).
	DefaultEnginePort int
	// DeploymentLabel is the pod label holding the deployment name that
	// keys GPU profiles (AIBRIX_POD_DEPLOYMENT_LABEL, default
	// endpoint.DefaultDeploymentLabel).
	DeploymentLabel string
	// RayClusterFleetLabel is the pod label holding the name of the
	// RayClusterFleet a pod belongs to, which then keys its GPU profiles
	// (AIBRIX_POD_RAYCLUSTERFLEET_LABEL, default
	// endpoint.DefaultRayClusterFleetLabel).
	RayClusterFleetLabel string

	// EjectionBackoff is how long a pod stays ejected from routing after
	// the first request that could not connect to it (see EjectPod;
	// default 1 s). Each further ejection before the pod answers again
	// doubles it, up to MaxEjectionBackoff (default 30 s).
	EjectionBackoff    time.Duration
	MaxEjectionBackoff time.Duration

	// OnScrape, when set, is called after every successful scrape of a
	// pod's metrics, from the scrape's goroutine: routing may find room
	// where it found none. It must return quickly.
	OnScrape func()

	// EngineAPIKey, when set, is sent as "Authorization: Bearer
	// <EngineAPIKey>" on each read of a pod's /v1/models
	// (KVGATE_ENGINE_API_KEY), which vLLM started with --api-key refuses
	// without it. The scrapes of /metrics, which vLLM serves to anyone,
	// go without it. The key is never logged nor put in errors.
	EngineAPIKey string

	// Registerer receives the Store's own metrics; nil registers none.
	// Run unregisters them when it returns.
	Registerer prometheus.Registerer
	// Logger receives the Store's logs (default klog.Background()).
	Logger klog.Logger
}

// withDefaults returns c with its zero fields defaulted.
func (c Config) withDefaults() Config {
	c.PodMetricRefreshInterval = cmp.Or(c.PodMetricRefreshInterval, DefaultPodMetricRefreshInterval)
	c.PodMetricScrapeTimeout = cmp.Or(c.PodMetricScrapeTimeout, DefaultPodMetricScrapeTimeout)
	c.AdapterRefreshInterval = cmp.Or(c.AdapterRefreshInterval, DefaultAdapterRefreshInterval)
	c.MaxAdaptersPerPod = cmp.Or(c.MaxAdaptersPerPod, DefaultMaxAdaptersPerPod)
	c.RecentMetricsWindow = cmp.Or(c.RecentMetricsWindow, DefaultRecentMetricsWindow)
	c.PrefillSpeedWindow = cmp.Or(c.PrefillSpeedWindow, DefaultPrefillSpeedWindow)
	c.EjectionBackoff = cmp.Or(c.EjectionBackoff, DefaultEjectionBackoff)
	c.MaxEjectionBackoff = cmp.Or(c.MaxEjectionBackoff, DefaultMaxEjectionBackoff)
	c.DefaultEnginePort = cmp.Or(c.DefaultEnginePort, endpoint.DefaultEnginePort)
	c.DeploymentLabel = cmp.Or(c.DeploymentLabel, endpoint.DefaultDeploymentLabel)
	c.RayClusterFleetLabel = cmp.Or(c.RayClusterFleetLabel, endpoint.DefaultRayClusterFleetLabel)
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return c
}

// validate checks a defaulted Config.
func (c Config) validate() error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"PodMetricScrapeTimeout", c.PodMetricScrapeTimeout}, {"RecentMetricsWindow", c.RecentMetricsWindow},
		{"PrefillSpeedWindow", c.PrefillSpeedWindow},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", d.name, d.v))
		}
	}
	if c.EjectionBackoff < 0 || c.MaxEjectionBackoff < c.EjectionBackoff {
		errs = append(errs, fmt.Errorf("EjectionBackoff %v must not be negative nor above MaxEjectionBackoff %v",
			c.EjectionBackoff, c.MaxEjectionBackoff))
	}
	if c.MaxAdaptersPerPod < 0 {
		errs = append(errs, fmt.Errorf("MaxAdaptersPerPod %d is negative", c.MaxAdaptersPerPod))
	}
	if err := apikey.Check(c.EngineAPIKey); err != nil {
		errs = append(errs, fmt.Errorf("EngineAPIKey: %w", err))
	}
	if c.DefaultEnginePort <= 0 || c.DefaultEnginePort >= 1<<16 {
		errs = append(errs, fmt.Errorf("DefaultEnginePort %d is not a port", c.DefaultEnginePort))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid cache config: %w", err)
	}
	return nil
}

// EndpointOptions returns how pods are parsed under c.
func (c Config) EndpointOptions() endpoint.Options {
	return endpoint.Options{DefaultPort: c.DefaultEnginePort, DeploymentLabel: c.DeploymentLabel,
		RayClusterFleetLabel: c.RayClusterFleetLabel}
}
