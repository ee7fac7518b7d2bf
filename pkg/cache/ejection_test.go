package cache

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// ejectionStore returns a Store that scrapes nothing, on the fake clock.
func ejectionStore(t *testing.T, reg prometheus.Registerer) (*Store, *testsupport.Clock) {
	t.Helper()
	cfg := noScrape()
	cfg.Registerer = reg
	s := newTestStore(t, cfg)
	clock := testsupport.NewClock(time.Unix(1_700_000_000, 0))
	s.now = clock.Now
	return s, clock
}

func TestEjectionBackoffDoublesUpToTheMaximumAndAnAnswerResetsIt(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, clock := ejectionStore(t, reg)
	p := testPod("ns", "p", llama, "10.0.0.1")
	s.AddOrUpdatePod(p)

	for i, want := range []time.Duration{1, 2, 4, 8, 16, 30, 30} {
		want *= time.Second
		s.EjectPod(epOf(p), EjectConnectionRefused)
		ej, ok := s.PodEjection(epOf(p))
		if !ok || ej.Backoff != want || ej.Count != i+1 || ej.Reason != EjectConnectionRefused ||
			!ej.Until.Equal(clock.Now().Add(want)) {
			t.Fatalf("ejection %d: %+v, %v; want %v from now", i+1, ej, ok, want)
		}
		// Failures of requests sent before the ejection change nothing.
		s.EjectPod(epOf(p), EjectDialFailed)
		if again, _ := s.PodEjection(epOf(p)); again != ej {
			t.Fatalf("ejecting an ejected pod changed %+v to %+v", ej, again)
		}
		clock.Advance(want - time.Millisecond)
		if _, ok := s.PodEjection(epOf(p)); !ok {
			t.Fatalf("ejection %d ended early", i+1)
		}
		clock.Advance(time.Millisecond)
		if ej, ok := s.PodEjection(epOf(p)); ok {
			t.Fatalf("ejection %d lasts past its backoff: %+v", i+1, ej)
		}
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_pod_ejections_total", map[string]string{"pod": "ns/p", "reason": "connection_refused"}); n != 7 {
		t.Errorf("ejections = %v, want 7", n)
	}

	s.EjectPod(epOf(p), EjectDialFailed)
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_ejected_pods", nil); n != 1 {
		t.Errorf("ejected pods = %v, want 1", n)
	}
	s.PodReachable(epOf(p))
	if ej, ok := s.PodEjection(epOf(p)); ok {
		t.Fatalf("pod still ejected after it answered: %+v", ej)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_ejected_pods", nil); n != 0 {
		t.Errorf("ejected pods = %v after the pod answered, want 0", n)
	}
	s.EjectPod(epOf(p), EjectDialFailed)
	if ej, _ := s.PodEjection(epOf(p)); ej.Backoff != time.Second || ej.Count != 1 || ej.Reason != EjectDialFailed {
		t.Errorf("ejection after an answer: %+v, want the first backoff again", ej)
	}
}

func TestEjectionBelongsToOnePodVersion(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, _ := ejectionStore(t, reg)
	old := testPod("ns", "p", llama, "10.0.0.1")
	s.AddOrUpdatePod(old)
	s.EjectPod(epOf(old), EjectConnectionRefused)

	// An update of the same pod keeps its ejection.
	updated := testPod("ns", "p", llama, "10.0.0.1", withLabel("rev", "2"))
	s.AddOrUpdatePod(updated)
	if _, ok := s.PodEjection(epOf(updated)); !ok {
		t.Error("an update of an ejected pod readmitted it")
	}
	// A replacement (another UID) starts afresh, and reports about the
	// pod it replaced do not touch it.
	replacement := testPod("ns", "p", llama, "10.0.0.2", withUID("new"))
	s.AddOrUpdatePod(replacement)
	s.EjectPod(epOf(old), EjectConnectionRefused)
	if ej, ok := s.PodEjection(epOf(replacement)); ok {
		t.Errorf("the replacement pod is ejected: %+v", ej)
	}
	if _, ok := s.PodEjection(epOf(old)); ok {
		t.Error("the replaced pod's ejection is still reported")
	}

	s.DeletePod(pkey("ns", "p"))
	s.EjectPod(epOf(replacement), EjectConnectionRefused)
	if n := testsupport.MetricSeries(t, reg, "kvgate_cache_pod_ejections_total", map[string]string{"pod": "ns/p"}); n != 0 {
		t.Errorf("%d ejection series of a deleted pod, want none", n)
	}
}

