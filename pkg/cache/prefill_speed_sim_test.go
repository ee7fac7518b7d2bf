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
func startSimEngine(t testing.TB, lat sim.LatencyModel) simEngine {
	t.Helper()
	e := simtest.Serve(t, simserver.Config{Model: "sim", Ranks: []simserver.Rank{{
		Engine: sim.EngineConfig{BlockSize: 16, NumGPUBlocks: 4096, Latency: lat},
	}}})
	return simEngine{url: e.URL, port: e.Port}
}

// complete sends one completion of prompt, generating outputTokens.
func (e simEngine) complete(t testing.TB, prompt []uint32, outputTokens int) {
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

// BenchmarkPrefillSpeedOfSimulatedEngines scrapes simulated vLLM engines
// that compute 10,000 prompt tokens per second, in steps of 10 ms plus 0.2
// ms per decoding request, under requests arriving at random that keep them
// moderately busy, and reports the Store's PrefillTokensPerSecond over the
// truth ("measured/true"), on cold prompts and on prompts that are mostly
// cache hits. Their tokens over their whole prefill times read about 7,600
// and 6,000 tokens per second, so a ratio near 1 shows the estimate taking
// out the steps the prefills share.
//
// The engines keep real time, which a loaded machine denies them (steps
// overrun their modelled length and the inter-token latency the estimate
// subtracts grows), so this is a benchmark to run on a quiet machine, not a
// test: the estimate's arithmetic is tested in prefill_speed_test.go, and
// routing's virtual-time fleets check it against engines that cannot lag.
func BenchmarkPrefillSpeedOfSimulatedEngines(b *testing.B) {
	const (
		truth  = 10000.0
		window = 3 * time.Second
	)
	lat := sim.LatencyModel{StepOverhead: 10 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 200 * time.Microsecond}
	rng := rand.New(rand.NewPCG(1, 1))
	docs := make([][]uint32, 4)
	for i := range docs {
		docs[i] = sim.RandomPieces(rng, 1024)
	}
	workloads := []struct {
		name   string
		rate   float64 // requests per second
		prime  [][]uint32
		prompt func() []uint32
	}{
		{"cold", 6, nil, func() []uint32 { return sim.RandomPieces(rng, 300+rng.IntN(400)) }},
		{"cached-documents", 8, docs, func() []uint32 {
			d := docs[rng.IntN(len(docs))]
			return append(append([]uint32(nil), d...), sim.RandomPieces(rng, 200+rng.IntN(200))...)
		}},
	}
	for _, w := range workloads {
		b.Run(w.name, func(b *testing.B) {
			var sum float64
			for b.Loop() {
				sum += measurePrefillSpeed(b, lat, window, w.rate, w.prime, w.prompt) / truth
			}
			b.ReportMetric(sum/float64(b.N), "measured/true")
		})
	}
}

// measurePrefillSpeed runs one engine with latency model lat, primes its
// cache with prime, sends requests of prompt at random at rate per second
// for longer than window, and returns the Store's PrefillTokensPerSecond
// measured after the last one.
func measurePrefillSpeed(tb testing.TB, lat sim.LatencyModel, window time.Duration, rate float64, prime [][]uint32, prompt func() []uint32) float64 {
	e := startSimEngine(tb, lat)
	s := newTestStore(tb, Config{PodMetricRefreshInterval: 20 * time.Millisecond, RecentMetricsWindow: window, PrefillSpeedWindow: window})
	s.AddOrUpdatePod(testPod("ns", "sim-0", "sim", "127.0.0.1", withPort(e.port)))
	for _, p := range prime {
		e.complete(tb, p, 1)
	}
	// Requests arrive at random for longer than the window, so that the
	// estimate covers only them and not the priming.
	rng := rand.New(rand.NewPCG(2, 2))
	until := time.Now().Add(window + time.Second)
	var wg sync.WaitGroup
	for next := time.Now(); next.Before(until); next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second))) {
		time.Sleep(time.Until(next)) // paces the arrivals
		p, out := prompt(), 4+rng.IntN(29)
		wg.Go(func() { e.complete(tb, p, out) })
	}
	wg.Wait()
	end := time.Now()
	var got MetricValue
	testsupport.EventuallyWhy(tb, "a prefill speed measured after the run", func() (string, bool) {
		var err error
		got, err = s.GetMetricValueByPod(pkey("ns", "sim-0"), PrefillTokensPerSecond)
		return describe(got, err), err == nil && got.UpdatedAt.After(end)
	})
	return got.Value
}
