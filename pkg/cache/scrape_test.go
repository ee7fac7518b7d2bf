package cache

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// Modes of a fakeEngine's /metrics.
const (
	serveOK = iota
	serveError
	serveHang
)

// Encodings of a fakeEngine's /metrics.
const (
	encodeIdentity = iota
	// encodeGzip: gzip, when the request accepts it, as vLLM's.
	encodeGzip
	// encodeFalseGzip: said to be gzip, but not encoded.
	encodeFalseGzip
)

// fakeEngine serves a vLLM exposition from testdata on /metrics of its own
// 127.0.0.1 port.
type fakeEngine struct {
	srv      *httptest.Server
	port     int
	body     atomic.Pointer[[]byte]
	mode     atomic.Int32
	encoding atomic.Int32
	hits     atomic.Int64
}

func newEngine(t *testing.T, file string) *fakeEngine {
	t.Helper()
	e := &fakeEngine{}
	e.serve(t, file)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		e.hits.Add(1)
		switch e.mode.Load() {
		case serveError:
			http.Error(w, "engine overloaded", http.StatusServiceUnavailable)
		case serveHang:
			<-r.Context().Done()
		default:
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			body := *e.body.Load()
			switch e.encoding.Load() {
			case encodeGzip:
				if r.Header.Get("Accept-Encoding") != "gzip" {
					break
				}
				var z bytes.Buffer
				zw := gzip.NewWriter(&z)
				_, _ = zw.Write(body)
				_ = zw.Close()
				body = z.Bytes()
				w.Header().Set("Content-Encoding", "gzip")
			case encodeFalseGzip:
				w.Header().Set("Content-Encoding", "gzip")
			}
			_, _ = w.Write(body)
		}
	}))
	t.Cleanup(e.srv.Close)
	_, port, _ := net.SplitHostPort(e.srv.Listener.Addr().String())
	e.port, _ = strconv.Atoi(port)
	return e
}

func (e *fakeEngine) serve(t *testing.T, file string) {
	e.serveBytes(readExposition(t, file))
}

func (e *fakeEngine) serveBytes(b []byte) { e.body.Store(&b) }

// padded returns the exposition in testdata file followed by comment lines
// up to exactly size bytes.
func padded(t *testing.T, file string, size int) []byte {
	t.Helper()
	b := readExposition(t, file)
	if len(b) > size {
		t.Fatalf("%s has %d bytes, more than %d", file, len(b), size)
	}
	line := "# " + strings.Repeat("x", 1021) + "\n"
	for len(b)+len(line) <= size {
		b = append(b, line...)
	}
	switch rest := size - len(b); rest {
	case 0:
	case 1:
		b = append(b, '\n')
	default:
		b = append(b, "#"+strings.Repeat("x", rest-2)+"\n"...)
	}
	return b
}

// pod returns a routable pod whose engine is e.
func (e *fakeEngine) pod(name, model string, opts ...podOpt) *v1.Pod {
	return testPod("ns", name, model, "127.0.0.1", append([]podOpt{withPort(e.port)}, opts...)...)
}

// scrapeConfig scrapes fast and gives up quickly, with a per-scrape window.
func scrapeConfig(reg prometheus.Registerer) Config {
	return Config{
		PodMetricRefreshInterval: 20 * time.Millisecond,
		PodMetricScrapeTimeout:   300 * time.Millisecond,
		RecentMetricsWindow:      time.Nanosecond,
		Registerer:               reg,
	}
}

// waitMetric waits until the pod's metric satisfies ok.
func waitMetric(t *testing.T, s *Store, pod, metric string, ok func(MetricValue) bool) MetricValue {
	t.Helper()
	var v MetricValue
	testsupport.EventuallyWhy(t, "metric "+metric+" of pod "+pod, func() (string, bool) {
		var err error
		v, err = s.GetMetricValueByPod(pkey("ns", pod), metric)
		return describe(v, err), err == nil && ok(v)
	})
	return v
}

// waitModelMetric waits until the metric of model on the pod satisfies ok.
func waitModelMetric(t *testing.T, s *Store, pod, model, metric string, ok func(MetricValue) bool) {
	t.Helper()
	testsupport.EventuallyWhy(t, "metric "+metric+" of model "+model+" on pod "+pod, func() (string, bool) {
		v, err := s.GetMetricValueByPodModel(pkey("ns", pod), model, metric)
		return describe(v, err), err == nil && ok(v)
	})
}