// A request fails to connect to a pod whose deletion the informer delivers
// at the same moment: the deletion lands while EjectPod is under way, after
// it found the pod registered (here: as EjectPod reads the Store's clock).
// No ejection series of the deleted pod is left, since nothing would ever
// delete it.
func TestEjectionRacingTheDeletionOfItsPodLeavesNoSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, clock := ejectionStore(t, reg)
	p := testPod("ns", "p", llama, "10.0.0.1")
	s.AddOrUpdatePod(p)
	var deleted atomic.Bool
	s.now = func() time.Time {
		if deleted.CompareAndSwap(false, true) {
			s.DeletePod(pkey("ns", "p"))
		}
		return clock.Now()
	}
	s.EjectPod(epOf(p), EjectConnectionRefused)
	if !deleted.Load() {
		t.Fatal("EjectPod did not read the clock: the deletion never landed")
	}
	if _, err := s.GetPod(pkey("ns", "p")); err == nil {
		t.Fatal("the pod is still registered")
	}
	if n := testsupport.MetricSeries(t, reg, "kvgate_cache_pod_ejections_total", map[string]string{"pod": "ns/p"}); n != 0 {
		t.Errorf("%d ejection series of a deleted pod, want none", n)
	}
}

func TestSuccessfulScrapeReadmitsAPodServingMetricsOnItsPort(t *testing.T) {
	same, other := newEngine(t, "vllm_v1_t0.txt"), newEngine(t, "vllm_v1_t0.txt")
	cfg := scrapeConfig(nil)
	cfg.EjectionBackoff, cfg.MaxEjectionBackoff = time.Hour, time.Hour
	s := newTestStore(t, cfg)
	p := same.pod("p", llama)
	// q serves requests on a port of its own and /metrics on other's.
	q := testPod("ns", "q", llama, "127.0.0.1", withPort(1), withLabel(endpoint.MetricPortLabel, strconv.Itoa(other.port)))
	s.AddOrUpdatePod(p)
	s.AddOrUpdatePod(q)
	waitMetric(t, s, "p", NumRequestsRunning, equals(4))
	waitMetric(t, s, "q", NumRequestsRunning, equals(4))

	same.mode.Store(serveError)
	waitMetric(t, s, "p", NumRequestsRunning, func(v MetricValue) bool { return v.Stale })
	s.EjectPod(epOf(p), EjectConnectionRefused)
	s.EjectPod(epOf(q), EjectConnectionRefused)
	if _, ok := s.PodEjection(epOf(p)); !ok {
		t.Fatal("a pod whose scrapes fail was readmitted")
	}
	same.mode.Store(serveOK)
	testsupport.Eventually(t, "p to be readmitted once its scrapes succeed again", func() bool {
		_, ejected := s.PodEjection(epOf(p))
		return !ejected
	})
	// q's scrapes succeed all along, which says nothing of its serving port.
	hits := other.hits.Load()
	testsupport.Eventually(t, "more scrapes of q", func() bool { return other.hits.Load() > hits+2 })
	if _, ok := s.PodEjection(epOf(q)); !ok {
		t.Error("a scrape of another port readmitted q")
	}
}

func TestScrapeStateFollowsTheLatestScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	up, down := newEngine(t, "vllm_v1_t0.txt"), newEngine(t, "vllm_v1_t0.txt")
	down.srv.Close()
	s := newTestStore(t, scrapeConfig(reg))
	if got := s.PodScrapeState(pkey("ns", "p")); got != ScrapeNone {
		t.Errorf("unknown pod: %s, want none", got)
	}
	s.AddOrUpdatePod(up.pod("p", llama))
	s.AddOrUpdatePod(down.pod("dead", llama))
	waitMetric(t, s, "p", NumRequestsRunning, equals(4))
	if got := s.PodScrapeState(pkey("ns", "p")); got != ScrapeFresh {
		t.Errorf("scraped pod: %s, want fresh", got)
	}
	// A pod never scraped successfully is stale once a scrape failed.
	testsupport.EventuallyWhy(t, "the dead pod's metrics to go stale", func() (string, bool) {
		got := s.PodScrapeState(pkey("ns", "dead"))
		return "scrape state " + string(got), got == ScrapeStale
	})
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_stale_pods", nil); n != 1 {
		t.Errorf("stale pods = %v, want the dead one", n)
	}
	up.mode.Store(serveError)
	testsupport.EventuallyWhy(t, "the failing pod's metrics to go stale", func() (string, bool) {
		got := s.PodScrapeState(pkey("ns", "p"))
		return "scrape state " + string(got), got == ScrapeStale
	})

	off := newTestStore(t, noScrape())
	off.AddOrUpdatePod(up.pod("p", llama))
	if got := off.PodScrapeState(pkey("ns", "p")); got != ScrapeNone {
		t.Errorf("without scraping: %s, want none", got)
	}
}

