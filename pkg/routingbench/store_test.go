package routingbench

import (
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/sim"
)

func TestScrapedMeansFollowTheRecentWindowAsTheStoreDoes(t *testing.T) {
	s := scraped{window: counterWindow{length: 10 * time.Second}, prefillWindow: counterWindow{length: time.Minute}}
	if _, ok := s.value(cache.AvgTTFTSeconds); ok {
		t.Fatal("a mean before the first scrape")
	}
	var c counters
	at := func(sec int) time.Duration { return time.Duration(sec) * time.Second }
	check := func(when string, want float64) {
		t.Helper()
		if got, ok := s.value(cache.AvgTTFTSeconds); !ok || got != want {
			t.Errorf("%s: mean TTFT %v (%v), want %v", when, got, ok, want)
		}
	}
	// The engine had served 2 requests at 3 s each before the first
	// scrape: the lifetime mean stands in until a window sees one.
	c.ttftSum, c.ttftCount = 6, 2
	s.scrape(0, sim.QueueState{Waiting: 3, Running: 2, KVCacheUsage: 0.5}, c)
	check("first scrape", 3)
	if v, _ := s.value(cache.NumRequestsWaiting); v != 3 {
		t.Errorf("waiting %v, want 3", v)
	}
	for sec := 1; sec <= 30; sec++ {
		switch sec {
		case 1: // 4 requests of 0.5 s
			c.ttftSum, c.ttftCount = c.ttftSum+2, c.ttftCount+4
		case 16: // 2 requests of 2 s
			c.ttftSum, c.ttftCount = c.ttftSum+4, c.ttftCount+2
		}
		s.scrape(at(sec), sim.QueueState{}, c)
		switch sec {
		case 1:
			check("after the first window's requests", 0.5)
		case 16:
			check("once the window slid past them", 2)
		case 30:
			check("through windows without requests", 2)
		}
	}
}

func TestScrapedPrefillSpeedFollowsItsWindowAsTheStoreDoes(t *testing.T) {
	s := scraped{window: counterWindow{length: 10 * time.Second}, prefillWindow: counterWindow{length: time.Minute}}
	var c counters
	speed := func() float64 {
		v, ok := s.value(cache.PrefillTokensPerSecond)
		if !ok {
			t.Fatal("no prefill speed")
		}
		return v
	}
	// One prefill of 1,000 tokens a second, in one step of 10 ms besides
	// its tokens; decoding requests see 10 such steps a second. For 30 s
	// the engine computes 5,000 tokens/s, then 10,000.
	want := map[int]float64{
		20: 5000,
		// The window grows to a minute: 30 s at 5,000 and 15 at 10,000.
		45: 45000 / (30*0.2 + 15*0.1),
		// It slid past the slow prefills.
		100: 10000,
	}
	for sec := 0; sec <= 100; sec++ {
		s.scrape(time.Duration(sec)*time.Second, sim.QueueState{}, c)
		if w, ok := want[sec]; ok {
			if got := speed(); math.Abs(got-w) > 1e-6*w {
				t.Errorf("at %d s: %v tokens/s, want %v", sec, got, w)
			}
		}
		compute := 0.1
		if sec < 30 {
			compute = 0.2
		}
		c.promptTokens += 1000
		c.ttftSum, c.ttftCount, c.prefillSum = c.ttftSum+compute+0.01, c.ttftCount+1, c.prefillSum+compute+0.01
		c.itlSum, c.itlCount = c.itlSum+0.1, c.itlCount+10
	}
}

func TestStoreViewServesTheGatewaysCountsAtOnceAndScrapesOnceScraped(t *testing.T) {
	f, err := newFleet(smallFleet().withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	v := storeView{f: f}
	e := f.engines[1]
	ledger, err := inflight.New(inflight.Config{Now: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		ledger.Admit("r", benchModel).Route(inflight.Route{Pod: e.load, Endpoint: e.pod})
	}
	sp := v.snapshots(nil)[1]
	if sp.Endpoint != e.pod || sp.Load.Running() != 3 {
		t.Errorf("snapshot of %s: running %d, want the gateway's 3 before any scrape", sp.Endpoint.ID, sp.Load.Running())
	}
	if sp.Metrics.Measured&cache.HasWaiting != 0 {
		t.Errorf("waiting before a scrape: %+v, want none measured", sp.Metrics)
	}
	f.now = 50 * time.Millisecond
	e.metrics.scrape(f.now, sim.QueueState{Waiting: 2}, counters{})
	f.now = 80 * time.Millisecond
	m := v.snapshots(nil)[1].Metrics
	if m.Measured&cache.HasWaiting == 0 || m.Waiting != 2 || !m.At.Equal(simEpoch.Add(50*time.Millisecond)) {
		t.Errorf("waiting %+v, want 2 as scraped at 50ms", m)
	}
}
