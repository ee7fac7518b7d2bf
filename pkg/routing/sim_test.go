package routing

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/sim"
)

// TestKVAwareInVirtualTime plays traces on 8 simulated engines (vLLM's
// scheduler, paged KV cache and KV events; 1,024 blocks of 16 tokens each)
// through the real index, and checks kv-aware against least-request and
// against an oracle: kv-aware's model reading the engines' true caches
// instead of the index. Each engine holds a fraction of the documents; in
// the first trace the fleet as a whole cannot hold them either.
func TestKVAwareInVirtualTime(t *testing.T) {
	traces := map[string]workload{
		"160 docs, mild skew": {
			requests: 2000, docs: 160, docTokens: 1536, questionToken: 64,
			ratePerSecond: 100, zipf: 0.6, seed: 1,
		},
		"32 long docs": {
			requests: 2000, docs: 32, docTokens: 3072, questionToken: 128,
			ratePerSecond: 60, zipf: 0.9, seed: 2,
		},
	}
	for name, w := range traces {
		t.Run(name, func(t *testing.T) {
			trace := w.trace()
			play := func(alg string, truth bool) result {
				f := newSimFleet(t, 8, truth)
				f.run(alg, trace)
				return f.result()
			}
			lr, kv, oracle := play(LeastRequest, false), play(KVAware, false), play(KVAware, true)
			t.Logf("least-request %v; kv-aware %v; oracle %v", lr, kv, oracle)
			if kv.hitRatio < 0.95*oracle.hitRatio {
				t.Errorf("kv-aware's hit ratio %.3f is below 95%% of the oracle's %.3f", kv.hitRatio, oracle.hitRatio)
			}
			if kv.hitRatio < 2*lr.hitRatio {
				t.Errorf("kv-aware's hit ratio %.3f is below twice least-request's %.3f", kv.hitRatio, lr.hitRatio)
			}
			if kv.p90 > 0.5*lr.p90 {
				t.Errorf("kv-aware's p90 TTFT %.3f s exceeds half least-request's %.3f s", kv.p90, lr.p90)
			}
		})
	}
}

// TestKVAwareGivesHalfSpeedPodsProportionallyLessPrefillWork plays traces
// of cold prompts (1,600 tokens each, shared by no other) on 8 simulated
// engines, 2 of which compute prompt tokens at half the speed of the others,
// and checks that kv-aware, believing each engine's measured speed, gives
// the slow engines less prefill work than the fast ones, no more than in
// proportion to their speed. Once the load needs every engine, work goes
// where the queue drains soonest: in proportion to speed. When the fast
// engines could serve the load alone, a prompt still goes to a slow engine
// when the fast ones are decoding: its prefill there takes twice as long
// but holds up no other request's tokens.
func TestKVAwareGivesHalfSpeedPodsProportionallyLessPrefillWork(t *testing.T) {
	tests := []struct {
		name   string
		rate   float64 // requests per second
		lo, hi float64 // bounds of slow / fast prompt tokens computed per engine
	}{
		// The fast engines alone can serve 94 requests per second.
		{"a load the fast engines can serve", 80, 0.1, 0.65},
		// Beyond, every engine queues, and work goes where the queue drains
		// soonest: in proportion to the engines' speed.
		{"a load that needs every engine", 110, 0.35, 0.65},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := workload{requests: 2000, docs: 2000, docTokens: 1536, questionToken: 64, ratePerSecond: tt.rate, seed: 3}
			lats := make([]sim.LatencyModel, 8)
			for i := range lats {
				lats[i] = fleetConfig.Latency
				if i < 2 {
					lats[i].PrefillPerToken *= 2
				}
			}
			f := newSimFleetOf(t, lats, false)
			f.run(KVAware, w.trace())
			var slow, fast float64
			for i, e := range f.engines {
				if i < 2 {
					slow += float64(e.computed) / 2
				} else {
					fast += float64(e.computed) / 6
				}
			}
			t.Logf("prompt tokens computed per engine: %.0f on the slow ones, %.0f on the fast ones (%.2f); %v", slow, fast, slow/fast, f.result())
			if r := slow / fast; r < tt.lo || r > tt.hi {
				t.Errorf("the half-speed engines computed %.2f times the prompt tokens of the others, want %.2f to %.2f", r, tt.lo, tt.hi)
			}
		})
	}
}