func TestPodLastScrapedStaysAtTheLastSuccessWhileScrapesFail(t *testing.T) {
	up, down := newEngine(t, "vllm_v1_t0.txt"), newEngine(t, "vllm_v1_t0.txt")
	down.srv.Close()
	s := newTestStore(t, scrapeConfig(prometheus.NewRegistry()))
	if at := s.PodLastScraped(pkey("ns", "p")); !at.IsZero() {
		t.Errorf("unknown pod: last scraped %v, want zero", at)
	}
	s.AddOrUpdatePod(up.pod("p", llama))
	s.AddOrUpdatePod(down.pod("dead", llama))
	waitMetric(t, s, "p", NumRequestsRunning, equals(4))
	testsupport.EventuallyWhy(t, "the dead pod's scrape to fail", func() (string, bool) {
		got := s.PodScrapeState(pkey("ns", "dead"))
		return "scrape state " + string(got), got == ScrapeStale
	})
	if at := s.PodLastScraped(pkey("ns", "dead")); !at.IsZero() {
		t.Errorf("pod never scraped successfully: last scraped %v, want zero", at)
	}
	before := time.Now()
	testsupport.Eventually(t, "a scrape of p begun after "+before.String(), func() bool {
		return s.PodLastScraped(pkey("ns", "p")).After(before)
	})
	up.mode.Store(serveError)
	testsupport.EventuallyWhy(t, "p's scrapes to fail", func() (string, bool) {
		got := s.PodScrapeState(pkey("ns", "p"))
		return "scrape state " + string(got), got == ScrapeStale
	})
	last := s.PodLastScraped(pkey("ns", "p"))
	hits := up.hits.Load()
	testsupport.Eventually(t, "more failed scrapes of p", func() bool { return up.hits.Load() > hits+2 })
	if at := s.PodLastScraped(pkey("ns", "p")); !at.Equal(last) || !last.After(before) {
		t.Errorf("last scraped %v after failures, want the last success %v (after %v)", at, last, before)
	}
	up.mode.Store(serveOK)
	testsupport.Eventually(t, "a successful scrape again", func() bool { return s.PodLastScraped(pkey("ns", "p")).After(last) })
}

func TestOnScrapeIsCalledAfterEverySuccessfulScrapeOnly(t *testing.T) {
	e := newEngine(t, "vllm_v1_t0.txt")
	var scraped atomic.Int64
	reg := prometheus.NewRegistry()
	cfg := scrapeConfig(reg)
	cfg.OnScrape = func() { scraped.Add(1) }
	s := newTestStore(t, cfg)
	s.AddOrUpdatePod(e.pod("p", llama))
	testsupport.Eventually(t, "scrapes to be reported", func() bool { return scraped.Load() >= 3 })
	e.mode.Store(serveError)
	testsupport.EventuallyWhy(t, "the failing pod's metrics to go stale", func() (string, bool) {
		got := s.PodScrapeState(pkey("ns", "p"))
		return "scrape state " + string(got), got == ScrapeStale
	})
	n := scraped.Load()
	failures := func() float64 { return testsupport.MetricValue(t, reg, "kvgate_cache_pod_scrape_failures_total", nil) }
	// Two failed scrapes later, none was reported.
	f0 := failures()
	testsupport.Eventually(t, "more failed scrapes", func() bool { return failures() >= f0+2 })
	if got := scraped.Load(); got != n {
		t.Errorf("OnScrape called %d times after scrapes failed", got-n)
	}
}
