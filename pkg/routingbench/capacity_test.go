package routingbench

import (
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/sim"
)

func TestDemandCountsEveryTokensWork(t *testing.T) {
	lat := sim.LatencyModel{StepOverhead: 10 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond,
		AttentionPerContextToken: 1000, DecodePerToken: 500 * time.Microsecond, DecodePerContextToken: 100}
	cfg := Config{Engines: 2, Speeds: []float64{1, 3},
		Engine: sim.EngineConfig{BlockSize: 16, NumGPUBlocks: 101, MaxNumSeqs: 4, MaxNumBatchedTokens: 64, Latency: lat}}
	p := prompt([]int{1, 2}, 8) // 40 tokens
	w := Workload{Name: "two", Requests: []Request{
		{ID: "a", Prompt: p, OutputTokens: 3},
		{ID: "b", Arrival: 10 * time.Second, Prompt: p, OutputTokens: 3},
	}}
	d, err := EstimateDemand(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	// Each computes its 40 prompt tokens (780 earlier tokens attended to),
	// the prefix b shares with a included.
	prefill := 2 * lat.PrefillTime(0, 40)
	// Each decodes 2 tokens, after 40 and 41 tokens of context.
	decode := 2 * (2*lat.DecodePerToken + time.Duration(81*lat.DecodePerContextToken))
	// 84 tokens in steps of 64, or 4 decode tokens in batches of 4 at most:
	// the token budget needs 1.3125 steps.
	overhead := time.Duration(84.0 / 64 * float64(lat.StepOverhead))
	if !closeTo(d.PrefillSeconds, prefill.Seconds()) || !closeTo(d.DecodeSeconds, decode.Seconds()) ||
		!closeTo(d.OverheadSeconds, overhead.Seconds()) {
		t.Errorf("demand %+v, want prefill %v, decode %v, overhead %v", d, prefill, decode, overhead)
	}
	// Two engines of speeds 1 and 3 compute 40 s in the 10 s span.
	if !closeTo(d.CapacitySeconds, 40) || !closeTo(d.Load, (prefill+decode+overhead).Seconds()/40) {
		t.Errorf("capacity %v s and load %v, want 40 s and the demand over it", d.CapacitySeconds, d.Load)
	}
}

func TestAtLoadScalesArrivalsToTheLoadAsked(t *testing.T) {
	cfg := smallFleet()
	w := docsWorkload(200, 8, 1024, 32, 10, 4)
	d, err := EstimateDemand(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	for _, load := range []float64{0.5, 1, 2} {
		scaled, err := AtLoad(cfg, w, load)
		if err != nil {
			t.Fatal(err)
		}
		if scaled.Load != load || scaled.Name != "docs@"+formatLoad(load)+"x" || len(scaled.Requests) != len(w.Requests) {
			t.Fatalf("scaled workload %q at %v with %d requests", scaled.Name, scaled.Load, len(scaled.Requests))
		}
		if got, err := EstimateDemand(cfg, scaled); err != nil || math.Abs(got.Load-load) > 1e-3*load {
			t.Errorf("at %v: the scaled workload's load is %v (%v)", load, got.Load, err)
		}
		stretch := d.Load / load
		for _, i := range []int{0, 57, 199} {
			want := w.Requests[0].Arrival + time.Duration(math.Round(float64(w.Requests[i].Arrival-w.Requests[0].Arrival)*stretch))
			if scaled.Requests[i].Arrival != want || &scaled.Requests[i].Prompt[0] != &w.Requests[i].Prompt[0] {
				t.Errorf("at %v: request %d arrives at %v, want %v, sharing its prompt", load, i, scaled.Requests[i].Arrival, want)
			}
		}
	}
	if _, err := AtLoad(cfg, w, 0); err == nil {
		t.Error("a load of 0 accepted")
	}
	one := Workload{Name: "one", Requests: w.Requests[:1]}
	if _, err := AtLoad(cfg, one, 1); err == nil {
		t.Error("a workload spanning no time scaled")
	}
}

func formatLoad(v float64) string {
	switch v {
	case 0.5:
		return "0.5"
	case 1:
		return "1"
	}
	return "2"
}
