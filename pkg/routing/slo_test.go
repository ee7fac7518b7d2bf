package routing

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/types"
)

// sloRequest returns a request for tokens with algorithm and objective,
// arrived at the clock's now.
func sloRequest(id, algorithm string, tokens []uint32, slo types.SLO, now time.Time) *types.RoutingContext {
	rc := request(id, algorithm, tokens)
	rc.SLO, rc.ReceivedAt = slo, now
	return rc
}

// routeErr routes rc and returns the decision and Route's error.
func routeErr(r *Router, rc *types.RoutingContext, pods []*endpoint.Endpoint) (*Decision, error) {
	var d Decision
	err := r.Route(context.Background(), rc, snaps(r, pods), &d)
	return &d, err
}

func TestSLOLeastLoadChoosesAsKVAwareWhileEveryPodMeetsTheSLO(t *testing.T) {
	for _, alg := range []string{SLO, SLOLeastLoad, SLOLeastLoadPulling} {
		clock := newManualClock()
		pods := testPods(4)
		idx := newTestIndex(t)
		p := prompt(0, 2048)
		holds(t, idx, "p2", p[:1536], kvevent.MediumGPU)
		m := uniformFleet(4).set("p2", cache.NumRequestsWaiting, 1).scraped(clock.Now())
		kv, _ := newTestRouter(t, m, idx, func(c *Config) { c.Now = clock.Now })
		sr, _ := newTestRouter(t, m, idx, func(c *Config) { c.Now = clock.Now })
		for _, slo := range []types.SLO{{}, {TTFT: 5 * time.Second}} {
			want := route(t, kv, request("r", KVAware, p), pods)
			got := route(t, sr, sloRequest("r", alg, p, slo, clock.Now()), pods)
			if got.PodKey != want.PodKey || got.Outcome != want.Outcome {
				t.Errorf("%s with SLO %v chose %s (%s), kv-aware %s (%s)", alg, slo, got.PodKey, got.Outcome, want.PodKey, want.Outcome)
			}
			if c := got.Chosen(); !slo.IsZero() && (c.SLOVerdict != SLOMeets || c.SLOBudget <= 0 || c.SLOBudget > 1) {
				t.Errorf("%s: chosen %+v, want a pod that meets the SLO with its budget in (0, 1]", alg, c)
			}
		}
	}
}

func TestSLOLeastLoadTakesKVAwaresChoiceWhenItMeetsTheSLO(t *testing.T) {
	// Every pod holds the whole prompt, so that a pod's cost is its queue
	// and its inter-token latency. p0 costs least but misses the 250 ms
	// inter-token objective; p1 costs within kv-aware's 5% of p0 and runs
	// fewer requests, so kv-aware chooses it, and it meets the objective;
	// p2 costs more than 5% over p0 but within 5% of p1, and runs the
	// fewest. Choosing among the pods that meet alone would take p2.
	for _, alg := range []string{SLO, SLOLeastLoad, SLOLeastLoadPulling} {
		clock := newManualClock()
		pods := testPods(3)
		idx := newTestIndex(t)
		p := prompt(0, 2048)
		for _, pod := range pods {
			holds(t, idx, pod.Key.Name, p, kvevent.MediumGPU)
		}
		m := uniformFleet(3).set("p0", cache.AvgTPOTSeconds, 0.3).
			set("p1", cache.AvgTPOTSeconds, 0.105).set("p1", cache.NumRequestsWaiting, 1).
			set("p2", cache.AvgTPOTSeconds, 0.115).set("p2", cache.NumRequestsWaiting, 1).scraped(clock.Now())
		r, _ := newTestRouter(t, m, idx, func(c *Config) { c.Now = clock.Now })
		for i, running := range []int{3, 2, 1} {
			for j := range running {
				d := route(t, r, request("busy", KVAware, prompt(100_000*(3*i+j+1), 2048)), pods)
				d.chosen, d.Endpoint = i, pods[i]
				startPrefill(r, d).FirstToken()
			}
		}
		kv := route(t, r, request("r", KVAware, p), pods)
		c0, c1, c2 := candidate(t, kv, "p0"), candidate(t, kv, "p1"), candidate(t, kv, "p2")
		if !(c0.Score < c1.Score && c1.Score <= 1.05*c0.Score && 1.05*c0.Score < c2.Score && c2.Score <= 1.05*c1.Score) ||
			kv.PodKey != key("p1") {
			t.Fatalf("kv-aware chose %s with costs %.4f, %.4f, %.4f; want p1, the set-up this test needs", kv.PodKey,
				c0.Score, c1.Score, c2.Score)
		}
		d := route(t, r, sloRequest("r", alg, p, types.SLO{TTFT: 10 * time.Second, TPOT: 250 * time.Millisecond}, clock.Now()), pods)
		if d.PodKey != kv.PodKey || candidate(t, d, "p0").SLOVerdict != SLOMisses {
			t.Errorf("%s chose %s, p0 %s; want kv-aware's choice %s, p0 missing the objective", alg, d.PodKey,
				candidate(t, d, "p0").SLOVerdict, kv.PodKey)
		}
	}
}

