package routing

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

// unfreshFleet is three pods: p0 busy with fresh metrics, p1 idle as last
// measured before its scrapes started failing, and p2 never scraped. p1
// holds the prompt's whole prefix.
func unfreshFleet(t *testing.T) (*fakeMetrics, *Router, []uint32) {
	t.Helper()
	m := newFakeMetrics()
	busy := map[string]float64{cache.RealtimeNumRequestsRunning: 3, cache.NumRequestsWaiting: 4,
		cache.KVCacheUsagePerc: 0.9, cache.AvgTTFTSeconds: 2, cache.AvgTPOTSeconds: 0.05}
	for name, v := range busy {
		m.set("p0", name, v)
	}
	m.set("p1", cache.NumRequestsWaiting, 0).set("p1", cache.KVCacheUsagePerc, 0).
		set("p1", cache.AvgTTFTSeconds, 0.01).set("p1", cache.AvgTPOTSeconds, 0.01)
	m.setScrape("p1", cache.ScrapeStale).setScrape("p2", cache.ScrapeNone)
	idx := newTestIndex(t)
	p := prompt(0, 512)
	holds(t, idx, "p1", p, kvevent.MediumGPU)
	r, _ := newTestRouter(t, m, idx)
	return m, r, p
}

func TestLoadAlgorithmsChoosePodsWithFreshMetricsOverIdleLookingOthers(t *testing.T) {
	_, r, p := unfreshFleet(t)
	pods := testPods(3)
	for _, alg := range []string{LeastRequest, LeastKVCache, LeastLatency, PrefixCache, KVAware} {
		for i := range 30 {
			d := route(t, r, request(fmt.Sprint(i), alg, p), pods)
			if d.PodKey != key("p0") {
				t.Fatalf("%s chose %s; want p0, the only pod with fresh metrics: %+v", alg, d.PodKey, d.Candidates)
			}
		}
		d := route(t, r, request("x", alg, p), pods)
		for name, want := range map[string]cache.ScrapeState{"p0": cache.ScrapeFresh, "p1": cache.ScrapeStale, "p2": cache.ScrapeNone} {
			if got := candidate(t, d, name).Scrape; got != want {
				t.Errorf("%s: %s scrape %q, want %q", alg, name, got, want)
			}
		}
	}
}

func TestWithoutFreshMetricsStaleAndUnscrapedPodsAreRoutedAlike(t *testing.T) {
	m, r, p := unfreshFleet(t)
	pods := testPods(3)
	m.setScrape("p0", cache.ScrapeStale)
	// p1 and p2 run nothing, p0 three requests: least-request spreads over
	// p1 and p2 whatever their scrapes say.
	seen := map[string]int{}
	for i := range 60 {
		seen[route(t, r, request(fmt.Sprint(i), LeastRequest, nil), pods).PodKey]++
	}
	if seen[key("p0")] != 0 || seen[key("p1")] == 0 || seen[key("p2")] == 0 {
		t.Errorf("least-request chose %v; want p1 and p2, never the busy p0", seen)
	}
	// kv-aware goes back to the prefix p1 holds.
	if d := route(t, r, request("kv", KVAware, p), pods); d.PodKey != key("p1") || d.Outcome != OutcomePrefixHit {
		t.Errorf("kv-aware chose %s (%s); want p1's prefix hit", d.PodKey, d.Outcome)
	}
}

func TestRandomIgnoresScrapes(t *testing.T) {
	_, r, _ := unfreshFleet(t)
	pods := testPods(3)
	seen := map[string]int{}
	for i := range 300 {
		seen[route(t, r, request(fmt.Sprint(i), Random, nil), pods).PodKey]++
	}
	if len(seen) != 3 {
		t.Errorf("random chose %v; want every pod", seen)
	}
}

func TestRouterOnAStoreAvoidsAPodWhoseScrapesFail(t *testing.T) {
	f := newStoreFleet(t, 3)
	for i, e := range f.engines {
		e.set(func(s *engineState) { s.waiting = float64(5 * (i + 1)) })
		f.waitForMetric(t, fmt.Sprintf("p%d", i), cache.NumRequestsWaiting, float64(5*(i+1)))
	}
	f.engines[0].srv.Close() // p0 was the least loaded: it now looks idle, and stale
	f.waitFor(t, func(pod string) (string, bool) {
		got := f.store.PodScrapeState(endpoint.Key{Namespace: testNamespace, Name: pod})
		want := cache.ScrapeFresh
		if pod == "p0" {
			want = cache.ScrapeStale
		}
		return string(got), got == want
	})
	r, _ := newTestRouter(t, f.store, nil)
	for i := range 20 {
		if d := route(t, r, request(fmt.Sprint(i), KVAware, prompt(0, 256)), f.pods(t)); d.PodKey != key("p1") {
			t.Fatalf("kv-aware chose %s; want p1, the least loaded pod with fresh metrics: %+v", d.PodKey, d.Candidates)
		}
	}
}
