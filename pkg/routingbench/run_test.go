package routingbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/sim"
)

// linearLatency is a latency model linear in tokens, cached tokens free at
// any length, whose predictions a test can work out by hand.
var linearLatency = sim.LatencyModel{
	StepOverhead:    10 * time.Millisecond,
	PrefillPerToken: 100 * time.Microsecond,
	DecodePerToken:  500 * time.Microsecond,
}

// smallFleet is 4 identical engines of 512 blocks (8,192 tokens) each,
// with a latency model linear in tokens.
func smallFleet() Config {
	return Config{
		Engines: 4,
		Engine: sim.EngineConfig{
			BlockSize: 16, NumGPUBlocks: 512, MaxNumBatchedTokens: 1024, Latency: linearLatency,
		},
		Seed: 1,
	}
}

// docsWorkload asks questions about documents: each request is one of docs
// documents of docTokens tokens (drawn uniformly) and a question of its
// own, arriving as a Poisson process of rate requests per second.
func docsWorkload(requests, docs, docTokens, questionTokens int, rate float64, seed uint64) Workload {
	rng := rand.New(rand.NewPCG(seed, 1))
	tokens := func(n int) []uint32 { return sim.RandomPieces(rng, n) }
	texts := make([][]uint32, docs)
	for i := range texts {
		texts[i] = tokens(docTokens)
	}
	w := Workload{Name: "docs"}
	at := time.Duration(0)
	for i := range requests {
		at += exponential(rng, time.Duration(float64(time.Second)/rate))
		prompt := append(append([]uint32(nil), texts[rng.IntN(docs)]...), tokens(questionTokens)...)
		w.Requests = append(w.Requests, Request{ID: fmt.Sprint("q", i), Arrival: at, Prompt: prompt, OutputTokens: 8})
	}
	return w
}

func TestRunIsDeterministicWhateverItsParallelism(t *testing.T) {
	w := docsWorkload(300, 16, 2048, 64, 15, 5)
	render := func(parallel int) []byte {
		cfg := smallFleet()
		cfg.Parallel = parallel
		rep, err := Run(context.Background(), cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		for _, write := range []func(*bytes.Buffer) error{
			func(b *bytes.Buffer) error { return rep.WriteJSON(b) },
			func(b *bytes.Buffer) error { return rep.WriteCSV(b) },
			func(b *bytes.Buffer) error { return rep.WriteTable(b) },
		} {
			if err := write(&b); err != nil {
				t.Fatal(err)
			}
		}
		return b.Bytes()
	}
	first := render(1)
	for _, parallel := range []int{1, len(Policies())} {
		if again := render(parallel); !bytes.Equal(first, again) {
			t.Fatalf("a second run with parallelism %d reported differently:\n%s\nthen:\n%s", parallel, first, again)
		}
	}
}

func TestPrefixAwarePoliciesWinWhenEveryEngineCannotHoldEveryDocument(t *testing.T) {
	// 16 documents of 2,048 tokens: 32,768 tokens, four times what one
	// engine holds and exactly what the fleet holds. Spreading requests
	// by load makes every engine cycle through every document; routing by
	// prefix keeps each document on the engines holding it.
	w := docsWorkload(600, 16, 2048, 64, 15, 3)
	rep, err := Run(context.Background(), smallFleet(), w)
	if err != nil {
		t.Fatal(err)
	}
	logTable(t, rep)
	res := func(p string) *PolicyResult { return rep.Result(p) }
	for _, aware := range []string{routing.PrefixCache, routing.KVAware, TTFTOracle} {
		for _, blind := range []string{routing.Random, routing.LeastRequest} {
			if a, b := res(aware).HitRatio, res(blind).HitRatio; a < 1.5*b {
				t.Errorf("%s's hit ratio %.3f is not well above %s's %.3f", aware, a, blind, b)
			}
		}
	}
	if kv, lr := res(routing.KVAware).TTFT.P90, res(routing.LeastRequest).TTFT.P90; kv >= lr {
		t.Errorf("kv-aware's p90 TTFT %.3f s is not below least-request's %.3f s", kv, lr)
	}
	for _, r := range rep.Results {
		if r.Completed != len(w.Requests) || r.Rejected != 0 {
			t.Errorf("%s completed %d and rejected %d of %d requests", r.Policy, r.Completed, r.Rejected, len(w.Requests))
		}
	}
}

// logTable logs the report's table.
func logTable(t *testing.T, rep *Report) {
	t.Helper()
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
}

func TestRunCountsRequestsTooLongForTheEngines(t *testing.T) {
	w := docsWorkload(20, 2, 256, 16, 10, 1)
	w.Requests[5].Prompt = make([]uint32, 9000) // more than 511 blocks of 16
	for i := range w.Requests[5].Prompt {
		w.Requests[5].Prompt[i] = sim.FirstPieceID
	}
	cfg := smallFleet()
	cfg.Policies = []string{routing.KVAware, TTFTOracle}
	rep, err := Run(context.Background(), cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Rejected != 1 || r.Completed != 19 {
			t.Errorf("%s rejected %d and completed %d, want 1 and 19", r.Policy, r.Rejected, r.Completed)
		}
	}
}

func TestRunRejectsBadConfigsAndWorkloads(t *testing.T) {
	good := docsWorkload(3, 1, 32, 4, 10, 1)
	tests := []struct {
		name string
		cfg  func(*Config)
		w    func(*Workload)
		want string
	}{
		{"unknown policy", func(c *Config) { c.Policies = []string{"fastest"} }, nil, `unknown policy "fastest"`},
		{"policy twice", func(c *Config) { c.Policies = []string{TTFTOracle, TTFTOracle} }, nil, "named twice"},
		{"negative engines", func(c *Config) { c.Engines = -1 }, nil, "-1 engines"},
		{"negative delay", func(c *Config) { c.Events.Delay = -time.Millisecond }, nil, "must not be negative"},
		{"engine too small", func(c *Config) { c.Engine.NumGPUBlocks = 1 }, nil, "engine"},
		{"empty workload", nil, func(w *Workload) { w.Requests = nil }, "no requests"},
		{"out of order", nil, func(w *Workload) { w.Requests[2].Arrival = 0 }, "before the request before it"},
		{"duplicate id", nil, func(w *Workload) { w.Requests[1].ID = w.Requests[0].ID }, "duplicate id"},
		{"no output", nil, func(w *Workload) { w.Requests[0].OutputTokens = 0 }, "output tokens"},
		{"bad token", nil, func(w *Workload) { w.Requests[0].Prompt = []uint32{sim.VocabSize} }, "outside the vocabulary"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := smallFleet()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			w := good
			w.Requests = append([]Request(nil), good.Requests...)
			if tt.w != nil {
				tt.w(&w)
			}
			if _, err := Run(context.Background(), cfg, w); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one about %q", err, tt.want)
			}
		})
	}
}

func TestRunStopsWhenTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(ctx, smallFleet(), docsWorkload(50, 2, 256, 16, 10, 1))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
}

// BenchmarkSimulate plays 300 requests on documents of 2,048 tokens on 4
// engines under kv-aware and under the oracle: the cost of the simulation
// per policy and request.
func BenchmarkSimulate(b *testing.B) {
	w := docsWorkload(300, 16, 2048, 64, 15, 5)
	for _, policy := range []string{routing.KVAware, TTFTOracle} {
		b.Run(policy, func(b *testing.B) {
			cfg := smallFleet()
			cfg.Policies = []string{policy}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Run(context.Background(), cfg, w); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(w.Requests)), "ns/request")
		})
	}
}