func TestSLOAlgorithmsChooseNoPodWhenNoneMeetsTheSLONow(t *testing.T) {
	// Every pod has 20 requests of 2,048 tokens waiting, 4.1 s of prefill.
	// Idle, a pod would return the first token of the 2,048-token prompt
	// in 0.2248 s (0.2048 of prefill and a 0.02 s step): with 1 s to the
	// first token the request could wait 0.775 s for a queue to drain.
	clock := newManualClock()
	pods := testPods(2)
	m := uniformFleet(2).set("p0", cache.NumRequestsWaiting, 20).set("p1", cache.NumRequestsWaiting, 20).scraped(clock.Now())
	r, reg := newTestRouter(t, m, newTestIndex(t), func(c *Config) { c.Now = clock.Now })
	p := prompt(0, 2048)

	for _, alg := range []string{SLOLeastLoadPulling, SLOPackLoad, SLOLeastLoad} {
		d, err := routeErr(r, sloRequest("r", alg, p, types.SLO{TTFT: time.Second}, clock.Now()), pods)
		var se *SLOError
		if !errors.As(err, &se) || !errors.Is(err, cache.ErrLoadCapacityReached) || se.Unmeetable {
			t.Fatalf("%s: Route = %v, want an SLOError wrapping ErrLoadCapacityReached", alg, err)
		}
		if math.Abs(se.Slack.Seconds()-0.7752) > 1e-3 || math.Abs(se.Drain.Seconds()-4.096) > 1e-3 {
			t.Errorf("%s: slack %v, drain %v; want 0.775 s and 4.096 s", alg, se.Slack, se.Drain)
		}
		if d.Chosen() != nil || d.PodKey != "" || d.Outcome != OutcomeSLOWait {
			t.Errorf("%s: decision chose %q (%s), want none and slo_wait", alg, d.PodKey, d.Outcome)
		}
		for _, c := range d.Candidates {
			if c.SLOVerdict != SLOMisses || c.SLOBudget < 4 {
				t.Errorf("%s: candidate %+v, want a miss using over 4 times the budget", alg, c)
			}
		}
	}
	if n := decisions(t, reg, SLOPackLoad, OutcomeSLOWait); n != 1 {
		t.Errorf("slo-pack-load counted %v slo_wait decisions, want 1", n)
	}
}

func TestSLOAlgorithmsTellAnSLONoPodCouldMeet(t *testing.T) {
	clock := newManualClock()
	pods := testPods(2)
	r, _ := newTestRouter(t, uniformFleet(2), newTestIndex(t), func(c *Config) { c.Now = clock.Now })
	p := prompt(0, 2048)
	tests := []struct {
		name   string
		slo    types.SLO
		waited time.Duration
	}{
		{"shorter than an idle prefill", types.SLO{TTFT: 100 * time.Millisecond}, 0},
		{"waited too long already", types.SLO{TTFT: time.Second}, 900 * time.Millisecond},
		{"inter-token latency above the target", types.SLO{TPOT: 10 * time.Millisecond}, 0},
	}
	for _, tt := range tests {
		rc := sloRequest("r", SLO, p, tt.slo, clock.Now().Add(-tt.waited))
		d, err := routeErr(r, rc, pods)
		var se *SLOError
		if !errors.As(err, &se) || !se.Unmeetable || !errors.Is(err, cache.ErrSLOFailureRequest) || d.Outcome != OutcomeSLOUnmeetable {
			t.Errorf("%s: Route = %v (%s), want an unmeetable SLOError", tt.name, err, d.Outcome)
		}
	}
}

