package routingbench

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/routing"
)

// Setup records the configuration a report was produced with.
type Setup struct {
	Engines                  int       `json:"engines"`
	Speeds                   []float64 `json:"speeds,omitempty"`
	BlockSize                int       `json:"blockSize"`
	NumGPUBlocks             int       `json:"numGPUBlocks"`
	MaxNumSeqs               int       `json:"maxNumSeqs"`
	MaxNumBatchedTokens      int       `json:"maxNumBatchedTokens"`
	MaxModelLen              int       `json:"maxModelLen"`
	StepOverhead             float64   `json:"stepOverheadSeconds"`
	PrefillPerToken          float64   `json:"prefillPerTokenSeconds"`
	AttentionPerContextToken float64   `json:"attentionPerContextTokenSeconds"`
	DecodePerToken           float64   `json:"decodePerTokenSeconds"`
	DecodePerContextToken    float64   `json:"decodePerContextTokenSeconds"`
	ScrapeInterval           float64   `json:"scrapeIntervalSeconds"`
	MetricsWindow            float64   `json:"metricsWindowSeconds"`
	PrefillSpeedWindow       float64   `json:"prefillSpeedWindowSeconds"`
	EventDelay               float64   `json:"eventDelaySeconds"`
	EventJitter              float64   `json:"eventJitterSeconds"`
	EventLossRate            float64   `json:"eventLossRate"`
	RouterPrefillSpeed       float64   `json:"routerPrefillTokensPerSecond"`
	RouterMinFleetQueue      float64   `json:"routerMinFleetQueue"`
	Seed                     uint64    `json:"seed"`
}

// Report is the outcome of a benchmark: one result per policy, in the
// order the configuration names them.
type Report struct {
	Workload string        `json:"workload"`
	Stats    WorkloadStats `json:"workloadStats"`
	// Load is the share of the fleet's capacity the workload was scaled to
	// ask for (see AtLoad), 0 when it runs at its own rate.
	Load  float64 `json:"load,omitempty"`
	Setup Setup   `json:"setup"`
	// Bound is the workload's pooled bound on the fleet.
	Bound *PooledBound `json:"pooledBound"`
	// Tokenization compares the gateway's tokenization of a text workload
	// with the engines'; nil for a workload of token ids.
	Tokenization *TokenizationStats `json:"tokenization,omitempty"`
	Results      []*PolicyResult    `json:"results"`
}

// Result returns the result of the named policy, or nil.
func (r *Report) Result(policy string) *PolicyResult { return resultOf(r.Results, policy) }

// resultOf returns the result of the named policy among results, or nil.
func resultOf(results []*PolicyResult, policy string) *PolicyResult {
	for _, res := range results {
		if res.Policy == policy {
			return res
		}
	}
	return nil
}

// Run plays w under each policy of cfg, each on its own fleet of fresh
// engines and its own index, and reports how each did. The same workload,
// configuration and seed give the same report, whatever cfg.Parallel. It
// fails on an invalid configuration or workload, or when ctx ends.
func Run(ctx context.Context, cfg Config, w Workload) (*Report, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	if err := w.validate(cfg.Engine.VocabSize); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([]*PolicyResult, len(cfg.Policies))
	errs := make([]error, len(cfg.Policies))
	slots := make(chan struct{}, cfg.Parallel)
	var wg sync.WaitGroup
	for i, name := range cfg.Policies {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			results[i], errs[i] = simulate(ctx, cfg, &w, name)
			if errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	bound := pooledBound(cfg, &w)
	for _, res := range results {
		if bound.HitRatio > 0 {
			res.HitRatioOfBound = res.HitRatio / bound.HitRatio
		}
	}
	return &Report{Workload: w.Name, Stats: w.Stats(), Load: w.Load, Setup: setupOf(cfg),
		Bound: bound, Tokenization: w.Tokenization, Results: results}, nil
}

func setupOf(cfg Config) Setup {
	e := cfg.Engine
	sec := time.Duration.Seconds
	return Setup{
		Engines: cfg.Engines, Speeds: cfg.Speeds, BlockSize: e.BlockSize, NumGPUBlocks: e.NumGPUBlocks,
		MaxNumSeqs: e.MaxNumSeqs, MaxNumBatchedTokens: e.MaxNumBatchedTokens, MaxModelLen: e.MaxModelLen,
		StepOverhead: sec(e.Latency.StepOverhead), PrefillPerToken: sec(e.Latency.PrefillPerToken),
		AttentionPerContextToken: e.Latency.AttentionPerContextToken / 1e9,
		DecodePerToken:           sec(e.Latency.DecodePerToken), DecodePerContextToken: e.Latency.DecodePerContextToken / 1e9,
		ScrapeInterval: sec(cfg.ScrapeInterval), MetricsWindow: sec(cfg.MetricsWindow),
		PrefillSpeedWindow: sec(cfg.PrefillSpeedWindow), EventDelay: sec(cfg.Events.Delay),
		EventJitter: sec(cfg.Events.Jitter), EventLossRate: cfg.Events.LossRate,
		RouterPrefillSpeed: cfg.RouterPrefillTokensPerSecond, RouterMinFleetQueue: routing.Config{MinFleetQueue: cfg.RouterMinFleetQueue}.FleetQueueFloor(),
		Seed: cfg.Seed,
	}
}
