package routing

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

// uniformFleet returns metrics for pods p0..p<n-1> all prefilling 10,000
// tokens per second with a 20 ms inter-token latency.
func uniformFleet(n int) *fakeMetrics {
	f := newFakeMetrics()
	for _, p := range testPods(n) {
		f.set(p.Key.Name, cache.PrefillTokensPerSecond, 10000).set(p.Key.Name, cache.AvgTPOTSeconds, 0.02)
	}
	return f
}

func TestKVAwarePrefersThePodHoldingThePrefixUntilItsQueueIsSlower(t *testing.T) {
	// p2 holds 1,536 of the 2,048 prompt tokens: it saves 0.1536 s of
	// prefill, and half of that again in the fleet's capacity (no pod has
	// a prefill queued: K is its floor of one half), 0.2304 s in all, so
	// it wins until queued work ahead of the request exceeds that. A
	// waiting request counts as the prompt's 2,048 tokens (no prefill has
	// been started yet to learn the mean from), 0.2048 s.
	// Without the floor (MinFleetQueue negative), p2 saves only its own
	// 0.1536 s, less than one waiting request.
	tests := []struct {
		name     string
		waiting  float64
		minQueue float64
		want     string
		outcome  Outcome
	}{
		{"idle holder", 0, 0, "p2", OutcomePrefixHit},
		{"one waiting request costs less than the cache saves", 1, 0, "p2", OutcomePrefixHit},
		{"two waiting requests cost more than the cache saves", 2, 0, "", OutcomeLoadOverPrefix},
		{"without the floor one waiting request costs more", 1, -1, "", OutcomeLoadOverPrefix},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pods := testPods(4)
			idx := newTestIndex(t)
			p := prompt(0, 2048)
			holds(t, idx, "p2", p[:1536], kvevent.MediumGPU)
			m := uniformFleet(4).set("p2", cache.NumRequestsWaiting, tt.waiting)
			r, _ := newTestRouter(t, m, idx, func(c *Config) { c.MinFleetQueue = tt.minQueue })

			d := route(t, r, request("r", KVAware, p), pods)
			if d.Outcome != tt.outcome || (tt.want != "" && d.PodKey != key(tt.want)) || (tt.want == "" && d.PodKey == key("p2")) {
				t.Fatalf("chose %s (%s), want %q (%s); candidates %+v", d.PodKey, d.Outcome, tt.want, tt.outcome, d.Candidates)
			}
			holder := candidate(t, d, "p2")
			wantTTFT := tt.waiting*0.2048 + 512.0/10000 + 0.02
			if holder.UncachedTokens != 512 || holder.MatchedGPUTokens != 1536 || !near(holder.PredictedTTFTSeconds, wantTTFT) {
				t.Fatalf("holder %+v, want 512 uncached, 1536 GPU tokens, TTFT %v", holder, wantTTFT)
			}
		})
	}
}