func equals(want float64) func(MetricValue) bool {
	return func(v MetricValue) bool { return v.Value == want && !v.Stale }
}

func TestStoreScrapesEachRoutablePodOnItsOwnPort(t *testing.T) {
	current, old, idle := newEngine(t, "vllm_v1_t0.txt"), newEngine(t, "vllm_v0_gpu_cache.txt"), newEngine(t, "vllm_v1_t0.txt")
	s := newTestStore(t, scrapeConfig(nil))
	s.AddOrUpdatePod(current.pod("current", llama))
	s.AddOrUpdatePod(old.pod("old", llama))
	s.AddOrUpdatePod(idle.pod("unready", llama, notReady))

	waitMetric(t, s, "current", KVCacheUsagePerc, equals(0.42))
	waitMetric(t, s, "old", KVCacheUsagePerc, equals(0.31))
	waitMetric(t, s, "old", NumRequestsWaiting, equals(5))
	if _, err := s.GetMetricValueByPod(pkey("ns", "old"), PrefixCacheHitRate); !errors.Is(err, ErrMetricNotFound) {
		t.Fatalf("hit rate of an engine without prefix-cache counters: %v", err)
	}
	if n := idle.hits.Load(); n != 0 {
		t.Fatalf("unready pod scraped %d times", n)
	}
	if _, err := s.GetMetricValueByPod(pkey("ns", "unready"), NumRequestsRunning); !errors.Is(err, ErrMetricNotFound) {
		t.Fatalf("metric of a never-scraped pod: %v", err)
	}
}

func TestFailingScrapeKeepsLastValuesMarkedStale(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEngine(t, "vllm_v1_t0.txt")
	s := newTestStore(t, scrapeConfig(reg))
	s.AddOrUpdatePod(e.pod("p", llama))
	first := waitMetric(t, s, "p", NumRequestsRunning, equals(4))

	// A scrape may succeed between first and the switch: the last good
	// one is at first or later, and failures leave it as it is.
	e.mode.Store(serveError)
	v := waitMetric(t, s, "p", NumRequestsRunning, func(v MetricValue) bool { return v.Stale })
	if v.Value != 4 || v.UpdatedAt.Before(first.UpdatedAt) {
		t.Fatalf("stale value %v measured at %v, want the last good 4, measured at %v or later", v.Value, v.UpdatedAt, first.UpdatedAt)
	}
	failures := func() float64 {
		return testsupport.MetricValue(t, reg, "kvgate_cache_pod_scrape_failures_total", map[string]string{"pod": "ns/p"})
	}
	if n := failures(); n < 1 {
		t.Fatalf("scrape failures = %v, want at least 1", n)
	}
	checkOnlyFailureReason(t, reg, "ns/p", readStatus)
	n0 := failures()
	testsupport.Eventually(t, "two more failed scrapes", func() bool { return failures() >= n0+2 })
	if again, err := s.GetMetricValueByPod(pkey("ns", "p"), NumRequestsRunning); err != nil || again != v {
		t.Fatalf("after more failed scrapes: %+v, %v; want %+v as it was", again, err, v)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_stale_pods", nil); n != 1 {
		t.Fatalf("stale pods = %v, want 1", n)
	}

	e.serve(t, "vllm_v1_t1.txt")
	e.mode.Store(serveOK)
	waitMetric(t, s, "p", NumRequestsRunning, equals(6))
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_stale_pods", nil); n != 0 {
		t.Fatalf("stale pods after recovery = %v, want 0", n)
	}
}

