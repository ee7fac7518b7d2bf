package routing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

func TestResolveNamesTheAlgorithmOfARequest(t *testing.T) {
	r, _ := newTestRouter(t, newFakeMetrics(), nil, func(c *Config) { c.DefaultAlgorithm = "Least-Request" })
	tests := []struct{ header, want string }{
		{"", LeastRequest},
		{"prefix-cache", PrefixCache},
		{" KV-Aware ", KVAware},
		{"least-kv-cache", LeastKVCache},
	}
	for _, tt := range tests {
		if got, err := r.Resolve(tt.header); got != tt.want || err != nil {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tt.header, got, err, tt.want)
		}
	}

	_, err := r.Resolve("throughput")
	var unknown *UnknownAlgorithmError
	if !errors.As(err, &unknown) || unknown.Name != "throughput" || !errors.Is(err, ErrUnknownAlgorithm) {
		t.Fatalf("Resolve(throughput) = %v, want an *UnknownAlgorithmError wrapping ErrUnknownAlgorithm", err)
	}
	if !strings.Contains(err.Error(), "kv-aware") {
		t.Fatalf("error %q does not list the known algorithms", err)
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown default", Config{DefaultAlgorithm: "round-robin"}, `"round-robin"`},
		{"CPU weight above 1", Config{CPUCacheWeight: 1.5}, "CPUCacheWeight"},
		{"negative imbalance count", Config{ImbalanceAbsCount: -1}, "ImbalanceAbsCount"},
		{"negative prefill speed", Config{DefaultPrefillTokensPerSecond: -1}, "DefaultPrefillTokensPerSecond"},
		{"fleet queue floor not a number", Config{MinFleetQueue: math.NaN()}, "MinFleetQueue"},
		{"stddev factor not a number", Config{StdDevFactor: math.NaN()}, "StdDevFactor"},
		{"infinite stddev factor", Config{StdDevFactor: math.Inf(1)}, "StdDevFactor"},
		{"CPU weight not a number", Config{CPUCacheWeight: math.NaN()}, "CPUCacheWeight"},
		{"prefill speed not a number", Config{DefaultPrefillTokensPerSecond: math.NaN()}, "DefaultPrefillTokensPerSecond"},
		{"infinite prefill speed", Config{DefaultPrefillTokensPerSecond: math.Inf(1)}, "DefaultPrefillTokensPerSecond"},
		{"prefill speed below a token a second", Config{DefaultPrefillTokensPerSecond: 0.5}, "DefaultPrefillTokensPerSecond"},
		{"subnormal prefill speed", Config{DefaultPrefillTokensPerSecond: 1e-320}, "DefaultPrefillTokensPerSecond"},
		{"tolerance not a number", Config{TieTolerance: math.NaN()}, "TieTolerance"},
		{"infinite tolerance", Config{TieTolerance: math.Inf(1)}, "TieTolerance"},
	}
	for _, tt := range tests {
		if _, err := New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: New = %v, want an error mentioning %s", tt.name, err, tt.want)
		}
	}
}

func TestRouteFailsWithoutPodsOrForAnUnknownAlgorithm(t *testing.T) {
	r, reg := newTestRouter(t, newFakeMetrics(), nil)
	d := Decision{Candidates: make([]Candidate, 3)}
	if err := r.Route(context.Background(), request("r", KVAware, nil), nil, &d); !errors.Is(err, ErrNoPods) || d.Endpoint != nil || len(d.Candidates) != 0 {
		t.Fatalf("Route with no pods = %v, decision %+v; want ErrNoPods and an empty decision", err, d)
	}
	if err := r.Route(context.Background(), request("r", "bogus", nil), snaps(r, testPods(2)), &d); !errors.Is(err, ErrUnknownAlgorithm) {
		t.Fatalf("Route with an unknown algorithm = %v, want ErrUnknownAlgorithm", err)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_routing_decisions_total", nil); n != 0 {
		t.Fatalf("failed routes counted %v decisions", n)
	}
}

