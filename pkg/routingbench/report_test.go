package routingbench

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"image/png"
	"io"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/routing"
)

// sampleReport is a report at the fleet's capacity with made-up numbers.
func sampleReport() *Report {
	res := func(name string, hit, p90, e2e float64, preempted int) *PolicyResult {
		return &PolicyResult{Policy: name, Requests: 10, Completed: 10, HitRatio: hit,
			TTFT: Latency{P50: p90 / 2, P90: p90, P99: 2 * p90, Mean: p90 / 2}, E2E: Latency{P90: e2e},
			Preemptions: preempted, RequestsCV: 0.1, PrefillCV: 0.2, RequestsSpread: 0.1}
	}
	r := &Report{
		Workload: "sample",
		Load:     1,
		Stats:    WorkloadStats{Requests: 10, PromptTokens: 1000},
		Setup:    setupOf(Config{}.withDefaults()),
		Bound:    &PooledBound{Blocks: 1000, HitRatio: 0.35},
		Results: []*PolicyResult{
			res(routing.Random, 0.05, 9, 20, 3), res(routing.LeastRequest, 0.10, 8, 12, 0), res(routing.PrefixCache, 0.25, 5, 15, 4),
			res(routing.KVAware, 0.30, 3.9, 12.5, 5), res(TTFTOracle, 0.33, 3.5, 11, 2),
		},
	}
	for _, res := range r.Results {
		res.HitRatioOfBound = res.HitRatio / r.Bound.HitRatio
	}
	return r
}

func TestTargetsHoldKVAwareToThePooledBoundTheBestOtherPolicyAndTheOracle(t *testing.T) {
	ts := sampleReport().Targets()
	want := []struct {
		name  string
		met   bool
		ratio float64
	}{
		{"kv-aware hit ratio >= 0.9 x pooled bound", false, 0.30 / 0.35}, // 85.7% of the bound
		{"kv-aware p90 TTFT <= best other's (prefix-cache)", true, 3.9 / 5},
		{"kv-aware p90 E2E <= best other's (least-request)", false, 12.5 / 12}, // the oracle does not count
		{"kv-aware preemptions <= 2 x ttft-oracle's", false, 5.0 / 2},
		{"kv-aware requests per engine within 25% of its peers'", true, 0.1 / 0.25},
	}
	if len(ts) != len(want) {
		t.Fatalf("%d targets, want %d: %+v", len(ts), len(want), ts)
	}
	for i, w := range want {
		if ts[i].Name != w.name || ts[i].Met != w.met || !closeTo(ts[i].Ratio, w.ratio) {
			t.Errorf("target %q: met %v ratio %v, want %q met %v ratio %v", ts[i].Name, ts[i].Met, ts[i].Ratio, w.name, w.met, w.ratio)
		}
	}
	r := sampleReport()
	r.Load = 1.5
	if ts := r.Targets(); len(ts) != 4 || strings.Contains(ts[0].Name, "pooled") {
		t.Errorf("beyond capacity: targets %+v, want no hit-ratio target", ts)
	}
	r = sampleReport()
	r.Results = r.Results[3:] // kv-aware and the oracle
	if ts := r.Targets(); len(ts) != 3 {
		t.Errorf("without other policies: %d targets, want the bound's, the oracle's and the spread", len(ts))
	}
	r = sampleReport()
	r.Result(TTFTOracle).Preemptions = 0
	if ts := r.Targets(); ts[3].Met || ts[3].Ratio != 0 {
		t.Errorf("against an oracle without preemptions: %+v, want missed and a ratio of 0 (JSON has no infinity)", ts[3])
	}
	if err := r.WriteJSON(io.Discard); err != nil {
		t.Error(err)
	}
}

func closeTo(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestReportWritesATableCSVJSONAndAPlot(t *testing.T) {
	r := sampleReport()
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"workload sample: 10 requests", ", 1 x the fleet's capacity", "8 engines x 25000 KV blocks",
		"pooled bound: hit ratio 0.350", "hit ratio", "of bound", "ttft-oracle", "0.300", "0.857",
		"target kv-aware hit ratio >= 0.9 x pooled bound", "MISSED: 0.300 against a bound of 0.315"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}

	var c bytes.Buffer
	if err := r.WriteCSV(&c); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&c).ReadAll()
	if err != nil || len(rows) != 6 || rows[0][0] != "workload" || rows[4][1] != routing.KVAware || rows[4][2] != "0.300" ||
		rows[0][3] != "hit_ratio_of_bound" {
		t.Errorf("CSV rows %q (%v), want a header and 5 policies", rows, err)
	}

	var j bytes.Buffer
	if err := r.WriteJSON(&j); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Report
		Targets []Target `json:"targets"`
	}
	if err := json.Unmarshal(j.Bytes(), &back); err != nil || len(back.Results) != 5 || len(back.Targets) != 5 || back.Results[3].HitRatio != 0.3 ||
		back.Bound.HitRatio != 0.35 {
		t.Errorf("JSON read back as %+v (%v)", back, err)
	}

	var p bytes.Buffer
	if err := r.WritePNG(&p); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&p)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 1000 || b.Dy() < 300 {
		t.Errorf("plot of %v, want three panels side by side", b)
	}
}