func TestSLOPackLoadPacksWhereLeastLoadSpreadsWhileTheQueueIsContended(t *testing.T) {
	// p0 has 3,000 tokens of prefill waiting (0.3 s), p1 nothing: both
	// return the first token of a 1,000-token prompt within 1 s.
	clock := newManualClock()
	pods := testPods(2)
	m := uniformFleet(2).set("p0", cache.NumRequestsWaiting, 3).scraped(clock.Now())
	r, _ := newTestRouter(t, m, newTestIndex(t), func(c *Config) { c.Now = clock.Now })
	p := prompt(0, 1000)
	slo := types.SLO{TTFT: time.Second}
	if d := route(t, r, sloRequest("a", SLOLeastLoadPulling, p, slo, clock.Now()), pods); d.PodKey != key("p1") {
		t.Errorf("slo-least-load-pulling chose %s, want the idle p1", d.PodKey)
	}
	if d := route(t, r, sloRequest("b", SLOPackLoad, p, slo, clock.Now()), pods); d.PodKey != key("p1") {
		t.Errorf("slo-pack-load with nothing waiting chose %s, want the idle p1 as least-load", d.PodKey)
	}
	contended := func(id string) *types.RoutingContext {
		rc := sloRequest(id, SLOPackLoad, p, slo, clock.Now())
		rc.SLOContended = true
		return rc
	}
	d := route(t, r, contended("c"), pods)
	if d.PodKey != key("p0") {
		t.Errorf("slo-pack-load chose %s, want the busier p0 that still meets the SLO", d.PodKey)
	}
	// With 12,000 tokens waiting p0 misses: pack-load takes p1.
	m.set("p0", cache.NumRequestsWaiting, 12)
	if d := route(t, r, contended("d"), pods); d.PodKey != key("p1") {
		t.Errorf("slo-pack-load chose %s with p0 past the SLO, want p1", d.PodKey)
	}
}

func TestSLOAlgorithmsKeepEngineQueuesShortWhileTheQueueIsContended(t *testing.T) {
	// p0 has 1.5 s of prefill queued, p1 2.4 s (requests of the prompt's
	// 3,000 tokens waiting); the objective allows 2 s plus 4 ms a prompt
	// token, 14 s for this prompt: both pods meet it. The prompt's own
	// prefill, 0.3 s, is more than a tenth of the base 2 s.
	clock := newManualClock()
	pods := testPods(2)
	m := uniformFleet(2).set("p0", cache.NumRequestsWaiting, 5).set("p1", cache.NumRequestsWaiting, 8).scraped(clock.Now())
	r, _ := newTestRouter(t, m, newTestIndex(t), func(c *Config) { c.Now = clock.Now })
	slo := types.SLO{TTFT: 2 * time.Second, TTFTPerPromptToken: 4 * time.Millisecond}
	rc := sloRequest("r", SLOPackLoad, prompt(0, 3000), slo, clock.Now())
	if d := route(t, r, rc, pods); d.PodKey != key("p0") {
		t.Fatalf("uncontended: chose %s, want p0", d.PodKey)
	}
	rc.SLOContended = true
	d := route(t, r, rc, pods)
	if d.PodKey != key("p0") || candidate(t, d, "p1").SLOVerdict != SLOFull {
		t.Fatalf("contended: chose %s, p1 %+v; want p0, p1 full with more than the base 2 s queued", d.PodKey, candidate(t, d, "p1"))
	}
	m.set("p0", cache.NumRequestsWaiting, 7)
	if _, err := routeErr(r, rc, pods); !errors.Is(err, cache.ErrLoadCapacityReached) {
		t.Fatalf("contended with both queues past 2 s: Route = %v, want ErrLoadCapacityReached", err)
	}
}

func TestSLOAlgorithmsLetCacheHitsOnWhileTheQueueIsContended(t *testing.T) {
	// Both pods have more than the base 2 s of prefill queued: 2.4 s on p0,
	// 2.7 s on p1 (requests of the prompts' 3,000 tokens waiting), within
	// the 14 s the objective allows these prompts. p0 holds the first
	// prompt: its prefill there is a block's, less than a tenth of the
	// base, and adds next to nothing to what waits behind it.
	for _, alg := range []string{SLOLeastLoad, SLOLeastLoadPulling, SLOPackLoad} {
		clock := newManualClock()
		pods := testPods(2)
		idx := newTestIndex(t)
		hit, cold := prompt(0, 3000), prompt(100_000, 3000)
		holds(t, idx, "p0", hit, kvevent.MediumGPU)
		m := uniformFleet(2).set("p0", cache.NumRequestsWaiting, 8).set("p1", cache.NumRequestsWaiting, 9).scraped(clock.Now())
		r, _ := newTestRouter(t, m, idx, func(c *Config) { c.Now = clock.Now })
		slo := types.SLO{TTFT: 2 * time.Second, TTFTPerPromptToken: 4 * time.Millisecond}
		contended := func(id string, p []uint32) *types.RoutingContext {
			rc := sloRequest(id, alg, p, slo, clock.Now())
			rc.SLOContended = true
			return rc
		}
		d, err := routeErr(r, contended("cold", cold), pods)
		if !errors.Is(err, cache.ErrLoadCapacityReached) {
			t.Fatalf("%s: a prompt no pod holds: Route = %v (%s), want ErrLoadCapacityReached", alg, err, d.PodKey)
		}
		d = route(t, r, contended("hit", hit), pods)
		if d.PodKey != key("p0") || candidate(t, d, "p0").SLOVerdict != SLOMeets || candidate(t, d, "p1").SLOVerdict != SLOFull {
			t.Errorf("%s: the prompt p0 holds went to %s (p0 %s, p1 %s); want p0, which meets, p1 full", alg, d.PodKey,
				candidate(t, d, "p0").SLOVerdict, candidate(t, d, "p1").SLOVerdict)
		}
	}
}