func TestRouteRecordsTheTargetAndCountsTheDecision(t *testing.T) {
	pods := testPods(3)
	idx := newTestIndex(t)
	p := prompt(0, 1000)
	holds(t, idx, "p1", p[:800], kvevent.MediumGPU)
	r, reg := newTestRouter(t, uniformFleet(3), idx)
	ctx := request("r", "", p)

	d := route(t, r, ctx, pods)
	if d.Algorithm != KVAware || d.Endpoint != pods[1] || ctx.TargetPod() != pods[1].Pod || d.Chosen().Pod != key("p1") {
		t.Fatalf("decision %s -> %s, target %v; want kv-aware (the default) -> p1 recorded on the context", d.Algorithm, d.PodKey, ctx.TargetPod())
	}
	if d.BlockSize != testBlockSize || d.PromptBlocks != 1000/testBlockSize || d.PromptTokens != 1000 {
		t.Fatalf("decision blocks %d x %d tokens of %d, want %d x %d of 1000", d.PromptBlocks, d.BlockSize, d.PromptTokens, 1000/testBlockSize, testBlockSize)
	}
	labels := map[string]string{"algorithm": KVAware}
	if n := testsupport.MetricValue(t, reg, "kvgate_routing_decisions_total", map[string]string{"algorithm": KVAware, "outcome": "prefix_hit"}); n != 1 {
		t.Fatalf("decisions_total{kv-aware,prefix_hit} = %v, want 1", n)
	}
	for _, h := range []string{"kvgate_routing_matched_fraction", "kvgate_routing_decision_duration_seconds"} {
		if n := testsupport.MetricValue(t, reg, h, labels); n != 1 {
			t.Fatalf("%s observed %v times, want 1", h, n)
		}
	}
}

func TestLoadAlgorithmsReportTheChosenPodsMatch(t *testing.T) {
	pods := testPods(3)
	idx := newTestIndex(t)
	p := prompt(0, 1000)
	holds(t, idx, "p1", p[:800], kvevent.MediumGPU)
	m := uniformFleet(3).set("p0", cache.RealtimeNumRequestsRunning, 1).set("p2", cache.RealtimeNumRequestsRunning, 1)
	r, _ := newTestRouter(t, m, idx)

	d := route(t, r, request("r", LeastRequest, p), pods)
	if c := d.Chosen(); d.PodKey != key("p1") || c.MatchedTokens != 800 || c.UncachedTokens != 200 {
		t.Fatalf("least-request chose %s with %+v, want p1 with its 800 matched tokens known", d.PodKey, c)
	}
}

func TestPrefixAlgorithmsMatchTheAdapterUnderEachPodsBaseModel(t *testing.T) {
	// p0 serves base model m, q0 base model m2; both load adapter "sql".
	q0 := testPod("q0", "10.0.0.2", 0)
	q0.Labels[endpoint.ModelNameLabel] = "m2"
	pods := []*endpoint.Endpoint{parse(testPod("p0", "10.0.0.1", 0)), parse(q0)}
	idx := newTestIndex(t)
	p := prompt(0, 1024)
	holdsAs(t, idx, indexer.Stream{Pod: key("q0"), Model: "m2"}, "sql", p, kvevent.MediumGPU)
	holdsAs(t, idx, indexer.Stream{Pod: key("p0"), Model: testModel}, "", p, kvevent.MediumGPU)
	r, _ := newTestRouter(t, uniformFleet(1).set("q0", cache.PrefillTokensPerSecond, 10000), idx)

	ctx := request("r", KVAware, p)
	ctx.Model, ctx.LoraAdapter = "sql", "sql"
	d := route(t, r, ctx, pods)
	if d.PodKey != key("q0") || candidate(t, d, "q0").MatchedTokens != 1024 || candidate(t, d, "p0").MatchedTokens != 0 {
		t.Fatalf("adapter request chose %s with %+v; want q0, the only pod holding the adapter's blocks", d.PodKey, d.Candidates)
	}
}

