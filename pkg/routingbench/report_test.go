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

// sampleReport is a report with made-up numbers.
func sampleReport() *Report {
	res := func(name string, hit, p90 float64) *PolicyResult {
		return &PolicyResult{Policy: name, Requests: 10, Completed: 10, HitRatio: hit,
			TTFT: Latency{P50: p90 / 2, P90: p90, P99: 2 * p90, Mean: p90 / 2}, RequestsCV: 0.1, PrefillCV: 0.2}
	}
	return &Report{
		Workload: "sample",
		Stats:    WorkloadStats{Requests: 10, PromptTokens: 1000},
		Setup:    setupOf(Config{}.withDefaults()),
		Results: []*PolicyResult{
			res(routing.Random, 0.05, 9), res(routing.LeastRequest, 0.10, 8), res(routing.PrefixCache, 0.25, 5),
			res(routing.KVAware, 0.30, 3.9), res(Oracle, 0.33, 3.5),
		},
	}
}

func TestTargetsCompareKVAwareWithTheOracleAndLeastRequest(t *testing.T) {
	ts := sampleReport().Targets()
	want := []struct {
		met   bool
		ratio float64
	}{
		{false, 0.30 / 0.33}, // below 95% of the oracle's hit ratio
		{true, 3},            // three times least-request's
		{true, 3.9 / 8},      // under half its p90
	}
	if len(ts) != len(want) {
		t.Fatalf("%d targets, want %d", len(ts), len(want))
	}
	for i, w := range want {
		if ts[i].Met != w.met || !closeTo(ts[i].Ratio, w.ratio) {
			t.Errorf("target %q: met %v ratio %v, want %v and %v", ts[i].Name, ts[i].Met, ts[i].Ratio, w.met, w.ratio)
		}
	}
	r := sampleReport()
	r.Results = r.Results[3:] // kv-aware and the oracle
	if ts := r.Targets(); len(ts) != 1 {
		t.Errorf("without least-request: %d targets, want the oracle's one", len(ts))
	}
	r = sampleReport()
	r.Result(routing.LeastRequest).HitRatio = 0
	if ts := r.Targets(); !ts[1].Met || ts[1].Ratio != 0 {
		t.Errorf("against a hit ratio of 0: %+v, want met and a ratio of 0 (JSON has no infinity)", ts[1])
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
	for _, want := range []string{"workload sample: 10 requests", "8 engines x 25000 KV blocks", "hit ratio", "oracle", "0.300",
		"target kv-aware hit ratio >= 0.95 x oracle's        MISSED"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}

	var c bytes.Buffer
	if err := r.WriteCSV(&c); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&c).ReadAll()
	if err != nil || len(rows) != 6 || rows[0][0] != "workload" || rows[4][1] != routing.KVAware || rows[4][2] != "0.300" {
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
	if err := json.Unmarshal(j.Bytes(), &back); err != nil || len(back.Results) != 5 || len(back.Targets) != 3 || back.Results[3].HitRatio != 0.3 {
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