// profiles is a ProfileSource of fixed profiles by deployment.
type profiles map[string]*cache.ModelGPUProfile

func (p profiles) Lookup(model, deployment string) *cache.ModelGPUProfile {
	if model != testModel {
		return nil
	}
	return p[deployment]
}

// profiledPods returns pods p0..p<n-1> of deployment dep.
func profiledPods(n int, dep string) []*endpoint.Endpoint {
	pods := testPods(n)
	for i, ep := range pods {
		pod := ep.Pod.DeepCopy()
		pod.Labels[endpoint.DefaultDeploymentLabel] = dep
		pods[i] = parse(pod)
	}
	return pods
}

// flatProfile returns a profile whose every shape runs at rps requests per
// second with latency e2e and inter-token latency tpot.
func flatProfile(rps, e2e, tpot float64) *cache.ModelGPUProfile {
	one := [][]float64{{rps}}
	return &cache.ModelGPUProfile{Indexes: [][]float64{{1}, {1}}, Tputs: one,
		E2E: [][]float64{{e2e}}, TPOT: [][]float64{{tpot}}}
}

func TestSLOAlgorithmsKeepPodsWithinTheirProfiledCapacity(t *testing.T) {
	// Each request takes half of a pod by the profile (2 rps x 1 s): a pod
	// running two is full, whatever its queue says.
	clock := newManualClock()
	pods := profiledPods(2, "a100")
	r, _ := newTestRouter(t, uniformFleet(2), newTestIndex(t), func(c *Config) {
		c.Now, c.Profiles = clock.Now, profiles{"a100": flatProfile(2, 1, 0.01)}
	})
	slo := types.SLO{TTFT: 10 * time.Second}
	p := prompt(0, 100)
	var open []*inflight.Handle
	for i := range 4 {
		d := route(t, r, sloRequest("r", SLO, p, slo, clock.Now()), pods)
		rt := d.Route()
		rt.PendingLoad = 0.5
		l, _ := testLedgers.Load(r)
		open = append(open, l.(*inflight.Ledger).Admit("r", testModel).Route(rt))
		open[i].FirstToken()
	}
	d, err := routeErr(r, sloRequest("r", SLO, p, slo, clock.Now()), pods)
	if !errors.Is(err, cache.ErrLoadCapacityReached) {
		t.Fatalf("with both pods full Route = %v, want ErrLoadCapacityReached", err)
	}
	for _, c := range d.Candidates {
		if c.SLOVerdict != SLOFull || c.PendingLoad != 1 {
			t.Errorf("candidate %+v, want full at a pending load of 1", c)
		}
	}
	open[0].Close(inflight.Done, "")
	if d := route(t, r, sloRequest("r", SLO, p, slo, clock.Now()), pods); d.Chosen().PendingLoad != 0.5 {
		t.Errorf("after a completion chose %+v, want the pod with room", d.Chosen())
	}
}

func TestSLOAlgorithmsReadTheProfiledInterTokenLatency(t *testing.T) {
	clock := newManualClock()
	pods := profiledPods(1, "a100")
	r, _ := newTestRouter(t, uniformFleet(1), newTestIndex(t), func(c *Config) {
		c.Now, c.Profiles = clock.Now, profiles{"a100": flatProfile(100, 1, 0.06)}
	})
	rc := sloRequest("r", SLO, prompt(0, 100), types.SLO{TPOT: 50 * time.Millisecond}, clock.Now())
	if _, err := routeErr(r, rc, pods); !errors.Is(err, cache.ErrSLOFailureRequest) {
		t.Errorf("a profiled inter-token latency of 60 ms against a 50 ms target: Route = %v, want unmeetable", err)
	}
	rc.SLO.TPOT = 80 * time.Millisecond
	rc.PredictedOutputTokens = 101
	d := route(t, r, rc, pods)
	if c := d.Chosen(); !near(c.PredictedTPOTSeconds, 0.06) || !near(c.PredictedE2ESeconds, c.PredictedTTFTSeconds+6) {
		t.Errorf("chosen %+v, want the profile's 60 ms per token and 100 more tokens after the first", c)
	}
}

