package routingbench

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/pkg/routing"
)

// OverloadPolicies returns the policies the overload scenario compares by
// default: kv-aware, prefix-cache and the SLO-aware algorithms.
func OverloadPolicies() []string {
	return []string{routing.KVAware, routing.PrefixCache, routing.SLOLeastLoad, routing.SLOLeastLoadPulling, routing.SLOPackLoad}
}

// DefaultLoads are the arrival rates of the overload scenario, as multiples
// of the fleet's capacity.
var DefaultLoads = []float64{0.5, 0.8, 1, 1.5, 2, 3}

// CapacityAttainment is the share of requests kv-aware serves within the
// SLO at the fleet's capacity (see MeasureCapacity).
const CapacityAttainment = 0.99

// capacitySteps is how many times MeasureCapacity halves its bracket.
const capacitySteps = 4

// OverloadConfig configures RunOverload: the benchmark's Config (its SLO
// is required; Policies default to OverloadPolicies), the loads to play and
// the fleet's capacity.
type OverloadConfig struct {
	Config
	// Loads are the arrival rates to play, as multiples of Capacity, in
	// report order (default DefaultLoads).
	Loads []float64
	// Capacity is the rate, in requests per second, the fleet serves the
	// workload at; 0 measures it with MeasureCapacity.
	Capacity float64
}

// OverloadLevel is what each policy did at one load.
type OverloadLevel struct {
	// Load is the arrival rate as a multiple of the capacity, Rate the
	// same in requests per second, Speedup the factor the workload's
	// arrival times were divided by.
	Load    float64         `json:"load"`
	Rate    float64         `json:"requestsPerSecond"`
	Speedup float64         `json:"speedup"`
	Results []*PolicyResult `json:"results"`
}

// Result returns the result of the named policy, or nil.
func (l *OverloadLevel) Result(policy string) *PolicyResult { return resultOf(l.Results, policy) }

// OverloadReport is the outcome of the overload scenario on one workload.
type OverloadReport struct {
	Workload string        `json:"workload"`
	Stats    WorkloadStats `json:"workloadStats"`
	Setup    Setup         `json:"setup"`
	SLO      string        `json:"slo"`
	// NativeRate is the workload's own arrival rate, Capacity the fleet's
	// (both in requests per second); CapacityMeasured says whether
	// MeasureCapacity measured it.
	NativeRate       float64         `json:"nativeRequestsPerSecond"`
	Capacity         float64         `json:"capacityRequestsPerSecond"`
	CapacityMeasured bool            `json:"capacityMeasured"`
	Levels           []OverloadLevel `json:"levels"`
}

