package cache

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/sim/simtest"
)

// simEngine is a simulated vLLM engine serving HTTP on loopback, and the
// pod that stands for it.
type simEngine struct {
	url  string
	port int
}

// startSimEngine runs a simulated vLLM engine with latency model lat until
// the test ends.
func startSimEngine(t *testing.T, lat sim.LatencyModel) simEngine {
	t.Helper()
	e := simtest.Serve(t, simserver.Config{Model: "sim", Ranks: []simserver.Rank{{
		Engine: sim.EngineConfig{BlockSize: 16, NumGPUBlocks: 4096, Latency: lat},
	}}})
	return simEngine{url: e.URL, port: e.Port}
}

// complete sends one completion of prompt, generating outputTokens.
func (e simEngine) complete(t *testing.T, prompt []uint32, outputTokens int) {
	body, _ := json.Marshal(map[string]any{"model": "sim", "prompt": prompt, "max_tokens": outputTokens})
	resp, err := http.Post(e.url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("completion: HTTP %s", resp.Status)
	}
}

// randomTokens returns n token ids drawn from rng.
func randomTokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = sim.FirstPieceID + uint32(rng.IntN(int(sim.VocabSize-sim.FirstPieceID)))
	}
	return out
}

// TestPrefillSpeedOfSimulatedEnginesIsTheirTrueSpeed scrapes simulated vLLM
// engines that compute 10,000 prompt tokens per second, in steps of 10 ms
// plus 0.2 ms per decoding request, under requests arriving at random that
// keep them moderately busy, and checks the Store's PrefillTokensPerSecond
// within 20% of the truth both on cold prompts and on prompts that are
// mostly cache hits. Their tokens over their whole prefill times read about
// 7,600 and 6,000 tokens per second.
func TestPrefillSpeedOfSimulatedEnginesIsTheirTrueSpeed(t *testing.T) {
	if testing.Short() {
		t.Skip("runs simulated engines in real time for seconds")
	}
	if raceEnabled {
		// An engine slowed by the race detector, on a loaded machine,
		// misses its modelled step times and really computes slower than
		// the truth the test compares with. make test runs it without.
		t.Skip("the simulated engines must keep real time")
	}
	const (
		truth  = 10000.0
		window = 3 * time.Second
	)
	lat := sim.LatencyModel{StepOverhead: 10 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 200 * time.Microsecond}
	rng := rand.New(rand.NewPCG(1, 1))
	docs := make([][]uint32, 4)
	for i := range docs {
		docs[i] = randomTokens(rng, 1024)
	}
	workloads := []struct {
		name   string
		rate   float64 // requests per second
		prime  [][]uint32
		prompt func() []uint32
	}{
		{"cold prompts of 300 to 700 tokens", 6, nil, func() []uint32 { return randomTokens(rng, 300+rng.IntN(400)) }},
		{"cached documents of 1,024 tokens and questions of 200 to 400", 8, docs, func() []uint32 {
			d := docs[rng.IntN(len(docs))]
			return append(append([]uint32(nil), d...), randomTokens(rng, 200+rng.IntN(200))...)
		}},
	}
	for _, w := range workloads {
		t.Run(w.name, func(t *testing.T) {
			e := startSimEngine(t, lat)
			s := newTestStore(t, Config{PodMetricRefreshInterval: 20 * time.Millisecond, RecentMetricsWindow: window, PrefillSpeedWindow: window})
			s.AddOrUpdatePod(testPod("ns", "sim-0", "sim", "127.0.0.1", withPort(e.port)))
			for _, p := range w.prime {
				e.complete(t, p, 1)
			}
			// Requests arrive at random for longer than the window, so that
			// the estimate covers only them and not the priming.
			until := time.Now().Add(window + time.Second)
			var wg sync.WaitGroup
			requests := 0
			for next := time.Now(); next.Before(until); next = next.Add(time.Duration(rng.ExpFloat64() / w.rate * float64(time.Second))) {
				time.Sleep(time.Until(next)) // paces the arrivals
				p, out := w.prompt(), 4+rng.IntN(29)
				requests++
				wg.Go(func() { e.complete(t, p, out) })
			}
			wg.Wait()
			end := time.Now()
			var got MetricValue
			testsupport.EventuallyWhy(t, "a prefill speed measured after the run", func() (string, bool) {
				var err error
				got, err = s.GetMetricValueByPod(pkey("ns", "sim-0"), PrefillTokensPerSecond)
				return describe(got, err), err == nil && got.UpdatedAt.After(end)
			})
			t.Logf("%d requests: %.0f tokens/s measured, %.0f true", requests, got.Value, truth)
			if got.Value < 0.8*truth || got.Value > 1.2*truth {
				t.Errorf("PrefillTokensPerSecond = %.0f, want within 20%% of %.0f", got.Value, truth)
			}
		})
	}
}