func TestKVAwareCreditsPrefixesInFlightBeforeTheIndexKnowsThem(t *testing.T) {
	// Nothing is cached yet. The first request goes to some pod; until
	// it closes, the same prompt finds its blocks in flight there.
	pods := testPods(4)
	idx := newTestIndex(t)
	holds(t, idx, "p3", prompt(900_000, 32), kvevent.MediumGPU) // the index knows the model's block size
	r, _ := newTestRouter(t, uniformFleet(4), idx)
	p := prompt(0, 2000)
	first := route(t, r, request("a", KVAware, p), pods)
	h := startPrefill(r, first)

	d := route(t, r, request("b", KVAware, p), pods)
	c := d.Chosen()
	if d.PodKey != first.PodKey || d.Outcome != OutcomePrefixHit || c.InFlightMatchedBlocks != 125 ||
		c.InFlightMatchedTokens != 2000 || c.UncachedTokens != 0 || c.MatchedTokens != 0 {
		t.Fatalf("second request went to %s (%s), %+v; want %s with the 125 blocks in flight there", d.PodKey, d.Outcome, c, first.PodKey)
	}
	h.Close(inflight.Done, "")
	if c := candidate(t, route(t, r, request("c", KVAware, p), pods), first.Endpoint.Key.Name); c.InFlightMatchedBlocks != 0 {
		t.Fatalf("after the first request closed its pod still has %d blocks in flight", c.InFlightMatchedBlocks)
	}
	if n := r.inFlight.len(); n != 0 {
		t.Fatalf("%d blocks remembered with nothing in flight", n)
	}
}

func TestInFlightPrefixesStayWithinTheirBound(t *testing.T) {
	pods := testPods(2)
	idx := newTestIndex(t)
	holds(t, idx, "p1", prompt(900_000, 32), kvevent.MediumGPU)
	r, reg := newTestRouter(t, uniformFleet(2), idx, func(c *Config) { c.MaxInFlightPrefixBlocks = 100 })
	var hs []*inflight.Handle
	for i := range 3 {
		hs = append(hs, startPrefill(r, route(t, r, request("r", KVAware, prompt(10_000*i, 64*16)), pods)))
	}
	if n, dropped := r.inFlight.len(), r.inFlight.dropped.Load(); n != 64 || dropped != 2 {
		t.Fatalf("%d blocks remembered, %d attempts dropped; want 64 and 2", n, dropped)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_routing_inflight_prefix_dropped_total", nil); n != 2 {
		t.Fatalf("kvgate_routing_inflight_prefix_dropped_total = %v, want 2", n)
	}
	for _, h := range hs {
		h.Close(inflight.Done, "")
	}
	if n := r.inFlight.len(); n != 0 {
		t.Fatalf("%d blocks left once every attempt closed (the unrecorded ones must not remove others')", n)
	}
}

func TestExplainShowsTheSLOAlgorithmsEvenWhenNoPodMeets(t *testing.T) {
	clock := newManualClock()
	pods := testPods(2)
	r, _ := newTestRouter(t, uniformFleet(2), newTestIndex(t), func(c *Config) { c.Now = clock.Now })
	rc := sloRequest("r", "", prompt(0, 2048), types.SLO{TTFT: 100 * time.Millisecond}, clock.Now())
	e, err := r.Explain(rc, snaps(r, pods))
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, d := range e.Decisions {
		if IsSLOAware(d.Algorithm) {
			seen++
			if d.PodKey != "" || d.Outcome != OutcomeSLOUnmeetable {
				t.Errorf("%s: %q (%s), want no pod, slo_unmeetable", d.Algorithm, d.PodKey, d.Outcome)
			}
		}
	}
	if seen != 4 {
		t.Fatalf("%d SLO-aware decisions explained, want 4", seen)
	}
}

// decisions returns how many decisions of alg had outcome o.
func decisions(t *testing.T, reg *prometheus.Registry, alg string, o Outcome) float64 {
	t.Helper()
	return testsupport.MetricValue(t, reg, "kvgate_routing_decisions_total", map[string]string{"algorithm": alg, "outcome": string(o)})
}
