package routing

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/indexer"
)

// Defaults of Config's zero fields.
const (
	DefaultAlgorithm              = KVAware
	DefaultImbalanceAbsCount      = 8
	DefaultStdDevFactor           = 1.0
	DefaultCPUCacheWeight         = 0.8
	DefaultPrefillTokensPerSecond = 10000.0
	DefaultTieTolerance           = 0.05
	DefaultMinFleetQueue          = 0.5
)

// TieToleranceSetting returns the Config.TieTolerance of a tolerance as
// operators set it (KVGATE_ROUTING_TTFT_TIE_TOLERANCE), where 0 means that
// only equal costs tie.
func TieToleranceSetting(tolerance float64) float64 {
	if tolerance == 0 {
		return -1
	}
	return tolerance
}

// StdDevFactorSetting returns the Config.StdDevFactor of a factor as
// operators set it (AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR), where 0
// bounds the load at the mean.
func StdDevFactorSetting(factor float64) float64 {
	if factor == 0 {
		return -1
	}
	return factor
}

// MinFleetQueueSetting returns the Config.MinFleetQueue of a floor as
// operators set it (KVGATE_ROUTING_MIN_FLEET_QUEUE, bench-routing's
// -router-min-fleet-queue), where 0 means no floor.
func MinFleetQueueSetting(floor float64) float64 {
	if floor == 0 {
		return -1
	}
	return floor
}

// FleetQueueFloor returns the floor c.MinFleetQueue sets: the default for
// zero, none (0) for a negative value.
func (c Config) FleetQueueFloor() float64 {
	return max(cmp.Or(c.MinFleetQueue, DefaultMinFleetQueue), 0)
}

// PrefixIndex reports how much of a prompt each pod holds in its KV cache.
// *indexer.SyncPrefixHashTable implements it; see its MatchPrefix for the
// contract.
type PrefixIndex interface {
	MatchPrefix(model, lora string, tokens []uint32, pods []string, out *indexer.MatchResult)
}

// Config configures a Router. Fields name the environment variable that sets
// them; the variables are parsed by the gateway's configuration, not here.
// New refuses a number field that is NaN or infinite.
type Config struct {
	// Index is the prefix index. Without one, prefix-cache and kv-aware
	// route on load alone, as they do for a request without tokens.
	Index PrefixIndex

	// DefaultAlgorithm serves requests that name none
	// (KVGATE_ROUTING_ALGORITHM or ROUTING_ALGORITHM; default kv-aware).
	DefaultAlgorithm string
	// ImbalanceAbsCount is prefix-cache's load-imbalance guard: when the
	// running requests of the most and least loaded pods differ by more,
	// the request goes to the least loaded pod
	// (AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT, default
	// 8). Zero means the default (a count of zero would take the choice
	// from the prefix match whenever two loads differ); negative is
	// invalid.
	ImbalanceAbsCount int
	// StdDevFactor bounds the load of a pod prefix-cache chooses for its
	// match: running <= mean + StdDevFactor x standard deviation
	// (AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR, default 1). Zero means
	// the default; a negative value means a factor of zero, the bound at
	// the mean itself (see StdDevFactorSetting).
	StdDevFactor float64
	// CPUCacheWeight is the share of a token's prefill time saved when its
	// KV cache is held only outside GPU memory (CPU or storage tiers) and
	// must be loaded back: 1 counts such tokens as fully cached, a small
	// value as nearly uncached (KVGATE_ROUTING_CPU_CACHE_WEIGHT, default
	// 0.8). GPU-resident tokens always count fully. Zero means the
	// default; valid weights are in (0, 1].
	CPUCacheWeight float64
	// DefaultPrefillTokensPerSecond is the prefill speed assumed for a pod
	// when no candidate pod of the request has a measured speed
	// (KVGATE_ROUTING_DEFAULT_PREFILL_TOKENS_PER_SECOND, default 10000).
	// Zero means the default; below MinPrefillTokensPerSecond is invalid.
	DefaultPrefillTokensPerSecond float64
	// TieTolerance is the relative margin within which kv-aware treats
	// costs as equal and chooses among the pods by load
	// (KVGATE_ROUTING_TTFT_TIE_TOLERANCE, default 0.05: within 5% of the
	// least). Zero means the default; a negative value means none, only
	// equal costs being equal (see TieToleranceSetting).
	TieTolerance float64
	// MinFleetQueue is the least number of prefills kv-aware and the
	// SLO-aware algorithms take every pod to have queued when they price
	// what a prefill costs the fleet (K in the package documentation's
	// cost model; KVGATE_ROUTING_MIN_FLEET_QUEUE, default 0.5). Higher
	// keeps more cache hits at and below the fleet's capacity, for longer
	// queues on the pods holding hot prefixes beyond it. Zero means the
	// default; a negative value sets no floor, so that a prefill costs the
	// fleet only once every pod has one queued.
	MinFleetQueue float64
	// MaxInFlightPrefixBlocks bounds the prompt blocks the Router
	// remembers for the attempts in flight (see
	// Candidate.InFlightMatchedBlocks), counted per attempt, 8 bytes each
	// (KVGATE_ROUTING_MAX_INFLIGHT_PREFIX_BLOCKS, default 1Mi). An attempt
	// that would exceed it is not remembered, and counted in
	// kvgate_routing_inflight_prefix_dropped_total.
	MaxInFlightPrefixBlocks int

	// Profiles gives the GPU profiles the SLO-aware algorithms read (a
	// pod's profiled inter-token latency and capacity); nil reads none.
	Profiles ProfileSource

	// Rand is the source of random choices (the random algorithm and
	// ties). Nil means a source seeded at random; a seeded source makes
	// decisions reproducible for the same inputs and order of calls. The
	// Router serializes its use.
	Rand rand.Source
	// Now is the clock the prefill queues are read on, the request
	// ledger's (default time.Now); a simulation passes its virtual clock.
	// Decision latency is always measured on the wall clock.
	Now func() time.Time
	// Registerer receives the Router's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives the Router's logs (default klog.Background()); a
	// request whose context carries a logger logs there.
	Logger klog.Logger
}

