package cache

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// Defaults of Config's zero fields.
const (
	DefaultPodMetricRefreshInterval = 50 * time.Millisecond
	DefaultPodMetricScrapeTimeout   = time.Second
	DefaultAdapterRefreshInterval   = 10 * time.Second
	DefaultRecentMetricsWindow      = 10 * time.Second
	DefaultPrefillSpeedWindow       = time.Minute
	DefaultProfileRefreshInterval   = 10 * time.Second
	DefaultSharedCountsInterval     = 200 * time.Millisecond
	DefaultSharedCountsTTL          = 5 * time.Second
	DefaultRequestTTL               = time.Hour
	DefaultPredictorMaxTokens       = 1 << 20
	DefaultPredictorWindow          = 240 * time.Second
	DefaultEjectionBackoff          = time.Second
	DefaultMaxEjectionBackoff       = 30 * time.Second
)

// Config configures a Store. The zero value is a Store that scrapes pod
// metrics with the defaults and needs no Redis. Fields name the AIBrix
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
	// (endpoint.LoraAdaptersAnnotation) and those set with SetPodAdapters. Zero means
	// DefaultAdapterRefreshInterval (10 s); negative disables the listing.
	AdapterRefreshInterval time.Duration
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

	// EnableRequestTrace writes per-model request traces to Redis
	// (AIBRIX_GPU_OPTIMIZER_TRACING_FLAG). Needs Redis.
	EnableRequestTrace bool
	// RequestTraceInterval is the trace window, a whole number of seconds
	// (default RequestTraceWriteInterval, 10 s).
	RequestTraceInterval time.Duration

	// EnableProfileCache loads GPU profiles from Redis and refreshes them
	// (AIBRIX_MODEL_GPU_PROFILE_CACHING_FLAG). Needs Redis. Without it,
	// profiles come only from UpdateModelProfile.
	EnableProfileCache bool
	// ProfileRefreshInterval is how often profiles are reloaded (default
	// 10 s).
	ProfileRefreshInterval time.Duration

	// SharedRequestCounts shares the running-request counts of gateway
	// replicas through Redis, so that RealtimeNumRequestsRunning counts the
	// whole fleet's requests. Needs Redis.
	SharedRequestCounts bool
	// GatewayID names this replica among those sharing counts (default:
	// host name and a random suffix).
	GatewayID string
	// SharedCountsInterval is how often the counts are published and read
	// (default 200 ms).
	SharedCountsInterval time.Duration
	// SharedCountsTTL is how long a replica's counts outlive its last
	// publication, so that a crashed replica's requests stop counting
	// (default 5 s); it must exceed SharedCountsInterval.
	SharedCountsTTL time.Duration

	// RequestTTL is how long a request may stay tracked without a
	// completion before it is dropped (default 1 h).
	RequestTTL time.Duration

	// EjectionBackoff is how long a pod stays ejected from routing after
	// the first request that could not connect to it (see EjectPod;
	// default 1 s). Each further ejection before the pod answers again
	// doubles it, up to MaxEjectionBackoff (default 30 s).
	EjectionBackoff    time.Duration
	MaxEjectionBackoff time.Duration

	// PredictorMaxInputTokens, PredictorMaxOutputTokens and PredictorWindow
	// size each model's SimpleOutputPredictor (defaults 1Mi, 1Mi, 240 s).
	PredictorMaxInputTokens  int
	PredictorMaxOutputTokens int
	PredictorWindow          time.Duration
	// ColdPrediction is the predictors' strategy for unseen input sizes.
	ColdPrediction ColdPredictionStrategy

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
	c.RecentMetricsWindow = cmp.Or(c.RecentMetricsWindow, DefaultRecentMetricsWindow)
	c.PrefillSpeedWindow = cmp.Or(c.PrefillSpeedWindow, DefaultPrefillSpeedWindow)
	c.RequestTraceInterval = cmp.Or(c.RequestTraceInterval, RequestTraceWriteInterval)
	c.ProfileRefreshInterval = cmp.Or(c.ProfileRefreshInterval, DefaultProfileRefreshInterval)
	c.SharedCountsInterval = cmp.Or(c.SharedCountsInterval, DefaultSharedCountsInterval)
	c.SharedCountsTTL = cmp.Or(c.SharedCountsTTL, DefaultSharedCountsTTL)
	c.RequestTTL = cmp.Or(c.RequestTTL, DefaultRequestTTL)
	c.PredictorWindow = cmp.Or(c.PredictorWindow, DefaultPredictorWindow)
	c.EjectionBackoff = cmp.Or(c.EjectionBackoff, DefaultEjectionBackoff)
	c.MaxEjectionBackoff = cmp.Or(c.MaxEjectionBackoff, DefaultMaxEjectionBackoff)
	c.DefaultEnginePort = cmp.Or(c.DefaultEnginePort, endpoint.DefaultEnginePort)
	c.DeploymentLabel = cmp.Or(c.DeploymentLabel, endpoint.DefaultDeploymentLabel)
	c.PredictorMaxInputTokens = cmp.Or(c.PredictorMaxInputTokens, DefaultPredictorMaxTokens)
	c.PredictorMaxOutputTokens = cmp.Or(c.PredictorMaxOutputTokens, DefaultPredictorMaxTokens)
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return c
}

// validate checks a defaulted Config; hasRedis tells whether a Redis client
// was given.
func (c Config) validate(hasRedis bool) error {
	var errs []error
	needRedis := func(on bool, feature string) {
		if on && !hasRedis {
			errs = append(errs, fmt.Errorf("%s needs a Redis client", feature))
		}
	}
	needRedis(c.EnableRequestTrace, "EnableRequestTrace")
	needRedis(c.EnableProfileCache, "EnableProfileCache")
	needRedis(c.SharedRequestCounts, "SharedRequestCounts")
	if c.RequestTraceInterval < time.Second || c.RequestTraceInterval%time.Second != 0 {
		errs = append(errs, fmt.Errorf("RequestTraceInterval %v is not a whole number of seconds", c.RequestTraceInterval))
	}
	if c.SharedCountsTTL <= c.SharedCountsInterval {
		errs = append(errs, fmt.Errorf("SharedCountsTTL %v must exceed SharedCountsInterval %v", c.SharedCountsTTL, c.SharedCountsInterval))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"PodMetricScrapeTimeout", c.PodMetricScrapeTimeout}, {"RecentMetricsWindow", c.RecentMetricsWindow},
		{"PrefillSpeedWindow", c.PrefillSpeedWindow},
		{"ProfileRefreshInterval", c.ProfileRefreshInterval}, {"SharedCountsInterval", c.SharedCountsInterval},
		{"RequestTTL", c.RequestTTL}, {"PredictorWindow", c.PredictorWindow},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", d.name, d.v))
		}
	}
	if c.EjectionBackoff < 0 || c.MaxEjectionBackoff < c.EjectionBackoff {
		errs = append(errs, fmt.Errorf("EjectionBackoff %v must not be negative nor above MaxEjectionBackoff %v",
			c.EjectionBackoff, c.MaxEjectionBackoff))
	}
	if c.DefaultEnginePort <= 0 || c.DefaultEnginePort >= 1<<16 {
		errs = append(errs, fmt.Errorf("DefaultEnginePort %d is not a port", c.DefaultEnginePort))
	}
	if c.PredictorMaxInputTokens < 0 || c.PredictorMaxOutputTokens < 0 {
		errs = append(errs, errors.New("predictor token maxima must be positive"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid cache config: %w", err)
	}
	return nil
}