func TestHangingPodTimesOutWithoutDelayingOthers(t *testing.T) {
	hanging, healthy := newEngine(t, "vllm_v1_t0.txt"), newEngine(t, "vllm_v1_t0.txt")
	cfg := scrapeConfig(nil)
	cfg.PodMetricScrapeTimeout = 2 * time.Second
	s := newTestStore(t, cfg)
	s.AddOrUpdatePod(hanging.pod("hanging", llama))
	s.AddOrUpdatePod(healthy.pod("healthy", llama))
	waitMetric(t, s, "hanging", NumRequestsRunning, equals(4))
	waitMetric(t, s, "healthy", NumRequestsRunning, equals(4))

	hanging.mode.Store(serveHang)
	healthy.serve(t, "vllm_v1_t1.txt")
	start := time.Now()
	waitMetric(t, s, "healthy", NumRequestsRunning, equals(6))
	if d := time.Since(start); d >= cfg.PodMetricScrapeTimeout {
		t.Fatalf("healthy pod refreshed after %v, not before the hanging pod's %v timeout", d, cfg.PodMetricScrapeTimeout)
	}
	v := waitMetric(t, s, "hanging", NumRequestsRunning, func(v MetricValue) bool { return v.Stale })
	if time.Since(start) < cfg.PodMetricScrapeTimeout-100*time.Millisecond {
		t.Fatalf("hanging pod marked stale after %v, before its timeout", time.Since(start))
	}
	if v.Value != 4 {
		t.Fatalf("hanging pod's stale value = %v, want 4", v.Value)
	}
}

func TestScrapesFollowAnEngineRestart(t *testing.T) {
	e := newEngine(t, "vllm_v1_t1.txt")
	cfg := scrapeConfig(nil)
	cfg.RecentMetricsWindow = time.Minute // deltas against the oldest scrape in the last minute
	s := newTestStore(t, cfg)
	s.AddOrUpdatePod(e.pod("p", llama))
	waitMetric(t, s, "p", NumRequestsRunning, equals(6))

	e.serve(t, "vllm_v1_t2_restarted.txt")
	waitMetric(t, s, "p", NumRequestsRunning, equals(1))
	if v, _ := s.GetMetricValueByPod(pkey("ns", "p"), PrefixCacheHitRate); v.Value != 0 {
		t.Fatalf("hit rate right after the restart = %v, want 0", v.Value)
	}

	e.serve(t, "vllm_v1_t3.txt")
	waitMetric(t, s, "p", NumRequestsRunning, equals(2))
	if v, _ := s.GetMetricValueByPod(pkey("ns", "p"), PrefixCacheHitRate); v.Value != 0.5 {
		t.Fatalf("hit rate since the restart = %v, want (600-100)/(1300-300) = 0.5", v.Value)
	}
	if v, _ := s.GetMetricValueByPod(pkey("ns", "p"), AvgTTFTSeconds); v.Value != 0.4 {
		t.Fatalf("TTFT since the restart = %v, want (4.5-0.5)/(12-2) = 0.4", v.Value)
	}
}

func TestMetricPortLabelChoosesTheScrapedPort(t *testing.T) {
	e := newEngine(t, "vllm_v1_t0.txt")
	s := newTestStore(t, scrapeConfig(nil))
	// The serving port is closed; /metrics lives on the metric port.
	s.AddOrUpdatePod(testPod("ns", "p", llama, "127.0.0.1", withPort(1), withLabel(endpoint.MetricPortLabel, strconv.Itoa(e.port))))
	waitMetric(t, s, "p", NumRequestsRunning, equals(4))
}

func TestUnreadyOrDeletedPodIsNoLongerScraped(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEngine(t, "vllm_v1_t0.txt")
	s := newTestStore(t, scrapeConfig(reg))
	s.AddOrUpdatePod(e.pod("p", llama))
	waitMetric(t, s, "p", NumRequestsRunning, equals(4))

	s.AddOrUpdatePod(e.pod("p", llama, notReady))
	waitMetric(t, s, "p", NumRequestsRunning, func(v MetricValue) bool { return v.Stale && v.Value == 4 })
	testsupport.EventuallyWhy(t, "no scrape targets", func() (string, bool) {
		n := testsupport.MetricValue(t, reg, "kvgate_cache_pod_scrape_targets", nil)
		return "scrape targets " + strconv.FormatFloat(n, 'g', -1, 64), n == 0
	})

	s.AddOrUpdatePod(e.pod("p", llama))
	waitMetric(t, s, "p", NumRequestsRunning, equals(4))
	s.DeletePod(pkey("ns", "p"))
	if _, err := s.GetMetricValueByPod(pkey("ns", "p"), NumRequestsRunning); !errors.Is(err, ErrPodNotFound) {
		t.Fatalf("metric of a deleted pod: %v", err)
	}
}