func TestKVAwareDoesNotCountItsOwnEndedRequestsAsWaiting(t *testing.T) {
	// A cold prompt goes to p1 (p0 is busy), and the engine's queue is
	// scraped while the request waits in it. The request ends before the
	// next scrape, and the same prompt comes again: p1 now holds it, and
	// the scrape's waiting request is the one that ended, not work ahead of
	// the prompt. Counted as a prompt's prefill, it would tie p1 with the
	// idle p0, which holds nothing.
	clock := newManualClock()
	pods := testPods(2)
	idx := newTestIndex(t)
	p := prompt(0, 2048)
	m := uniformFleet(2).set("p0", cache.RealtimeNumRequestsRunning, 1).scraped(clock.Now())
	r, _ := newTestRouter(t, m, idx, func(c *Config) { c.Now = clock.Now })

	d := route(t, r, request("r1", KVAware, p), pods)
	if d.PodKey != key("p1") {
		t.Fatalf("the cold prompt went to %s, want the idle p1", d.PodKey)
	}
	first := startPrefill(r, d)
	clock.Advance(5 * time.Millisecond)
	m.set("p1", cache.NumRequestsWaiting, 1).set("p0", cache.RealtimeNumRequestsRunning, 0).scraped(clock.Now())
	clock.Advance(15 * time.Millisecond)
	holds(t, idx, "p1", p, kvevent.MediumGPU)
	first.Close(inflight.Done, "")

	d = route(t, r, request("r2", KVAware, p), pods)
	c := candidate(t, d, "p1")
	if d.PodKey != key("p1") || d.Outcome != OutcomePrefixHit || c.WaitingEnded != 1 || c.QueueSeconds != 0 {
		t.Fatalf("the repeated prompt went to %s (%s), p1 %+v; want p1 with its ended request not queued", d.PodKey, d.Outcome, c)
	}

	// A request waiting at a later scrape is not one this gateway saw end:
	// it counts.
	clock.Advance(5 * time.Millisecond)
	m.scraped(clock.Now())
	d = route(t, r, request("r3", KVAware, p), pods)
	if c := candidate(t, d, "p1"); c.WaitingEnded != 0 || !near(c.QueueSeconds, 2048.0/10000) {
		t.Fatalf("p1 %+v, want the waiting request queued as a 2,048-token prefill", c)
	}
}

func TestKVAwareWeighsInFlightPrefillsUntilTheirFirstToken(t *testing.T) {
	pods := testPods(4)
	idx := newTestIndex(t)
	shared := prompt(0, 1536)
	holds(t, idx, "p2", shared, kvevent.MediumGPU)
	clock := newManualClock()
	r, _ := newTestRouter(t, uniformFleet(4), idx, func(c *Config) { c.Now = clock.Now })
	// Every request shares the cached 1,536 tokens and has 464 of its own.
	next := 0
	p := func() []uint32 {
		next++
		return append(slices.Clone(shared), prompt(100_000*next, 464)...)
	}

	// Each request sent to p2 queues its 464 uncached tokens (0.0464 s)
	// there: p2 (0.0896 s with half its prefill for the fleet's capacity,
	// plus its queue) stays within the tie tolerance of a cold pod (0.32
	// s) with five prefills queued, not with six.
	var started []*inflight.Handle
	for i := range 6 {
		d := route(t, r, request("r", KVAware, p()), pods)
		if d.PodKey != key("p2") || d.Outcome != OutcomePrefixHit {
			t.Fatalf("request %d went to %s (%s), want p2 with %d prefills queued; %+v", i, d.PodKey, d.Outcome, i, candidate(t, d, "p2"))
		}
		started = append(started, startPrefill(r, d))
	}
	d := route(t, r, request("r", KVAware, p()), pods)
	if d.PodKey == key("p2") || d.Outcome != OutcomeLoadOverPrefix {
		t.Fatalf("with six prefills queued on p2 the request went to %s (%s); %+v", d.PodKey, d.Outcome, candidate(t, d, "p2"))
	}
	if c := candidate(t, d, "p2"); c.InFlightPrefills != 6 || c.InFlightPrefillTokens != 6*464 || !near(c.QueueSeconds, 6*0.0464) {
		t.Fatalf("p2's queue %+v, want 6 prefills of 464 tokens, 0.2784 s", c)
	}

	// The queue drains with time...
	clock.Advance(100 * time.Millisecond)
	if c := candidate(t, route(t, r, request("r", KVAware, p()), pods), "p2"); !near(c.QueueSeconds, 6*0.0464-0.1) || c.InFlightPrefills != 6 {
		t.Fatalf("100 ms later p2's queue is %+v, want 0.1784 s left of 6 prefills", c)
	}
	// ...and the last prefill's first token proves all six done.
	started[5].FirstToken()
	if c := candidate(t, route(t, r, request("r", KVAware, p()), pods), "p2"); c.QueueSeconds != 0 || c.InFlightPrefills != 0 {
		t.Fatalf("after the first token of the last prefill p2's queue is %+v, want empty", c)
	}
}

