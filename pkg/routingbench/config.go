package routingbench

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/redisstate"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/slo"
	"github.com/kvgate/kvgate/pkg/types"
)

// TTFTOracle names the policy that sees the engines: a greedy minimiser of
// each request's time to first token with perfect knowledge of the engines'
// caches, queues and latency models (see the package documentation). It is
// a reference for what kv-aware predicts, not a bound: it optimises one
// request at a time and ignores decode load, so other policies may beat it
// on hit ratio or end-to-end latency. PooledBound bounds the hit ratio. The
// other policies are the routing package's algorithms of the same names.
const TTFTOracle = "ttft-oracle"

// Policies returns the names of the policies a benchmark compares by
// default, in report order.
func Policies() []string {
	return []string{routing.Random, routing.LeastRequest, routing.PrefixCache, routing.KVAware, TTFTOracle}
}

// AllPolicies returns every policy a benchmark can compare: the routing
// package's six algorithms and the TTFT oracle, in report order.
func AllPolicies() []string {
	return []string{routing.Random, routing.LeastRequest, routing.LeastKVCache, routing.LeastLatency,
		routing.PrefixCache, routing.KVAware, TTFTOracle}
}

// Defaults of Config's zero fields.
const (
	DefaultEngines            = 8
	DefaultScrapeInterval     = 50 * time.Millisecond
	DefaultMetricsWindow      = cache.DefaultRecentMetricsWindow
	DefaultPrefillSpeedWindow = cache.DefaultPrefillSpeedWindow
	// DefaultRouterPrefillTokensPerSecond is the prefill speed the routers
	// assume until they measure one: twice the routing package's default,
	// and more than twice what the default engines reach on long prompts,
	// so that what the routers learn from scrapes is what is measured.
	DefaultRouterPrefillTokensPerSecond = 2 * routing.DefaultPrefillTokensPerSecond
)

// DefaultEvents is how KV events reach the index by default: 5 ms after
// the step that produced them (vLLM's publisher thread, the pod network,
// the client's decoding), plus an exponential delay of 20 ms on average
// that holds back the batches behind it, and one batch in a thousand lost
// for good (a subscriber that fell behind the publisher's high-water mark
// with no replay to recover it).
var DefaultEvents = sim.EventDelivery{Delay: 5 * time.Millisecond, Jitter: 20 * time.Millisecond, LossRate: 0.001}

// DefaultLatency prices the steps of an 8B-class model (Llama 3.1 8B:
// 16 GFLOP per token for the weights, 32 layers x 4,096 dimensions of
// attention, 128 KiB of KV cache per token, 16 GB of weights) on one
// A100-80GB-class GPU: 90 us per prefill token plus 3.5 ns per earlier
// token it attends to, decode steps of 10 ms plus, per running request,
// 60 us and 64 ns per token of its context. The package documentation
// derives the numbers.
var DefaultLatency = sim.LatencyModel{
	StepOverhead:             10 * time.Millisecond,
	PrefillPerToken:          90 * time.Microsecond,
	AttentionPerContextToken: 3.5,
	DecodePerToken:           60 * time.Microsecond,
	DecodePerContextToken:    64,
}

// DefaultSpeeds are the relative speeds of a heterogeneous default fleet,
// cycled over its engines: an A100-class engine (1), an H100-class one
// (1.8), another A100, and an L40S-class one (0.6). Eight engines are four
// A100s, two H100s and two L40Ss.
var DefaultSpeeds = []float64{1, 1.8, 1, 0.6}

// DefaultEngine is the shape of each engine: vLLM's defaults (block size
// 16, 256 sequences, chunked prefill in steps of 8192 tokens) with the KV
// cache an 80 GB GPU has left for an 8B-class model, 25,000 blocks of 16
// tokens (400,000 tokens), and a maximum model length of all of it, so
// that the longest requests of a trace are served rather than refused.
var DefaultEngine = sim.EngineConfig{
	BlockSize:           16,
	NumGPUBlocks:        25_000,
	MaxNumSeqs:          256,
	MaxNumBatchedTokens: 8192,
	Latency:             DefaultLatency,
}