// A pod often stops being routable before it is deleted: its readiness
// probe fails, or Kubernetes marks it terminating and deletes the object
// after the grace period. Its scrapes stop at the first step; its failure
// series go at the second.
func TestFailureSeriesGoWhenAPodIsDeletedAfterItStoppedBeingRoutable(t *testing.T) {
	tests := []struct {
		name       string
		unroutable podOpt
	}{
		{"unready", notReady},
		{"terminating", func(p *v1.Pod) {
			now := metav1.Now()
			p.DeletionTimestamp = &now
		}},
	}
	families := []string{"kvgate_cache_pod_scrape_failures_total", "kvgate_cache_pod_model_list_failures_total"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			e := newEngine(t, "vllm_v1_t0.txt")
			e.mode.Store(serveError) // and /v1/models is not found
			cfg := scrapeConfig(reg)
			cfg.AdapterRefreshInterval = 20 * time.Millisecond
			s := newTestStore(t, cfg)
			pod := map[string]string{"pod": "ns/p"}
			s.AddOrUpdatePod(e.pod("p", llama))
			for _, name := range families {
				testsupport.Eventually(t, name+" of ns/p", func() bool { return testsupport.MetricSeries(t, reg, name, pod) > 0 })
			}

			s.AddOrUpdatePod(e.pod("p", llama, tt.unroutable))
			testsupport.Eventually(t, "no scrape targets", func() bool {
				return testsupport.MetricValue(t, reg, "kvgate_cache_pod_scrape_targets", nil) == 0
			})
			for _, name := range families {
				if testsupport.MetricSeries(t, reg, name, pod) == 0 {
					t.Fatalf("%s of ns/p dropped while the pod is still registered", name)
				}
			}

			s.DeletePod(pkey("ns", "p"))
			testsupport.EventuallyWhy(t, "the deleted pod's failure series to go", func() (string, bool) {
				var left []string
				for _, name := range families {
					if testsupport.MetricSeries(t, reg, name, pod) > 0 {
						left = append(left, name)
					}
				}
				return "left: " + strings.Join(left, ", "), len(left) == 0
			})
		})
	}
}

type subscriber []string

func (s subscriber) SubscribedMetrics() []string { return s }

func TestSubscribedFamiliesAreKept(t *testing.T) {
	e := newEngine(t, "vllm_v1_two_models.txt")
	s := newTestStore(t, scrapeConfig(nil))
	s.AddOrUpdatePod(e.pod("p", "qwen2.5-7b"))
	waitMetric(t, s, "p", NumRequestsRunning, equals(8))
	if _, err := s.GetMetricValueByPod(pkey("ns", "p"), "vllm:generation_tokens_total"); !errors.Is(err, ErrMetricNotFound) {
		t.Fatalf("unsubscribed family: %v", err)
	}
	s.AddSubscriber(subscriber{"vllm:generation_tokens_total", NumRequestsRunning})
	waitMetric(t, s, "p", "vllm:generation_tokens_total", equals(1000))
	v, err := s.GetMetricValueByPodModel(pkey("ns", "p"), "qwen2.5-7b", "vllm:generation_tokens_total")
	if err != nil || v.Value != 500 {
		t.Fatalf("subscribed family for one model = %s, want 500", describe(v, err))
	}
}

