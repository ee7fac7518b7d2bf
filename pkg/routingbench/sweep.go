package routingbench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
)

// WorkloadSource makes a workload for a seed: a generator seeded with it,
// or a trace that ignores it.
type WorkloadSource struct {
	Name string
	Make func(seed uint64) (Workload, error)
}

// SweepConfig configures a sweep: every workload at every load on every
// fleet size, once per seed.
type SweepConfig struct {
	// Base configures every run; its Engines and Seed are replaced by the
	// sweep's.
	Base Config
	// Engines lists the fleet sizes; default Base.Engines.
	Engines []int
	// Loads lists the shares of the fleet's capacity each workload is
	// scaled to (see AtLoad); empty runs each workload at its own rate.
	Loads []float64
	// Seeds lists the seeds, each seeding the runs and the workloads'
	// generators; default Base.Seed.
	Seeds []uint64
}

// Sweep is the outcome of a sweep: one point per workload, fleet size and
// load, in that order of nesting.
type Sweep struct {
	Points []*SweepPoint `json:"points"`
}

// SweepPoint is one workload at one load on one fleet size, over the
// sweep's seeds.
type SweepPoint struct {
	Workload string   `json:"workload"`
	Engines  int      `json:"engines"`
	Load     float64  `json:"load,omitempty"`
	Seeds    []uint64 `json:"seeds"`
	// Reports holds the report of each seed, in the order of Seeds.
	Reports []*Report `json:"-"`
	// Policies summarises each policy over the seeds, in report order.
	Policies []PolicySummary `json:"policies"`
	// Bound summarises the pooled bound's hit ratio over the seeds.
	Bound Spread `json:"pooledBoundHitRatio"`
	// Targets summarises kv-aware's targets over the seeds.
	Targets []TargetSummary `json:"targets"`
}

