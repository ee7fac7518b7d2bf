package cache

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/endpoint"
	v1 "k8s.io/api/core/v1"
)

func TestSnapshotsGatherWhatRoutingReadsOfEachPod(t *testing.T) {
	s := newTestStore(t, noScrape())
	scraped, unscraped, ejected := testPod("ns", "a", "m", "10.0.0.1"), testPod("ns", "b", "m", "10.0.0.2"), testPod("ns", "c", "m", "10.0.0.3")
	for _, p := range []*v1.Pod{scraped, unscraped, ejected} {
		s.AddOrUpdatePod(p)
	}
	at := time.Unix(100, 0)
	fam := parseExposition(t, "vllm_v1_t0.txt")
	s.reg.entry(pkey("ns", "a")).state.metrics.Store(projectedOnce(at, fam, "m"))
	s.EjectPod(epOf(ejected), EjectConnectionRefused)
	l := newTestLedger(t)
	routeTo(t, s, l, "r", "m", pkey("ns", "a"), 0)

	pods, err := s.ListPodsByModel("m")
	if err != nil {
		t.Fatal(err)
	}
	gone := epOf(testPod("ns", "gone", "m", "10.0.0.9"))
	snaps := s.Snapshots(append(pods, gone), nil)
	a, b, c, g := snaps[0], snaps[1], snaps[2], snaps[3]
	waiting, _ := s.GetMetricValueByPod(pkey("ns", "a"), NumRequestsWaiting)
	usage, _ := s.GetMetricValueByPod(pkey("ns", "a"), KVCacheUsagePerc)
	if a.Endpoint != pods[0] || a.Scrape != ScrapeFresh || !a.Metrics.At.Equal(at) || a.Metrics.Waiting != waiting.Value ||
		a.Metrics.KVCacheUsage != usage.Value || a.Metrics.Measured&(HasWaiting|HasKVCacheUsage) != HasWaiting|HasKVCacheUsage ||
		a.Load != s.PodLoad(pkey("ns", "a")) || a.Load.Running() != 1 || a.Ejected {
		t.Fatalf("scraped pod: %+v", a)
	}
	if b.Scrape != ScrapeNone || !reflect.DeepEqual(b.Metrics, PodMetrics{}) || b.Ejected {
		t.Fatalf("unscraped pod: %+v", b)
	}
	if !c.Ejected {
		t.Fatalf("ejected pod: %+v", c)
	}
	if g.Endpoint != gone || g.Scrape != ScrapeNone || g.Load == nil || g.Load.Running() != 0 {
		t.Fatalf("pod gone from the registry: %+v", g)
	}

	// A pod replaced by one of another UID is snapshot as registered now.
	s.AddOrUpdatePod(testPod("ns", "a", "m", "10.0.0.7", withUID("new")))
	if sp := s.Snapshots(pods[:1], nil)[0]; sp.Endpoint.IP != "10.0.0.7" || sp.Scrape != ScrapeNone || sp.Load.Running() != 0 {
		t.Fatalf("replaced pod: %+v", sp)
	}
}

func TestSnapshotsLeaveOutValuesThatAreNotNumbers(t *testing.T) {
	m := podMetricsOf(map[string]MetricValue{NumRequestsWaiting: {Value: math.NaN()}, AvgTPOTSeconds: {Value: math.Inf(1)},
		PrefillTokensPerSecond: {Value: 5000}}, time.Unix(1, 0))
	if m.Measured != HasPrefillSpeed || m.Waiting != 0 || m.AvgTPOTSeconds != 0 || m.PrefillTokensPerSecond != 5000 {
		t.Fatalf("podMetricsOf = %+v, want only the prefill speed measured", m)
	}
}

func BenchmarkSnapshots(b *testing.B) {
	s := newTestStore(b, noScrape())
	fam := parseExposition(b, "vllm_v1_t0.txt")
	for i := range 16 {
		p := testPod("ns", "p"+string(rune('a'+i)), "m", "10.0.0.1")
		s.AddOrUpdatePod(p)
		s.reg.entry(endpoint.KeyOf(p)).state.metrics.Store(projectedOnce(time.Now(), fam, "m"))
	}
	pods, _ := s.ListPodsByModel("m")
	var out []PodSnapshot
	b.ReportAllocs()
	for b.Loop() {
		out = s.Snapshots(pods, out[:0])
	}
}