func TestKVAwareDiscountsBlocksHeldOnlyOnCPU(t *testing.T) {
	// p1 holds the whole 2,048-token prompt in CPU memory, p2 half of it
	// in GPU memory. At the default weight of 0.8 copying back saves most
	// of p1's prefill (410 tokens left against p2's 1,024); at 0.3 it
	// saves too little (1,434 tokens left).
	tests := []struct {
		weight       float64
		want         string
		wantUncached int
	}{
		{0.8, "p1", 410},
		{0.3, "p2", 1434},
	}
	for _, tt := range tests {
		pods := testPods(3)
		idx := newTestIndex(t)
		p := prompt(0, 2048)
		holds(t, idx, "p1", p, kvevent.MediumCPU)
		holds(t, idx, "p2", p[:1024], kvevent.MediumGPU)
		r, _ := newTestRouter(t, uniformFleet(3), idx, func(c *Config) { c.CPUCacheWeight = tt.weight })

		d := route(t, r, request("r", KVAware, p), pods)
		cpu := candidate(t, d, "p1")
		if d.PodKey != key(tt.want) || cpu.MatchedTokens != 2048 || cpu.MatchedGPUTokens != 0 || cpu.UncachedTokens != tt.wantUncached {
			t.Errorf("weight %v: chose %s; CPU holder %+v; want %s and %d uncached tokens on p1", tt.weight, d.PodKey, cpu, tt.want, tt.wantUncached)
		}
	}
}

func TestKVAwareUsesMeasuredSpeedsAndFillsUnmeasuredPods(t *testing.T) {
	pods := testPods(4)
	m := newFakeMetrics().
		set("p0", cache.PrefillTokensPerSecond, 30000).
		set("p1", cache.PrefillTokensPerSecond, 20000).
		set("p3", cache.PrefillTokensPerSecond, 10000)
	r, _ := newTestRouter(t, m, newTestIndex(t))

	d := route(t, r, request("r", KVAware, prompt(0, 3000)), pods)
	if d.PodKey != key("p0") || d.Outcome != OutcomeLoadFallback {
		t.Fatalf("a cold prompt went to %s (%s), want the fastest pod p0 (load_fallback)", d.PodKey, d.Outcome)
	}
	if c := candidate(t, d, "p2"); c.PrefillTokensPerSecond != 20000 || c.SpeedSource != SpeedModelMedian {
		t.Fatalf("unmeasured p2 %+v, want the median 20000 tokens/s", c)
	}
	if c := candidate(t, d, "p0"); c.SpeedSource != SpeedMeasured || !near(c.PredictedTTFTSeconds, 0.1) {
		t.Fatalf("p0 %+v, want a measured speed and 0.1 s", c)
	}

	r, _ = newTestRouter(t, newFakeMetrics(), nil)
	d = route(t, r, request("r", KVAware, prompt(0, 3000)), pods)
	if c := d.Chosen(); c.SpeedSource != SpeedDefault || c.PrefillTokensPerSecond != DefaultPrefillTokensPerSecond {
		t.Fatalf("with no pod measured the chosen pod has %+v, want the default speed", c)
	}
}