// Config configures a benchmark. A zero field takes the default its
// documentation names.
type Config struct {
	// Engines is the number of engines, one pod each; default 8.
	Engines int
	// Engine is the shape of every engine; zero means DefaultEngine. Its
	// zero fields take sim's defaults, but a zero MaxModelLen means all
	// the KV cache holds. HashSeed, DataParallelRank and Events are set
	// per engine.
	Engine sim.EngineConfig
	// ScrapeInterval is how often the gateway's Store scrapes each
	// engine's metrics (AIBrix's AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS);
	// default 50 ms.
	ScrapeInterval time.Duration
	// MetricsWindow is the Store's window for recent means and rates
	// (cache.Config.RecentMetricsWindow); default 10 s.
	MetricsWindow time.Duration
	// PrefillSpeedWindow is the Store's window for prefill speeds
	// (cache.Config.PrefillSpeedWindow); default 1 min.
	PrefillSpeedWindow time.Duration
	// Speeds are the engines' relative speeds, cycled over them: engine i
	// runs at Speeds[i mod len(Speeds)] times the speed of Engine's latency
	// model. Empty means every engine at 1 (use DefaultSpeeds for the
	// default heterogeneous fleet).
	Speeds []float64
	// Events is how each engine's KV event batches reach the index; the
	// zero value means DefaultEvents.
	Events sim.EventDelivery
	// RouterPrefillTokensPerSecond is the routers' prefill speed before
	// any is measured (routing.Config.DefaultPrefillTokensPerSecond);
	// default DefaultRouterPrefillTokensPerSecond.
	RouterPrefillTokensPerSecond float64
	// RouterMinFleetQueue is the routers' routing.Config.MinFleetQueue:
	// zero means routing's default, a negative value no floor.
	RouterMinFleetQueue float64
	// Policies names the policies to compare, in report order; default
	// Policies().
	Policies []string
	// Seed seeds every random choice; the same workload, configuration and
	// seed give the same results.
	Seed uint64
	// Parallel bounds the policies simulated at once; default 1. Results
	// do not depend on it.
	Parallel int
	// SLO is every request's service-level objective: the SLO-aware
	// policies route by it, and every policy's goodput and attainment are
	// counted against it (PolicyResult.SLOMet). Zero counts none.
	SLO types.SLO
	// QueueMaxLength and QueueMaxWait bound the SLO-aware policies' queue
	// (slo.DefaultMaxQueueLength and slo.DefaultMaxWait when 0).
	QueueMaxLength int
	QueueMaxWait   time.Duration
	// Replicas is how many gateway replicas every policy but the oracle
	// runs as (default 1): request i arrives at replica i mod Replicas, and
	// each replica is a Router of its own with its own request ledger and
	// load records, following the same index.
	Replicas int
	// ShareInterval is how often the replicas share what they have in
	// flight (requests, prefill work, prompt blocks), as the gateway's
	// KVGATE_SHARED_STATE_INTERVAL_MS; each replica's view of the others is
	// then at most that old. Default redisstate.DefaultSharedCountsInterval
	// (200 ms). Unshared has them share nothing: each routes on its own
	// requests alone, as replicas without Redis do.
	ShareInterval time.Duration
	Unshared      bool
}

func (c Config) withDefaults() Config {
	c.Engines = cmp.Or(c.Engines, DefaultEngines)
	if c.Engine == (sim.EngineConfig{}) {
		c.Engine = DefaultEngine
	}
	c.Engine.BlockSize = cmp.Or(c.Engine.BlockSize, 16)
	c.Engine.NumGPUBlocks = cmp.Or(c.Engine.NumGPUBlocks, 4096)
	c.Engine.MaxModelLen = cmp.Or(c.Engine.MaxModelLen, (c.Engine.NumGPUBlocks-1)*c.Engine.BlockSize)
	c.ScrapeInterval = cmp.Or(c.ScrapeInterval, DefaultScrapeInterval)
	c.MetricsWindow = cmp.Or(c.MetricsWindow, DefaultMetricsWindow)
	c.PrefillSpeedWindow = cmp.Or(c.PrefillSpeedWindow, DefaultPrefillSpeedWindow)
	if c.Events == (sim.EventDelivery{}) {
		c.Events = DefaultEvents
	}
	c.RouterPrefillTokensPerSecond = cmp.Or(c.RouterPrefillTokensPerSecond, DefaultRouterPrefillTokensPerSecond)
	if len(c.Policies) == 0 {
		c.Policies = Policies()
	}
	c.Parallel = cmp.Or(c.Parallel, 1)
	c.QueueMaxLength = cmp.Or(c.QueueMaxLength, slo.DefaultMaxQueueLength)
	c.QueueMaxWait = cmp.Or(c.QueueMaxWait, slo.DefaultMaxWait)
	c.Replicas = cmp.Or(c.Replicas, 1)
	c.ShareInterval = cmp.Or(c.ShareInterval, redisstate.DefaultSharedCountsInterval)
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Engines < 1 {
		errs = append(errs, fmt.Errorf("%d engines, want at least 1", c.Engines))
	}
	if c.ScrapeInterval < 0 || c.MetricsWindow < 0 || c.PrefillSpeedWindow < 0 {
		errs = append(errs, errors.New("scrape interval and metrics windows must not be negative"))
	}
	if err := c.Events.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.RouterPrefillTokensPerSecond < 0 {
		errs = append(errs, fmt.Errorf("router prefill speed %v must not be negative", c.RouterPrefillTokensPerSecond))
	}
	for _, v := range c.Speeds {
		if !(v > 0) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("engine speed %v, want a positive number", v))
		}
	}
	if err := c.SLO.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.QueueMaxLength < 0 || c.QueueMaxWait < 0 {
		errs = append(errs, errors.New("queue bounds must not be negative"))
	}
	if c.Replicas < 1 || c.ShareInterval < 0 {
		errs = append(errs, fmt.Errorf("%d replicas sharing every %v: want at least 1, and an interval not negative", c.Replicas, c.ShareInterval))
	}
	if c.Parallel < 1 {
		errs = append(errs, fmt.Errorf("parallel %d, want at least 1", c.Parallel))
	}
	known := append(AllPolicies(), routing.SLO, routing.SLOLeastLoad, routing.SLOLeastLoadPulling, routing.SLOPackLoad)
	for i, p := range c.Policies {
		if !slices.Contains(known, p) {
			errs = append(errs, fmt.Errorf("unknown policy %q (known: %s)", p, strings.Join(known, ", ")))
		}
		if slices.Contains(c.Policies[:i], p) {
			errs = append(errs, fmt.Errorf("policy %q named twice", p))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid benchmark config: %w", err)
	}
	return nil
}

// normalize returns c defaulted, with the engine shape as sim fills it in,
// or an error saying what is invalid.
func (c Config) normalize() (Config, error) {
	c = c.withDefaults()
	eng, err := sim.NewEngine(c.Engine)
	if err != nil {
		return c, fmt.Errorf("invalid benchmark config: engine: %w", err)
	}
	c.Engine = eng.Config()
	return c, c.validate()
}
