package routing

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/types"
)

func TestLoadAlgorithmsChooseByTheirMetric(t *testing.T) {
	type metrics map[string]map[string]float64
	tests := []struct {
		name      string
		algorithm string
		metrics   metrics
		output    int
		want      string
	}{
		{
			name: "least-request: fewest requests in flight", algorithm: LeastRequest,
			metrics: metrics{cache.RealtimeNumRequestsRunning: {"p0": 3, "p1": 1, "p2": 2}},
			want:    "p1",
		},
		{
			name: "least-kv-cache: lowest usage", algorithm: LeastKVCache,
			metrics: metrics{cache.KVCacheUsagePerc: {"p0": 0.5, "p1": 0.2, "p2": 0.3}},
			want:    "p1",
		},
		{
			name: "least-kv-cache: an unscraped pod only when no pod is scraped", algorithm: LeastKVCache,
			metrics: metrics{cache.KVCacheUsagePerc: {"p0": 0.5, "p1": 0.9}},
			want:    "p0",
		},
		{
			name: "least-kv-cache: equal usage goes to the fewest requests", algorithm: LeastKVCache,
			metrics: metrics{
				cache.KVCacheUsagePerc:           {"p0": 0.4, "p1": 0.4, "p2": 0.4},
				cache.RealtimeNumRequestsRunning: {"p0": 2, "p1": 3, "p2": 1},
			},
			want: "p2",
		},
		{
			name: "least-latency: TTFT dominates a request without an output prediction", algorithm: LeastLatency,
			metrics: metrics{
				cache.AvgTTFTSeconds: {"p0": 0.1, "p1": 0.3, "p2": 0.4},
				cache.AvgTPOTSeconds: {"p0": 0.05, "p1": 0.01, "p2": 0.01},
			},
			want: "p0",
		},
		{
			name: "least-latency: a long predicted output favours the faster decoder", algorithm: LeastLatency,
			metrics: metrics{
				cache.AvgTTFTSeconds: {"p0": 0.1, "p1": 0.3, "p2": 0.4},
				cache.AvgTPOTSeconds: {"p0": 0.05, "p1": 0.01, "p2": 0.01},
			},
			output: 100,
			want:   "p1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newFakeMetrics()
			for metric, byPod := range tt.metrics {
				for pod, v := range byPod {
					m.set(pod, metric, v)
				}
			}
			r, _ := newTestRouter(t, m, nil)
			ctx := request("r", tt.algorithm, nil)
			ctx.PredictedOutputTokens = tt.output

			d := route(t, r, ctx, testPods(3))
			if d.PodKey != key(tt.want) || d.Outcome != OutcomeLoad {
				t.Fatalf("chose %s (%s), want %s (load); candidates %+v", d.PodKey, d.Outcome, tt.want, d.Candidates)
			}
		})
	}
}

func TestLeastLatencyScoresUnmeasuredPodsAtTheMedian(t *testing.T) {
	m := newFakeMetrics().
		set("p0", cache.AvgTTFTSeconds, 0.1).set("p0", cache.AvgTPOTSeconds, 0.05).
		set("p1", cache.AvgTTFTSeconds, 0.3).set("p1", cache.AvgTPOTSeconds, 0.01)
	r, _ := newTestRouter(t, m, nil)
	ctx := request("r", LeastLatency, nil)
	ctx.PredictedOutputTokens = 100

	d := route(t, r, ctx, testPods(3))
	if got := candidate(t, d, "p2").Score; !near(got, (5.1+1.3)/2) {
		t.Fatalf("unmeasured p2 scored %v, want the median 3.2", got)
	}
}

func TestRandomDrawsEveryPodAndRepeatsWithTheSameSeed(t *testing.T) {
	pods := testPods(4)
	draw := func() []string {
		r, _ := newTestRouter(t, newFakeMetrics(), nil)
		var got []string
		for range 200 {
			got = append(got, route(t, r, request("r", Random, nil), pods).PodKey)
		}
		return got
	}
	a, b := draw(), draw()
	seen := map[string]int{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("draw %d differs between routers with the same seed: %s vs %s", i, a[i], b[i])
		}
		seen[a[i]]++
	}
	for _, p := range pods {
		if n := seen[key(p.Key.Name)]; n < 20 {
			t.Fatalf("%s drawn %d times in 200 (%v), want about 50", p.Key.Name, n, seen)
		}
	}
}