func TestKVAwareBelievesAPodMeasuredSlowerThanTheOthers(t *testing.T) {
	// p2 computes 1,000 tokens/s, a tenth of the others. It holds a third
	// of the prompt, which saves less than its slowness costs: 1.976 s
	// against 0.25 s on the fastest idle pod, p3.
	pods := testPods(4)
	idx := newTestIndex(t)
	p := prompt(0, 3000)
	holds(t, idx, "p2", p[:1024], kvevent.MediumGPU)
	m := newFakeMetrics().
		set("p0", cache.PrefillTokensPerSecond, 10000).
		set("p1", cache.PrefillTokensPerSecond, 10000).
		set("p2", cache.PrefillTokensPerSecond, 1000).
		set("p3", cache.PrefillTokensPerSecond, 12000)
	r, _ := newTestRouter(t, m, idx)

	d := route(t, r, request("r", KVAware, p), pods)
	if d.PodKey != key("p3") || d.Outcome != OutcomeLoadOverPrefix {
		t.Fatalf("chose %s (%s), want the fastest pod p3 over the slow holder; candidates %+v", d.PodKey, d.Outcome, d.Candidates)
	}
	if c := candidate(t, d, "p2"); c.PrefillTokensPerSecond != 1000 || c.SpeedSource != SpeedMeasured || !near(c.PredictedTTFTSeconds, 1.976) {
		t.Fatalf("p2 %+v, want its own 1000 tokens/s and 1.976 s", c)
	}
}

func TestKVAwareCountsDecodeInterference(t *testing.T) {
	pods := testPods(2)
	idx := newTestIndex(t)
	p := prompt(0, 1024)
	holds(t, idx, "p0", p, kvevent.MediumGPU)
	holds(t, idx, "p1", p, kvevent.MediumGPU)
	m := uniformFleet(2).set("p0", cache.AvgTPOTSeconds, 0.08)
	r, _ := newTestRouter(t, m, idx)

	d := route(t, r, request("r", KVAware, p), pods)
	if d.PodKey != key("p1") || d.Outcome != OutcomePrefixHit {
		t.Fatalf("fully cached prompt went to %s (%s), want p1 whose decode steps are shorter", d.PodKey, d.Outcome)
	}
}

func TestKVAwareWithoutTokensRoutesOnQueuedWork(t *testing.T) {
	pods := testPods(3)
	m := uniformFleet(3).set("p0", cache.NumRequestsWaiting, 2).set("p2", cache.NumRequestsWaiting, 1)
	r, _ := newTestRouter(t, m, newTestIndex(t))
	ctx := request("r", KVAware, nil)
	ctx.PromptTokenCount = 500

	d := route(t, r, ctx, pods)
	if d.PodKey != key("p1") || d.Outcome != OutcomeNoTokens || d.Chosen().UncachedTokens != 500 {
		t.Fatalf("chose %s (%s) with %+v, want p1 (no_tokens) and all 500 tokens uncached", d.PodKey, d.Outcome, d.Chosen())
	}
}