// MeasureCapacity returns the fleet's capacity for w within cfg.SLO: the
// highest arrival rate, in requests per second, at which kv-aware serves
// at least CapacityAttainment of w's requests within the SLO. It searches
// the rate by doubling or halving w's own until the attainment crosses the
// bound, then bisecting (geometrically) capacitySteps times, a simulation
// of w each; the rate returned met the bound.
func MeasureCapacity(ctx context.Context, cfg Config, w Workload) (float64, error) {
	cfg.Policies = []string{routing.KVAware}
	cfg.Parallel = 1
	native := w.rate()
	meets := func(speedup float64) (bool, error) {
		rep, err := Run(ctx, cfg, w.Scaled(speedup))
		if err != nil {
			return false, fmt.Errorf("measure capacity at %.3gx the workload's rate: %w", speedup, err)
		}
		return rep.Results[0].SLOAttainment >= CapacityAttainment, nil
	}
	lo, hi := 0.0, 0.0
	ok, err := meets(1)
	if err != nil {
		return 0, err
	}
	if ok {
		lo = 1
		for hi == 0 {
			if ok, err = meets(2 * lo); err != nil {
				return 0, err
			} else if ok {
				lo *= 2
			} else {
				hi = 2 * lo
			}
		}
	} else {
		hi = 1
		for lo == 0 {
			if hi < 1.0/1024 {
				return 0, errors.New("measure capacity: kv-aware misses the SLO however slowly the workload arrives")
			}
			if ok, err = meets(hi / 2); err != nil {
				return 0, err
			} else if ok {
				lo = hi / 2
			} else {
				hi /= 2
			}
		}
	}
	for range capacitySteps {
		mid := math.Sqrt(lo * hi)
		if ok, err = meets(mid); err != nil {
			return 0, err
		} else if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo * native, nil
}

// Scaled returns w with its arrival times divided by speedup: the same
// requests arriving speedup times as fast.
func (w Workload) Scaled(speedup float64) Workload {
	out := Workload{Name: w.Name, Requests: slices.Clone(w.Requests)}
	for i := range out.Requests {
		out.Requests[i].Arrival = time.Duration(float64(w.Requests[i].Arrival) / speedup)
	}
	return out
}

// Head returns w's first n requests (all of them when n is 0 or more than
// w has).
func (w Workload) Head(n int) Workload {
	if n <= 0 || n >= len(w.Requests) {
		return w
	}
	return Workload{Name: w.Name, Requests: w.Requests[:n]}
}

// rate returns w's arrival rate in requests per second.
func (w Workload) rate() float64 {
	span := w.Stats().Duration.Seconds()
	if span <= 0 {
		return 0
	}
	return float64(len(w.Requests)-1) / span
}

// RunOverload plays w at each load of cfg (its arrival rate scaled to that
// multiple of the fleet's capacity) under each policy, and reports what
// each did: goodput, SLO attainment, time to first token of the requests
// served, and the requests queued, refused and expired. It fails without
// an SLO, on an invalid configuration or workload, or when ctx ends.
func RunOverload(ctx context.Context, cfg OverloadConfig, w Workload) (*OverloadReport, error) {
	if cfg.SLO.IsZero() {
		return nil, errors.New("overload scenario: no SLO to measure goodput against")
	}
	if len(cfg.Policies) == 0 {
		cfg.Policies = OverloadPolicies()
	}
	if len(cfg.Loads) == 0 {
		cfg.Loads = DefaultLoads
	}
	for _, l := range cfg.Loads {
		if !(l > 0) || math.IsInf(l, 0) {
			return nil, fmt.Errorf("overload scenario: load %v is not a positive multiple of the capacity", l)
		}
	}
	norm, err := cfg.Config.normalize()
	if err != nil {
		return nil, err
	}
	if err := w.validate(norm.Engine.VocabSize); err != nil {
		return nil, err
	}
	rep := &OverloadReport{Workload: w.Name, Stats: w.Stats(), Setup: setupOf(norm), SLO: cfg.SLO.String(),
		NativeRate: w.rate(), Capacity: cfg.Capacity}
	if rep.NativeRate <= 0 {
		return nil, fmt.Errorf("overload scenario: workload %q arrives all at once: no rate to scale", w.Name)
	}
	if rep.Capacity <= 0 {
		if rep.Capacity, err = MeasureCapacity(ctx, cfg.Config, w); err != nil {
			return nil, err
		}
		rep.CapacityMeasured = true
	}
	for _, load := range cfg.Loads {
		speedup := load * rep.Capacity / rep.NativeRate
		r, err := Run(ctx, cfg.Config, w.Scaled(speedup))
		if err != nil {
			return nil, fmt.Errorf("load %v: %w", load, err)
		}
		rep.Levels = append(rep.Levels, OverloadLevel{Load: load, Rate: load * rep.Capacity, Speedup: speedup, Results: r.Results})
	}
	return rep, nil
}

// ServableRate returns the most requests per second the fleet can serve
// within the SLO at load l: the requests arriving, up to the fleet's
// capacity.
func (r *OverloadReport) ServableRate(l *OverloadLevel) float64 { return min(l.Rate, r.Capacity) }

// MaxGoodput returns the most requests per second any policy served within
// the SLO at any load.
func (r *OverloadReport) MaxGoodput() float64 {
	best := 0.0
	for _, l := range r.Levels {
		for _, res := range l.Results {
			best = max(best, res.Goodput)
		}
	}
	return best
}

// Targets checks each SLO-aware policy against kv-aware: at twice the
// capacity, a goodput at least 1.5 times kv-aware's and at least 90% of
// what the fleet can serve within the SLO (ServableRate: its capacity); at
// 0.8 times the capacity and below, no request queued, refused or
// expired, and a median and p90 time to first token within 5% of
// kv-aware's. A target whose load or policies the report lacks is left
// out.
func (r *OverloadReport) Targets() []Target {
	var ts []Target
	for i := range r.Levels {
		l := &r.Levels[i]
		kv := l.Result(routing.KVAware)
		if kv == nil {
			continue
		}
		for _, res := range l.Results {
			if !routing.IsSLOAware(res.Policy) {
				continue
			}
			at := fmt.Sprintf("%s at %gx", res.Policy, l.Load)
			switch {
			case l.Load == 2:
				ts = append(ts, atLeast(at+": goodput >= 1.5 x kv-aware's", res.Goodput, kv.Goodput, 1.5))
				ts = append(ts, atLeast(at+": goodput >= 0.9 x what the fleet can serve", res.Goodput, r.ServableRate(l), 0.9))
			case l.Load <= 0.8:
				held := float64(res.Queued + res.Refused + res.Expired)
				ts = append(ts, Target{Name: at + ": nothing queued, refused or expired", Value: held, Met: held == 0})
				ts = append(ts, within(at+": TTFT p50 within 5% of kv-aware's", res.TTFT.P50, kv.TTFT.P50, 0.05))
				ts = append(ts, within(at+": TTFT p90 within 5% of kv-aware's", res.TTFT.P90, kv.TTFT.P90, 0.05))
			}
		}
	}
	return ts
}

// atLeast is the target value >= factor x ref.
func atLeast(name string, value, ref, factor float64) Target {
	t := Target{Name: name, Value: value, Bound: factor * ref, Met: value >= factor*ref}
	if ref != 0 {
		t.Ratio = value / ref
	}
	return t
}

// within is the target value <= (1+tolerance) x ref.
func within(name string, value, ref, tolerance float64) Target {
	t := Target{Name: name, Value: value, Bound: (1 + tolerance) * ref, Met: value <= (1+tolerance)*ref}
	if ref != 0 {
		t.Ratio = value / ref
	}
	return t
}

// overloadColumns are the columns of the overload table and CSV.
var overloadColumns = []struct {
	head, csvHead string
	cell          func(*PolicyResult) string
}{
	{"policy", "policy", func(r *PolicyResult) string { return r.Policy }},
	{"goodput", "goodput_per_s", func(r *PolicyResult) string { return strconv.FormatFloat(r.Goodput, 'f', 2, 64) }},
	{"SLO met", "slo_attainment", func(r *PolicyResult) string { return ratio(r.SLOAttainment) }},
	{"TTFT p50", "ttft_p50_s", func(r *PolicyResult) string { return seconds(r.TTFT.P50) }},
	{"TTFT p90", "ttft_p90_s", func(r *PolicyResult) string { return seconds(r.TTFT.P90) }},
	{"TTFT p99", "ttft_p99_s", func(r *PolicyResult) string { return seconds(r.TTFT.P99) }},
	{"served", "served", func(r *PolicyResult) string { return strconv.Itoa(r.Requests - r.Refused - r.Expired - r.Rejected) }},
	{"queued", "queued", func(r *PolicyResult) string { return strconv.Itoa(r.Queued) }},
	{"wait p90", "wait_p90_s", func(r *PolicyResult) string { return seconds(r.Wait.P90) }},
	{"refused", "refused", func(r *PolicyResult) string { return strconv.Itoa(r.Refused) }},
	{"expired", "expired", func(r *PolicyResult) string { return strconv.Itoa(r.Expired) }},
	{"hit ratio", "hit_ratio", func(r *PolicyResult) string { return ratio(r.HitRatio) }},
}

// WriteTable writes the report as text: the setup, one table per load
// (latencies in seconds, TTFT of the requests served), and the targets.
func (r *OverloadReport) WriteTable(w io.Writer) error {
	s, st := r.Setup, r.Stats
	how := "given"
	if r.CapacityMeasured {
		how = fmt.Sprintf("the highest rate at which kv-aware serves %.0f%% within the SLO", 100*CapacityAttainment)
	}
	fmt.Fprintf(w, "overload %s: %d requests at %.2f/s; fleet capacity %.2f requests/s (%s); SLO %s; %d engines; seed %d\n",
		r.Workload, st.Requests, r.NativeRate, r.Capacity, how, r.SLO, s.Engines, s.Seed)
	for _, l := range r.Levels {
		fmt.Fprintf(w, "load %gx: %.2f requests/s (arrivals %.2fx as fast as the workload's)\n", l.Load, l.Rate, l.Speedup)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		for i, c := range overloadColumns {
			fmt.Fprint(tw, c.head, sep(i, len(overloadColumns)))
		}
		for _, res := range l.Results {
			for i, c := range overloadColumns {
				fmt.Fprint(tw, c.cell(res), sep(i, len(overloadColumns)))
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "the most goodput seen: %.2f requests/s\n", r.MaxGoodput())
	writeTargets(w, r.Targets(), 72)
	return nil
}

// WriteCSV writes one row per load and policy after a header row.
func (r *OverloadReport) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	row := make([]string, len(overloadColumns)+3)
	row[0], row[1], row[2] = "workload", "load", "requests_per_s"
	for i, c := range overloadColumns {
		row[i+3] = c.csvHead
	}
	if err := cw.Write(row); err != nil {
		return err
	}
	for _, l := range r.Levels {
		for _, res := range l.Results {
			row[0], row[1], row[2] = r.Workload, strconv.FormatFloat(l.Load, 'g', -1, 64), strconv.FormatFloat(l.Rate, 'f', 3, 64)
			for i, c := range overloadColumns {
				row[i+3] = c.cell(res)
			}
			if err := cw.Write(row); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteJSON writes the report, its most goodput and targets included, as
// indented JSON.
func (r *OverloadReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		*OverloadReport
		MaxGoodput float64  `json:"maxGoodput"`
		Targets    []Target `json:"targets"`
	}{r, r.MaxGoodput(), r.Targets()})
}
