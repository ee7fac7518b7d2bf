package routing

import (
	"testing"
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