func TestPodModelMetricsFollowModelNameLabel(t *testing.T) {
	multi, single := newEngine(t, "vllm_v1_two_models.txt"), newEngine(t, "vllm_v1_t0.txt")
	s := newTestStore(t, scrapeConfig(nil))
	s.AddOrUpdatePod(multi.pod("multi", "qwen2.5-7b"))
	if err := s.SetPodAdapters(pkey("ns", "multi"), []string{"llama-3-8b"}); err != nil {
		t.Fatal(err)
	}
	s.AddOrUpdatePod(single.pod("single", llama))
	if err := s.SetPodAdapters(pkey("ns", "single"), []string{"sql-lora"}); err != nil {
		t.Fatal(err)
	}
	// The first scrape may come before the adapter is set: llama-3-8b's
	// series are broken down from the first scrape after.
	waitModelMetric(t, s, "multi", "llama-3-8b", NumRequestsRunning, equals(1))
	waitMetric(t, s, "single", NumRequestsRunning, equals(4))

	tests := []struct {
		pod, model string
		want       float64
		wantErr    error
	}{
		{"multi", "qwen2.5-7b", 7, nil},
		{"multi", "llama-3-8b", 1, nil},
		{"multi", "unserved", 0, ErrMetricNotFound},
		{"single", llama, 4, nil},
		// vLLM counts an adapter's requests under the base model: with one
		// model in the exposition, the pod's values stand for its adapters.
		{"single", "sql-lora", 4, nil},
		{"missing", llama, 0, ErrPodNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.pod+"/"+tt.model, func(t *testing.T) {
			v, err := s.GetMetricValueByPodModel(pkey("ns", tt.pod), tt.model, NumRequestsRunning)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || v.Value != tt.want {
				t.Fatalf("got %s, want %v", describe(v, err), tt.want)
			}
		})
	}
}

// documentedPageBound is the bound on a /metrics page that docs/metrics.md
// gives.
const documentedPageBound = 4 << 20

func TestPageUpToTheBoundIsReadAndALargerOneFails(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEngine(t, "vllm_v1_t0.txt")
	e.serveBytes(padded(t, "vllm_v1_t1.txt", documentedPageBound))
	cfg := scrapeConfig(reg)
	cfg.PodMetricScrapeTimeout = 10 * time.Second // pages of megabytes on a busy machine
	s := newTestStore(t, cfg)
	s.AddOrUpdatePod(e.pod("p", llama))
	waitMetric(t, s, "p", NumRequestsRunning, equals(6))

	e.serveBytes(padded(t, "vllm_v1_t0.txt", documentedPageBound+1))
	v := waitMetric(t, s, "p", NumRequestsRunning, func(v MetricValue) bool { return v.Stale })
	if v.Value != 6 {
		t.Fatalf("stale value %v, want the last page's 6, not the oversized one's 4", v.Value)
	}
	checkOnlyFailureReason(t, reg, "ns/p", readTooLarge)
}

func TestScrapeFailuresAreCountedByReason(t *testing.T) {
	tests := []struct {
		reason string
		engine func(t *testing.T, e *fakeEngine)
	}{
		{readStatus, func(_ *testing.T, e *fakeEngine) { e.mode.Store(serveError) }},
		{readTimeout, func(_ *testing.T, e *fakeEngine) { e.mode.Store(serveHang) }},
		{readTooLarge, func(t *testing.T, e *fakeEngine) { e.serveBytes(padded(t, "vllm_v1_t0.txt", maxScrapeBytes+1)) }},
		{readBadBody, func(_ *testing.T, e *fakeEngine) { e.serveBytes([]byte("vllm:num_requests_running{engine=\"0\" 4\n")) }},
		{readConnection, func(_ *testing.T, e *fakeEngine) { e.srv.Close() }},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			e := newEngine(t, "vllm_v1_t0.txt")
			tt.engine(t, e)
			cfg := scrapeConfig(reg)
			if tt.reason != readTimeout {
				cfg.PodMetricScrapeTimeout = 10 * time.Second
			}
			s := newTestStore(t, cfg)
			s.AddOrUpdatePod(e.pod("p", llama))
			testsupport.EventuallyWhy(t, "a failed scrape of ns/p", func() (string, bool) {
				all := testsupport.MetricValue(t, reg, "kvgate_cache_pod_scrape_failures_total", map[string]string{"pod": "ns/p"})
				return "failures " + strconv.FormatFloat(all, 'g', -1, 64), all >= 1
			})
			checkOnlyFailureReason(t, reg, "ns/p", tt.reason)
		})
	}
}