func TestKVAwareBreaksTiesByRunningRequests(t *testing.T) {
	pods := testPods(3)
	// p1 is 1% slower, within the 5% tolerance, and runs fewer requests.
	m := uniformFleet(3).set("p1", cache.PrefillTokensPerSecond, 9900).
		set("p0", cache.RealtimeNumRequestsRunning, 2).
		set("p1", cache.RealtimeNumRequestsRunning, 1).
		set("p2", cache.RealtimeNumRequestsRunning, 2)
	r, _ := newTestRouter(t, m, newTestIndex(t))

	if d := route(t, r, request("r", KVAware, prompt(0, 1000)), pods); d.PodKey != key("p1") {
		t.Fatalf("chose %s, want p1: tied on TTFT with the fewest running requests; %+v", d.PodKey, d.Candidates)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestKVAwareReadsNonFiniteMetricsAsUnmeasured(t *testing.T) {
	m := uniformFleet(3).
		set("p0", cache.PrefillTokensPerSecond, math.NaN()).
		set("p1", cache.PrefillTokensPerSecond, math.Inf(1)).
		set("p1", cache.NumRequestsWaiting, math.Inf(1))
	r, _ := newTestRouter(t, m, nil)

	d := route(t, r, request("r", KVAware, prompt(0, 1000)), testPods(3))
	for _, name := range []string{"p0", "p1"} {
		if c := candidate(t, d, name); c.SpeedSource != SpeedModelMedian || c.PrefillTokensPerSecond != 10000 || math.IsNaN(c.Score) || math.IsInf(c.Score, 0) {
			t.Fatalf("%s: %+v, want the median speed and a finite prediction", name, c)
		}
	}
}

func TestKVAwareSparesTheRequestsDecodingOnAPodAPrefill(t *testing.T) {
	// p0 holds 1,536 of the 2,048 prompt tokens: 512 to prefill there
	// (0.0512 s), 2,048 on the idle p1 (0.2048 s); half of each counts
	// again for the fleet's capacity. Every request decoding on p0 waits
	// for p0's prefill too: with four, p0 costs 0.0712 + 0.0256 +
	// 4 x 0.0512 = 0.3016 s against p1's 0.2248 + 0.1024 = 0.3272 s; with
	// five, 0.3528 s, beyond the tie tolerance.
	tests := []struct {
		decoding float64
		want     string
		outcome  Outcome
	}{
		{4, "p0", OutcomePrefixHit},
		{5, "p1", OutcomeLoadOverPrefix},
	}
	for _, tt := range tests {
		pods := testPods(2)
		idx := newTestIndex(t)
		p := prompt(0, 2048)
		holds(t, idx, "p0", p[:1536], kvevent.MediumGPU)
		r, _ := newTestRouter(t, uniformFleet(2).set("p0", cache.RealtimeNumRequestsRunning, tt.decoding), idx)

		d := route(t, r, request("r", KVAware, p), pods)
		holder := candidate(t, d, "p0")
		if d.PodKey != key(tt.want) || d.Outcome != tt.outcome || holder.Decoding != tt.decoding ||
			!near(holder.PredictedTTFTSeconds, 0.0712) || !near(holder.Score, 0.0712+0.0256+tt.decoding*0.0512) {
			t.Fatalf("with %v requests decoding on the holder: chose %s (%s); holder %+v", tt.decoding, d.PodKey, d.Outcome, holder)
		}
	}
}

func TestKVAwareKeepsItsCacheHitsWhenEveryPodHasPrefillsQueued(t *testing.T) {
	// As in TestKVAwareWeighsInFlightPrefillsUntilTheirFirstToken, p2
	// holds 1,536 of the 2,000-token prompt and has six prefills queued.
	// While the other pods are idle the request goes to one of them; once
	// each has a prefill queued too, a cold prefill there grows the
	// fleet's backlog by 2,000 tokens, which every queued request waits
	// for, against 464 on p2: the request stays with the cache.
	pods := testPods(4)
	idx := newTestIndex(t)
	p := prompt(0, 2000)
	holds(t, idx, "p2", p[:1536], kvevent.MediumGPU)
	clock := newManualClock()
	r, _ := newTestRouter(t, uniformFleet(4), idx, func(c *Config) { c.Now = clock.Now })
	// The queued prompts share the cached prefix but not the rest, so that
	// no prompt in flight on p2 covers the request's uncached tail.
	for i := range 6 {
		q := append(slices.Clone(p[:1536]), prompt(50_000*(i+1), 464)...)
		startPrefill(r, route(t, r, request("r", KVAware, q), pods))
	}
	d := route(t, r, request("r", KVAware, p), pods)
	if d.PodKey == key("p2") {
		t.Fatalf("with the other pods idle the request stayed on p2; %+v", d.Candidates)
	}
	// Three cold prompts go to the three idle pods, one each.
	for i := range 3 {
		startPrefill(r, route(t, r, request("cold", KVAware, prompt(10_000*(i+1), 2000)), pods))
	}
	d = route(t, r, request("r", KVAware, p), pods)
	for _, other := range []string{"p0", "p1", "p3"} {
		if c := candidate(t, d, other); c.InFlightPrefills != 1 {
			t.Fatalf("%s has %d prefills queued, want the one of a cold prompt; %+v", other, c.InFlightPrefills, d.Candidates)
		}
	}
	if d.PodKey != key("p2") || d.Outcome != OutcomePrefixHit {
		t.Fatalf("with prefills queued on every pod the request went to %s (%s); %+v", d.PodKey, d.Outcome, d.Candidates)
	}
}

// A pod whose scrapes fail keeps its last prefill speed, which says nothing
// of the others: while some pods' metrics are current, a pod without a
// measured speed gets the median of the current ones.
func TestStaleSpeedsDoNotSetTheMedian(t *testing.T) {
	pods := testPods(4)
	m := newFakeMetrics().
		set("p0", cache.PrefillTokensPerSecond, 1e6).setScrape("p0", cache.ScrapeStale).
		set("p1", cache.PrefillTokensPerSecond, 1e6).setScrape("p1", cache.ScrapeStale).
		set("p2", cache.PrefillTokensPerSecond, 1000)
	r, _ := newTestRouter(t, m, newTestIndex(t))
	d := route(t, r, request("r", KVAware, prompt(0, 3000)), pods)
	if c := candidate(t, d, "p3"); c.PrefillTokensPerSecond != 1000 || c.SpeedSource != SpeedModelMedian {
		t.Fatalf("p3, unmeasured, given %g tokens/s (%s); want 1000, the median of the current pods", c.PrefillTokensPerSecond, c.SpeedSource)
	}
}

func TestPrefixAwareAlgorithmsFailWithoutAPodWhenNoCostIsANumber(t *testing.T) {
	// New refuses a CPU cache weight that is not a number; set after it,
	// the weight makes every candidate's cost NaN, so that no pod can be
	// chosen. Route must then fail as it does without pods, not index the
	// missing choice.
	for _, alg := range []string{KVAware, SLO} {
		t.Run(alg, func(t *testing.T) {
			pods := testPods(2)
			idx := newTestIndex(t)
			p := prompt(0, 256)
			holds(t, idx, "p1", p[:128], kvevent.MediumGPU)
			r, _ := newTestRouter(t, uniformFleet(2), idx)
			r.cfg.CPUCacheWeight = math.NaN()
			var d Decision
			err := r.Route(context.Background(), request("r", alg, p), snaps(r, pods), &d)
			if !errors.Is(err, ErrNoPods) || d.Endpoint != nil {
				t.Fatalf("Route = %v, chose %s; want ErrNoPods and no pod", err, d.PodKey)
			}
		})
	}
}

func TestKVAwareTiesOnlyEqualCostsWithAToleranceOfZero(t *testing.T) {
	// p1 holds 96 of the 1,000 prompt tokens but prefills at 8,500 tokens
	// a second against the others' 10,000: its cost, 0.1739 s, is 0.75%
	// above theirs, 0.1726 s. Within the default 5% it ties with them and
	// wins on the least prefill work; without a tolerance, p0 and p2 are
	// cheaper.
	tests := []struct {
		name      string
		tolerance float64
		want      []string
	}{
		{"default tolerance", 0, []string{"p1"}},
		{"tolerance set to 0", TieToleranceSetting(0), []string{"p0", "p2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pods := testPods(3)
			idx := newTestIndex(t)
			p := prompt(0, 1000)
			holds(t, idx, "p1", p[:96], kvevent.MediumGPU)
			m := uniformFleet(3).set("p1", cache.PrefillTokensPerSecond, 8500)
			r, _ := newTestRouter(t, m, idx, func(c *Config) { c.TieTolerance = tt.tolerance })

			d := route(t, r, request("r", KVAware, p), pods)
			if !slices.ContainsFunc(tt.want, func(p string) bool { return d.PodKey == key(p) }) {
				t.Fatalf("chose %s, want one of %v; %+v", d.PodKey, tt.want, d.Candidates)
			}
			if c := candidate(t, d, "p1"); c.UncachedTokens != 904 || !near(c.Score, 904.0/8500+0.02+904/(28500.0/3)*0.5) {
				t.Fatalf("p1 %+v, want 904 uncached tokens and a cost of 0.1739 s", c)
			}
		})
	}
}