// withDefaults returns c with its zero fields defaulted.
func (c Config) withDefaults() Config {
	c.DefaultAlgorithm = cmp.Or(c.DefaultAlgorithm, DefaultAlgorithm)
	c.ImbalanceAbsCount = cmp.Or(c.ImbalanceAbsCount, DefaultImbalanceAbsCount)
	c.StdDevFactor = cmp.Or(c.StdDevFactor, DefaultStdDevFactor)
	c.CPUCacheWeight = cmp.Or(c.CPUCacheWeight, DefaultCPUCacheWeight)
	c.DefaultPrefillTokensPerSecond = cmp.Or(c.DefaultPrefillTokensPerSecond, DefaultPrefillTokensPerSecond)
	c.TieTolerance = cmp.Or(c.TieTolerance, DefaultTieTolerance)
	c.MinFleetQueue = cmp.Or(c.MinFleetQueue, DefaultMinFleetQueue)
	c.MaxInFlightPrefixBlocks = cmp.Or(c.MaxInFlightPrefixBlocks, DefaultMaxInFlightPrefixBlocks)
	if c.Rand == nil {
		c.Rand = rand.NewPCG(rand.Uint64(), rand.Uint64())
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return c
}

// MinPrefillTokensPerSecond is the least Config.DefaultPrefillTokensPerSecond
// New accepts, the least speed a scrape is believed
// (cache.MinPrefillTokensPerSecond): no engine prefills slower, and a speed
// close enough to zero makes every pod's cost infinite, leaving none to
// choose.
const MinPrefillTokensPerSecond = cache.MinPrefillTokensPerSecond

// validate checks a defaulted Config: every number must be finite, and
// within its field's range.
func (c Config) validate() error {
	var errs []error
	finite := func(name string, v float64) bool {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("%s %v is not a finite number", name, v))
			return false
		}
		return true
	}
	if !IsAlgorithm(c.DefaultAlgorithm) {
		errs = append(errs, fmt.Errorf("DefaultAlgorithm: %w", &UnknownAlgorithmError{Name: c.DefaultAlgorithm}))
	}
	if c.ImbalanceAbsCount < 0 {
		errs = append(errs, fmt.Errorf("ImbalanceAbsCount %d is negative", c.ImbalanceAbsCount))
	}
	finite("StdDevFactor", c.StdDevFactor)
	if finite("CPUCacheWeight", c.CPUCacheWeight) && (c.CPUCacheWeight < 0 || c.CPUCacheWeight > 1) {
		errs = append(errs, fmt.Errorf("CPUCacheWeight %v is not within [0, 1]", c.CPUCacheWeight))
	}
	if finite("DefaultPrefillTokensPerSecond", c.DefaultPrefillTokensPerSecond) &&
		c.DefaultPrefillTokensPerSecond < MinPrefillTokensPerSecond {
		errs = append(errs, fmt.Errorf("DefaultPrefillTokensPerSecond %v is below %v token a second",
			c.DefaultPrefillTokensPerSecond, MinPrefillTokensPerSecond))
	}
	if c.MaxInFlightPrefixBlocks < 0 {
		errs = append(errs, fmt.Errorf("MaxInFlightPrefixBlocks %d is negative", c.MaxInFlightPrefixBlocks))
	}
	finite("TieTolerance", c.TieTolerance)
	finite("MinFleetQueue", c.MinFleetQueue)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid routing config: %w", err)
	}
	return nil
}
