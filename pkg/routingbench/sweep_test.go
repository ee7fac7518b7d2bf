package routingbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/routing"
)

func TestSweepSummarisesEachPointOverItsSeeds(t *testing.T) {
	docs := WorkloadSource{Name: "docs", Make: func(seed uint64) (Workload, error) {
		return docsWorkload(120, 8, 1024, 32, 10, seed), nil
	}}
	cfg := SweepConfig{
		Base:    Config{Engine: smallFleet().Engine, Policies: []string{routing.LeastRequest, routing.KVAware, TTFTOracle}},
		Engines: []int{2, 4},
		Loads:   []float64{0.5, 1},
		Seeds:   []uint64{1, 2},
	}
	var seen []string
	sw, err := RunSweep(context.Background(), cfg, []WorkloadSource{docs}, func(rep *Report) error {
		seen = append(seen, rep.Workload)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 8 || len(sw.Points) != 4 {
		t.Fatalf("%d reports and %d points, want 8 and 4", len(seen), len(sw.Points))
	}
	pt := sw.Points[3]
	if pt.Workload != "docs" || pt.Engines != 4 || pt.Load != 1 || len(pt.Reports) != 2 || pt.Reports[1].Setup.Seed != 2 {
		t.Fatalf("last point %+v, want docs at 1x on 4 engines, seeds 1 and 2", pt)
	}
	kv := pt.Policies[1]
	a, b := pt.Reports[0].Result(routing.KVAware), pt.Reports[1].Result(routing.KVAware)
	if kv.Policy != routing.KVAware || !closeTo(kv.HitRatio.Mean, (a.HitRatio+b.HitRatio)/2) ||
		kv.TTFTP90.Min != min(a.TTFT.P90, b.TTFT.P90) || kv.TTFTP90.Max != max(a.TTFT.P90, b.TTFT.P90) {
		t.Errorf("kv-aware's summary %+v does not match its reports %+v and %+v", kv, a, b)
	}
	if len(pt.Targets) != 5 || pt.Targets[0].Name != "kv-aware hit ratio >= 0.9 x pooled bound" ||
		pt.Targets[1].Name != "kv-aware p90 TTFT <= best other's" {
		t.Errorf("targets %+v, want the five, named apart from the policy they compare with", pt.Targets)
	}
	for _, target := range pt.Targets {
		met := true
		for _, rep := range pt.Reports {
			for _, rt := range rep.Targets() {
				if targetKey(rt.Name) == target.Name {
					met = met && rt.Met
				}
			}
		}
		if target.Met != met {
			t.Errorf("target %q summarised as met %v, the reports say %v", target.Name, target.Met, met)
		}
	}

	var table, md, js bytes.Buffer
	if err := errors.Join(sw.WriteTable(&table), sw.WriteMarkdown(&md), sw.WriteJSON(&js)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"docs at 0.5x the fleet's capacity on 2 engines, seeds 1, 2", "pooled bound: hit ratio", "ttft-oracle"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if !strings.Contains(md.String(), "| policy | hit ratio | of bound |") || !strings.Contains(md.String(), "kv-aware ") {
		t.Errorf("markdown:\n%s", md.String())
	}
	var back Sweep
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Points) != 4 || back.Points[3].Policies[1].Policy != routing.KVAware {
		t.Errorf("JSON read back as %+v (%v)", back, err)
	}
}

func TestSpreadCellsShowTheRangeOnlyWhenSeedsDisagree(t *testing.T) {
	if got := spreadCell(spreadOf([]float64{0.5, 0.5}), 2); got != "0.50" {
		t.Errorf("equal values print %q", got)
	}
	if got := spreadCell(spreadOf([]float64{1, 2, 6}), 1); got != "3.0 [1.0, 6.0]" {
		t.Errorf("spread values print %q", got)
	}
}