func TestLeastLatencyStopsSendingEverythingToThePodMeasuredFastest(t *testing.T) {
	// p0's means, measured while it was idle, are the lowest; they stay so
	// until its next requests complete. The requests sent to it since count
	// against it, so that a burst spreads over the pods instead of all
	// going to p0.
	m := newFakeMetrics()
	for i, ttft := range []float64{0.10, 0.12, 0.13} {
		m.set(fmt.Sprintf("p%d", i), cache.AvgTTFTSeconds, ttft).set(fmt.Sprintf("p%d", i), cache.AvgTPOTSeconds, 0.02)
	}
	r, _ := newTestRouter(t, m, nil)
	got := routeBurst(t, r, testPods(3), 30, func(int) *types.RoutingContext { return request("r", LeastLatency, nil) })
	for _, p := range []string{"p0", "p1", "p2"} {
		if n := got[key(p)]; n < 7 || n > 13 {
			t.Errorf("%s got %d of 30 requests, want about a third: %v", p, n, got)
		}
	}
	if got[key("p0")] < got[key("p2")] {
		t.Errorf("the pod measured fastest got fewer requests than the slowest: %v", got)
	}
}

// TestLeastLatencyScoresAnIdlePodAtMostTheMedian routes requests while p0
// has nothing in flight and keeps the mean time to first token of the last
// request it served, a prompt a hundred times the others': its mean moves
// only when it serves again, and scored by it p0 would get no request for
// as long as the others' latencies stay below it.
func TestLeastLatencyScoresAnIdlePodAtMostTheMedian(t *testing.T) {
	m := newFakeMetrics()
	for i, ttft := range []float64{100, 1, 1.2} {
		pod := fmt.Sprintf("p%d", i)
		m.set(pod, cache.AvgTTFTSeconds, ttft).set(pod, cache.AvgTPOTSeconds, 0.02)
	}
	r, _ := newTestRouter(t, m, nil)
	got := routeBurst(t, r, testPods(3), 30, func(int) *types.RoutingContext { return request("r", LeastLatency, nil) })
	if got[key("p0")] == 0 {
		t.Errorf("30 requests went %v; want the idle p0 to get one, which measures it again", got)
	}
	if got[key("p0")] > 3 {
		t.Errorf("30 requests went %v; want p0, once busy, scored by its mean again", got)
	}
}

// TestLeastLatencyCountsThePrefillsQueuedOnAPodMeasuredIdle routes a burst
// to a fleet where p2 just joined: its means were measured on the few
// requests it served idle, twenty times below the busy pods', and they
// stay so until the requests sent to it since complete. Scaling them by
// the requests in flight alone leaves p2 the fastest for hundreds of
// requests; the prefill work the gateway has queued on it, which its next
// first tokens wait for, is a floor on its time to first token.
func TestLeastLatencyCountsThePrefillsQueuedOnAPodMeasuredIdle(t *testing.T) {
	m := newFakeMetrics()
	for i, ttft := range []float64{1, 1, 0.05} {
		pod := fmt.Sprintf("p%d", i)
		m.set(pod, cache.AvgTTFTSeconds, ttft).set(pod, cache.PrefillTokensPerSecond, 10_000)
	}
	m.set("p0", cache.RealtimeNumRequestsRunning, 10).set("p1", cache.RealtimeNumRequestsRunning, 10)
	clock := newManualClock()
	r, _ := newTestRouter(t, m, nil, func(c *Config) { c.Now = clock.Now })
	// 1,000-token prompts take 0.1 s each to prefill.
	got := routeBurst(t, r, testPods(3), 40, func(i int) *types.RoutingContext {
		return request(fmt.Sprint(i), LeastLatency, prompt(i*1000, 1000))
	})
	if got[key("p2")] > 25 || got[key("p0")] < 5 || got[key("p1")] < 5 {
		t.Errorf("40 requests went %v; want the busy pods to get some once p2 has a second of prefills queued", got)
	}
}