// checkOnlyFailureReason fails t unless the scrapes of pod failed, all of
// them for reason.
func checkOnlyFailureReason(t *testing.T, reg prometheus.Gatherer, pod, reason string) {
	t.Helper()
	const name = "kvgate_cache_pod_scrape_failures_total"
	if n := testsupport.MetricSeries(t, reg, name, map[string]string{"pod": pod}); n != 1 {
		var seen []string
		for _, r := range []string{readStatus, readTimeout, readConnection, readTooLarge, readBadBody} {
			if v := testsupport.MetricValue(t, reg, name, map[string]string{"pod": pod, "reason": r}); v > 0 {
				seen = append(seen, fmt.Sprintf("%s %v", r, v))
			}
		}
		t.Fatalf("scrapes of %s failed for %s, want %s only", pod, strings.Join(seen, ", "), reason)
	}
	if n := testsupport.MetricValue(t, reg, name, map[string]string{"pod": pod, "reason": reason}); n < 1 {
		t.Fatalf("scrape failures of %s with reason %s = %v, want at least 1", pod, reason, n)
	}
}

// newTestScrapeLoop returns the scrape loop the Store would run for the pod
// of engine e, for tests that look inside it.
func newTestScrapeLoop(t *testing.T, e *fakeEngine) *scrapeLoop {
	t.Helper()
	m, err := newStoreMetrics(nil, storeGauges{})
	if err != nil {
		t.Fatal(err)
	}
	ep := epOf(e.pod("p", llama))
	return &scrapeLoop{
		podLabel: ep.ID, state: newPodState(ep.ID),
		page:     newPageClient(metricsHost(ep), metricsPath, metricsAccept, 10*time.Second, maxScrapeBytes),
		interval: time.Hour, metrics: m,
		selection: func() *metricSelection { return newMetricSelection(map[string]struct{}{}) },
		served:    func() []string { return []string{llama} }, model: llama,
		proj: newProjector(time.Nanosecond, time.Nanosecond), pages: newPageMemo(),
		failures: failureLog{log: klog.Background(), pod: klog.KObj(ep.Pod), url: metricsURL(ep), what: "Pod metrics scrape"},
	}
}

// scrapeChecking returns a function that scrapes with l, then fails t
// unless the pod's metrics count wantRunning requests running, stale or
// not as wantStale says.
func scrapeChecking(t *testing.T, l *scrapeLoop) func(wantRunning float64, wantStale bool) {
	return func(wantRunning float64, wantStale bool) {
		t.Helper()
		l.scrapeOnce(t.Context())
		m := l.state.metrics.Load()
		if m == nil || m.stale != wantStale || m.pod[NumRequestsRunning].Value != wantRunning {
			t.Fatalf("after the scrape: %+v, want %v running, stale %v", m, wantRunning, wantStale)
		}
	}
}

func TestGzipEncodedPagesAreInflatedWithinTheBound(t *testing.T) {
	e := newEngine(t, "vllm_v1_t0.txt")
	e.encoding.Store(encodeGzip)
	l := newTestScrapeLoop(t, e)
	scrape := scrapeChecking(t, l)
	for _, page := range []struct {
		file    string
		running float64
	}{{"vllm_v1_t0.txt", 4}, {"vllm_v1_t1.txt", 6}, {"vllm_v1_t0.txt", 4}} {
		e.serve(t, page.file)
		scrape(page.running, false)
	}
	// Some kilobytes that inflate past the bound fail the scrape.
	e.serveBytes(padded(t, "vllm_v1_t1.txt", maxScrapeBytes+1))
	scrape(4, true)
	// So does a body said to be gzip that is not, and the next page reads.
	e.encoding.Store(encodeFalseGzip)
	e.serve(t, "vllm_v1_t1.txt")
	scrape(4, true)
	e.encoding.Store(encodeGzip)
	scrape(6, false)
	var failed dto.Metric
	if err := l.metrics.scrapeFailures.WithLabelValues(l.podLabel, readTooLarge).Write(&failed); err != nil {
		t.Fatal(err)
	}
	if n := failed.GetCounter().GetValue(); n != 1 {
		t.Fatalf("%v scrapes failed as too large, want 1", n)
	}
}