// Spread is a measure over seeds: its mean, least and greatest values.
type Spread struct {
	Mean float64 `json:"mean"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
}

func spreadOf(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	s := Spread{Min: math.Inf(1), Max: math.Inf(-1)}
	for _, x := range v {
		s.Mean += x / float64(len(v))
		s.Min, s.Max = min(s.Min, x), max(s.Max, x)
	}
	return s
}

// PolicySummary is what one policy achieved at a sweep point over its
// seeds.
type PolicySummary struct {
	Policy          string `json:"policy"`
	HitRatio        Spread `json:"hitRatio"`
	HitRatioOfBound Spread `json:"hitRatioOfBound"`
	TTFTP50         Spread `json:"ttftP50Seconds"`
	TTFTP90         Spread `json:"ttftP90Seconds"`
	TTFTP99         Spread `json:"ttftP99Seconds"`
	E2EP90          Spread `json:"e2eP90Seconds"`
	Preemptions     Spread `json:"preemptions"`
	RequestsSpread  Spread `json:"requestsSpread"`
}

// TargetSummary is one of kv-aware's targets at a sweep point over its
// seeds: met when met at every seed, with the spreads of kv-aware's measure
// and of the bound it was held to.
type TargetSummary struct {
	Name  string `json:"name"`
	Met   bool   `json:"met"`
	Value Spread `json:"value"`
	Bound Spread `json:"bound"`
}

// RunSweep runs every point of cfg for each workload, calling report (when
// not nil) with each run's report as it completes. It fails on an invalid
// configuration, a workload that cannot be made or scaled, or when ctx
// ends.
func RunSweep(ctx context.Context, cfg SweepConfig, workloads []WorkloadSource, report func(*Report) error) (*Sweep, error) {
	if len(workloads) == 0 {
		return nil, errors.New("sweep: no workloads")
	}
	engines := cfg.Engines
	if len(engines) == 0 {
		engines = []int{cfg.Base.withDefaults().Engines}
	}
	seeds := cfg.Seeds
	if len(seeds) == 0 {
		seeds = []uint64{cfg.Base.Seed}
	}
	loads := cfg.Loads
	if len(loads) == 0 {
		loads = []float64{0}
	}
	sw := &Sweep{}
	for _, src := range workloads {
		for _, n := range engines {
			for _, load := range loads {
				pt := &SweepPoint{Workload: src.Name, Engines: n, Load: load, Seeds: seeds}
				for _, seed := range seeds {
					rep, err := runPoint(ctx, cfg.Base, src, n, load, seed)
					if err != nil {
						return nil, err
					}
					pt.Reports = append(pt.Reports, rep)
					if report != nil {
						if err := report(rep); err != nil {
							return nil, err
						}
					}
				}
				pt.summarize()
				sw.Points = append(sw.Points, pt)
			}
		}
	}
	return sw, nil
}

// runPoint runs src's workload for seed at load on n engines.
func runPoint(ctx context.Context, base Config, src WorkloadSource, n int, load float64, seed uint64) (*Report, error) {
	cfg := base
	cfg.Engines, cfg.Seed = n, seed
	w, err := src.Make(seed)
	if err != nil {
		return nil, fmt.Errorf("workload %s, seed %d: %w", src.Name, seed, err)
	}
	if load > 0 {
		if w, err = AtLoad(cfg, w, load); err != nil {
			return nil, fmt.Errorf("workload %s at %gx on %d engines: %w", src.Name, load, n, err)
		}
	}
	return Run(ctx, cfg, w)
}

// summarize fills in the point's summaries from its reports.
func (pt *SweepPoint) summarize() {
	var bound []float64
	for _, rep := range pt.Reports {
		bound = append(bound, rep.Bound.HitRatio)
	}
	pt.Bound = spreadOf(bound)
	for i, res := range pt.Reports[0].Results {
		collect := func(f func(*PolicyResult) float64) Spread {
			v := make([]float64, len(pt.Reports))
			for j, rep := range pt.Reports {
				v[j] = f(rep.Results[i])
			}
			return spreadOf(v)
		}
		pt.Policies = append(pt.Policies, PolicySummary{
			Policy:          res.Policy,
			HitRatio:        collect(func(r *PolicyResult) float64 { return r.HitRatio }),
			HitRatioOfBound: collect(func(r *PolicyResult) float64 { return r.HitRatioOfBound }),
			TTFTP50:         collect(func(r *PolicyResult) float64 { return r.TTFT.P50 }),
			TTFTP90:         collect(func(r *PolicyResult) float64 { return r.TTFT.P90 }),
			TTFTP99:         collect(func(r *PolicyResult) float64 { return r.TTFT.P99 }),
			E2EP90:          collect(func(r *PolicyResult) float64 { return r.E2E.P90 }),
			Preemptions:     collect(func(r *PolicyResult) float64 { return float64(r.Preemptions) }),
			RequestsSpread:  collect(func(r *PolicyResult) float64 { return r.RequestsSpread }),
		})
	}
	index := map[string]int{}
	var values, bounds [][]float64
	for _, rep := range pt.Reports {
		for _, t := range rep.Targets() {
			name := targetKey(t.Name)
			i, ok := index[name]
			if !ok {
				i = len(pt.Targets)
				index[name] = i
				pt.Targets = append(pt.Targets, TargetSummary{Name: name, Met: true})
				values, bounds = append(values, nil), append(bounds, nil)
			}
			pt.Targets[i].Met = pt.Targets[i].Met && t.Met
			values[i], bounds[i] = append(values[i], t.Value), append(bounds[i], t.Bound)
		}
	}
	for i := range pt.Targets {
		pt.Targets[i].Value, pt.Targets[i].Bound = spreadOf(values[i]), spreadOf(bounds[i])
	}
}

// targetKey names a target apart from the policy it was compared with,
// which may differ between seeds.
func targetKey(name string) string {
	if i := strings.Index(name, " ("); i > 0 {
		return name[:i]
	}
	return name
}
