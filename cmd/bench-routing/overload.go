package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/kvgate/kvgate/pkg/routingbench"
	"github.com/kvgate/kvgate/pkg/types"
)

// runOverload runs the overload scenario on each workload and seed, prints
// each report and a summary of the targets met, and writes the reports.
func (o options) runOverload(ctx context.Context, sources []routingbench.WorkloadSource, stdout, stderr io.Writer) error {
	seeds := o.seeds
	type tally struct{ met, all int }
	summary := map[string]*tally{}
	var order []string
	for _, src := range sources {
		name := src.Name
		text := o.slo
		if text == "" {
			text = overloadSLOs[name]
		}
		objective, err := types.ParseSLO(text)
		if err != nil {
			return fmt.Errorf("-slo: %w", err)
		}
		for _, seed := range seeds {
			o.bench.Seed = seed
			w, err := src.Make(seed)
			if err != nil {
				return err
			}
			cfg := routingbench.OverloadConfig{Config: o.bench, Loads: o.loads, Capacity: o.capacity}
			cfg.SLO = objective
			start := time.Now()
			rep, err := routingbench.RunOverload(ctx, cfg, w.Head(o.requests))
			if err != nil {
				return fmt.Errorf("%s, seed %d: %w", name, seed, err)
			}
			fmt.Fprintf(stderr, "%s, seed %d: overload scenario simulated in %v\n", name, seed, time.Since(start).Round(time.Millisecond))
			if err := rep.WriteTable(stdout); err != nil {
				return err
			}
			fmt.Fprintln(stdout)
			base := filepath.Join(o.out, fmt.Sprintf("overload-%s-seed%d", name, seed))
			for _, f := range []struct {
				ext   string
				write func(io.Writer) error
			}{{".txt", rep.WriteTable}, {".csv", rep.WriteCSV}, {".json", rep.WriteJSON}} {
				if err := writeFile(base+f.ext, f.write); err != nil {
					return fmt.Errorf("write %s%s: %w", base, f.ext, err)
				}
			}
			for _, t := range rep.Targets() {
				key := name + ": " + t.Name
				if summary[key] == nil {
					summary[key] = &tally{}
					order = append(order, key)
				}
				summary[key].all++
				if t.Met {
					summary[key].met++
				}
			}
		}
	}
	fmt.Fprintf(stdout, "targets met, over %d seeds:\n", len(seeds))
	for _, key := range order {
		fmt.Fprintf(stdout, "  %d/%d  %s\n", summary[key].met, summary[key].all, key)
	}
	fmt.Fprintf(stderr, "reports written to %s\n", o.out)
	return nil
}