func TestKVAwareDecisionsRepeatWithTheSameSeed(t *testing.T) {
	pods := testPods(8)
	run := func() []string {
		clock := newManualClock()
		r, _ := newTestRouter(t, uniformFleet(8), newTestIndex(t), func(c *Config) { c.Now = clock.Now })
		var got []string
		for i := range 100 {
			d := route(t, r, request("r", KVAware, prompt(i*1000, 1000)), pods)
			startPrefill(r, d)
			clock.Advance(7 * time.Millisecond) // prefills overlap, so queues vary
			got = append(got, d.PodKey)
		}
		return got
	}
	a, b := run(), run()
	spread := map[string]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("decision %d differs: %s vs %s", i, a[i], b[i])
		}
		spread[a[i]] = true
	}
	if len(spread) != len(pods) {
		t.Fatalf("cold prompts went to %d of %d idle pods, want them spread", len(spread), len(pods))
	}
}

func TestRouteDoesNotAllocateWithAReusedDecision(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	pods := testPods(16)
	idx := newTestIndex(t)
	p := prompt(0, 4096)
	m := uniformFleet(16)
	for i, pod := range pods {
		holds(t, idx, pod.Key.Name, p[:256*(i+1)], kvevent.MediumGPU)
		m.set(pod.Key.Name, cache.RealtimeNumRequestsRunning, float64(i%3)).set(pod.Key.Name, cache.NumRequestsWaiting, 0)
	}
	r, _ := newTestRouter(t, m, idx)
	ctx := request("r", KVAware, p)
	var d Decision
	candidates := snaps(r, pods)
	// SetTargetPod stores a new target, the one allocation Route makes.
	for _, alg := range []string{KVAware, PrefixCache, LeastRequest} {
		ctx.Algorithm = alg
		allocs := testing.AllocsPerRun(100, func() {
			if err := r.Route(context.Background(), ctx, candidates, &d); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 1 {
			t.Errorf("%s: Route allocates %v times per decision, want at most 1", alg, allocs)
		}
	}
}

func TestRouterIsSafeForConcurrentUse(t *testing.T) {
	pods := testPods(8)
	idx := newTestIndex(t)
	r, reg := newTestRouter(t, uniformFleet(8), idx)
	algs := Algorithms()
	var wg sync.WaitGroup
	wg.Go(func() { // the KV event stream keeps writing
		for i := range 200 {
			holds(t, idx, fmt.Sprint("p", i%8), prompt(i*64, 512), kvevent.MediumGPU)
		}
	})
	for g := range 6 {
		wg.Go(func() {
			var d Decision
			for i := range 300 {
				ctx := request("r", algs[(g+i)%len(algs)], prompt((i%50)*64, 1024))
				if err := r.Route(context.Background(), ctx, snaps(r, pods), &d); err != nil {
					t.Error(err)
					return
				}
				p := startPrefill(r, &d)
				if i%3 == 0 {
					p.FirstToken()
				}
				p.Close(inflight.Done, "")
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			if _, err := r.Explain(request("x", "", prompt(0, 1024)), snaps(r, pods)); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	if n := testsupport.MetricValue(t, reg, "kvgate_routing_decisions_total", nil); n != 6*300 {
		t.Fatalf("%v decisions counted, want %d", n, 6*300)
	}
	if n := inFlightPrefills(t, reg); n != 0 {
		t.Fatalf("%v prefills left in flight, want 0", n)
	}
}

func TestTheFleetQueueFloorAsOperatorsSetIt(t *testing.T) {
	for _, tt := range []struct{ setting, config, floor float64 }{
		{0, -1, 0},
		{0.25, 0.25, 0.25},
		{2, 2, 2},
	} {
		c := Config{MinFleetQueue: MinFleetQueueSetting(tt.setting)}
		if c.MinFleetQueue != tt.config || c.FleetQueueFloor() != tt.floor {
			t.Errorf("setting %v: MinFleetQueue %v, floor %v; want %v, %v", tt.setting, c.MinFleetQueue, c.FleetQueueFloor(), tt.config, tt.floor)
		}
	}
	if f := (Config{}).FleetQueueFloor(); f != DefaultMinFleetQueue {
		t.Errorf("an unset MinFleetQueue floors at %v, want the default %v", f, DefaultMinFleetQueue)
	}
}