func TestBuffersALargePageGrewAreReleased(t *testing.T) {
	e := newEngine(t, "vllm_v1_t0.txt")
	l := newTestScrapeLoop(t, e)
	scrape := scrapeChecking(t, l)
	scrape(4, false)
	if l.body.Cap() == 0 || l.filtered.Cap() == 0 {
		t.Fatalf("buffers of a small page released: %d and %d bytes kept, want them kept for the next scrape",
			l.body.Cap(), l.filtered.Cap())
	}

	// A page of 3 MiB whose every line the Store reads: the body, the
	// lines kept and the parser's token all grow to megabytes.
	page := append(readExposition(t, "vllm_v1_t1.txt"),
		`vllm:num_requests_running{engine="1",pad="`+strings.Repeat("x", 3<<20)+`"} 1`+"\n"...)
	e.serveBytes(page)
	scrape(7, false)
	if l.body.Cap() > 1<<20 || l.filtered.Cap() > 1<<20 {
		t.Fatalf("after a 3 MiB page the loop keeps buffers of %d and %d bytes, want at most 1 MiB each",
			l.body.Cap(), l.filtered.Cap())
	}

	// A page beyond the bound fails, and leaves no more behind.
	e.serveBytes(padded(t, "vllm_v1_t0.txt", maxScrapeBytes+1))
	scrape(7, true)
	if l.body.Cap() > 1<<20 {
		t.Fatalf("after an oversized page the loop keeps a buffer of %d bytes, want at most 1 MiB", l.body.Cap())
	}
}

func TestSeriesOfModelsThePodDoesNotServeAreCountedNotBrokenDown(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEngine(t, "vllm_v1_two_models.txt")
	e.serveBytes(pageWithMadeUpModels(t, "vllm_v1_two_models.txt", 100))
	var logs testsupport.LogLines
	cfg := scrapeConfig(reg)
	cfg.Logger = funcr.New(logs.Add, funcr.Options{})
	s := newTestStore(t, cfg)
	s.AddOrUpdatePod(e.pod("p", "qwen2.5-7b"))
	waitMetric(t, s, "p", NumRequestsWaiting, equals(3+100))
	waitModelMetric(t, s, "p", "qwen2.5-7b", NumRequestsWaiting, equals(3))
	dropped := func() float64 {
		return testsupport.MetricValue(t, reg, "kvgate_cache_pod_metric_series_dropped_total",
			map[string]string{"pod": "ns/p", "reason": dropUnservedModel})
	}
	testsupport.EventuallyWhy(t, "three scrapes' unserved series counted", func() (string, bool) {
		n := dropped()
		return "dropped " + strconv.FormatFloat(n, 'g', -1, 64), n >= 3*2*100
	})
	if logged := logs.Containing("series of models it does not serve"); len(logged) != 1 ||
		!strings.Contains(logged[0], `"pod"={"name"="p" "namespace"="ns"}`) || !strings.Contains(logged[0], `"model"="qwen2.5-7b"`) {
		t.Fatalf("after three scrapes logged %q, want one line naming the pod and its model", logged)
	}
	if _, err := s.GetMetricValueByPodModel(pkey("ns", "p"), "llama-3-8b", NumRequestsRunning); !errors.Is(err, ErrMetricNotFound) {
		t.Fatalf("metric of a model the pod does not serve: %v", err)
	}

	// A model the pod comes to serve is broken down from its next scrape.
	if err := s.SetPodAdapters(pkey("ns", "p"), []string{"llama-3-8b"}); err != nil {
		t.Fatal(err)
	}
	waitModelMetric(t, s, "p", "llama-3-8b", NumRequestsRunning, equals(1))

	s.DeletePod(pkey("ns", "p"))
	testsupport.Eventually(t, "the deleted pod's dropped series to leave the metrics", func() bool {
		return testsupport.MetricSeries(t, reg, "kvgate_cache_pod_metric_series_dropped_total", map[string]string{"pod": "ns/p"}) == 0
	})
}

func TestClipForLogBoundsNamesAPodSent(t *testing.T) {
	if got := clipForLog("sql-lora"); got != "sql-lora" {
		t.Fatalf("short name clipped to %q", got)
	}
	long := strings.Repeat("€", 1000) // three bytes each: the cut falls inside one
	got := clipForLog(long)
	if body, ok := strings.CutSuffix(got, "…"); !ok || len(body) > maxLoggedNameBytes || !strings.HasPrefix(long, body) ||
		!utf8.ValidString(got) {
		t.Fatalf("a name of %d bytes clipped to %q (%d bytes), want a valid prefix of at most %d bytes and a mark",
			len(long), got, len(got), maxLoggedNameBytes)
	}
}
