package cache

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

const llama = "meta-llama/Llama-3.1-8B-Instruct"

func readExposition(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "metrics", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parseExposition(t testing.TB, name string) map[string]*dto.MetricFamily {
	t.Helper()
	p := newTextParser()
	f, err := os.Open(filepath.Join("testdata", "metrics", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	families, err := p.TextToMetricFamilies(f)
	if err != nil {
		t.Fatalf("parse %s: %v", name, err)
	}
	return families
}

// want maps metric names to expected values; NaN means "absent".
type want map[string]float64

func checkValues(t *testing.T, what string, got map[string]MetricValue, w want) {
	t.Helper()
	for name, v := range w {
		g, ok := got[name]
		switch {
		case math.IsNaN(v) && ok:
			t.Errorf("%s: %s = %v, want absent", what, name, g.Value)
		case math.IsNaN(v):
		case !ok:
			t.Errorf("%s: %s absent, want %v", what, name, v)
		case math.Abs(g.Value-v) > 1e-9*math.Max(1, math.Abs(v)):
			t.Errorf("%s: %s = %v, want %v", what, name, g.Value, v)
		}
	}
}

func TestProjectCurrentVLLMExposition(t *testing.T) {
	p := newProjector(time.Nanosecond, time.Nanosecond)
	m, _ := p.project(time.Unix(100, 0), parseExposition(t, "vllm_v1_t0.txt"), nil, []string{llama})
	w := want{
		NumRequestsRunning:   4,
		NumRequestsWaiting:   1,
		KVCacheUsagePerc:     0.42,
		PrefixCacheHitRate:   0, // first scrape: no delta yet
		AvgTTFTSeconds:       0.2,
		AvgTPOTSeconds:       0.02, // inter_token_latency wins over the deprecated time_per_output_token
		AvgE2ELatencySeconds: 3,
		// 16,000 tokens computed in 8 s of prefill, less 50 steps of 20 ms.
		PrefillTokensPerSecond: (20000 - 4000) / (8 - 50*0.02),
		CacheBlockSize:         16,
		CacheNumGPUBlocks:      27000,
	}
	checkValues(t, "pod", m.pod, w)
	checkValues(t, "model", m.models[llama], w)
	if len(m.models) != 1 {
		t.Errorf("models = %v, want only %s", len(m.models), llama)
	}
	if got := m.pod[NumRequestsRunning].UpdatedAt; !got.Equal(time.Unix(100, 0)) {
		t.Errorf("UpdatedAt = %v, want the scrape time", got)
	}
}

func TestProjectRecentValuesAcrossScrapesAndRestart(t *testing.T) {
	// Each scrape against the previous one; a prefill speed is kept for a
	// minute after the window that measured it.
	p := newProjector(time.Nanosecond, time.Nanosecond)
	p.prefillKeep = time.Minute
	steps := []struct {
		file string
		want want
	}{
		{"vllm_v1_t0.txt", want{PrefixCacheHitRate: 0, AvgTTFTSeconds: 0.2, AvgTPOTSeconds: 0.02, AvgE2ELatencySeconds: 3, PrefillTokensPerSecond: 16000 / (8 - 50*0.02)}},
		{"vllm_v1_t1.txt", want{PrefixCacheHitRate: 1500.0 / 2000, AvgTTFTSeconds: 0.3, AvgTPOTSeconds: 0.03, AvgE2ELatencySeconds: 4,
			PrefillTokensPerSecond: (4000 - 1500) / (1 - 10*0.03)}},
		// The engine restarted: the counters went down. The hit rate restarts
		// at 0 and the means keep their last values.
		{"vllm_v1_t2_restarted.txt", want{PrefixCacheHitRate: 0, AvgTTFTSeconds: 0.3, AvgTPOTSeconds: 0.03, AvgE2ELatencySeconds: 4,
			PrefillTokensPerSecond: 2500 / (1 - 10*0.03), NumRequestsRunning: 1}},
		{"vllm_v1_t3.txt", want{PrefixCacheHitRate: 500.0 / 1000, AvgTTFTSeconds: 0.4, AvgTPOTSeconds: 0.04, AvgE2ELatencySeconds: 2,
			PrefillTokensPerSecond: (3000 - 500) / (2 - 10*0.04)}},
	}
	for i, st := range steps {
		m, _ := p.project(time.Unix(100+int64(i), 0), parseExposition(t, st.file), nil, []string{llama})
		checkValues(t, st.file, m.pod, st.want)
		checkValues(t, st.file+" model", m.models[llama], st.want)
	}
}

func TestProjectOldVLLMFallsBackToGPUCacheAndTTFT(t *testing.T) {
	p := newProjector(time.Nanosecond, time.Nanosecond)
	m, _ := p.project(time.Unix(100, 0), parseExposition(t, "vllm_v0_gpu_cache.txt"), nil, []string{llama})
	checkValues(t, "pod", m.pod, want{
		KVCacheUsagePerc:       0.31, // gpu_cache_usage_perc, ahead of cpu_cache_usage_perc
		NumRequestsRunning:     2,
		NumRequestsWaiting:     5,
		PrefixCacheHitRate:     math.NaN(), // V0 has no prefix-cache counters
		AvgTPOTSeconds:         0.03,       // time_per_output_token_seconds
		AvgTTFTSeconds:         0.4,
		AvgE2ELatencySeconds:   4,
		PrefillTokensPerSecond: 9000 / (12 - 30*0.03), // against TTFT: no prefill-time histogram
		CacheBlockSize:         16,
		CacheNumGPUBlocks:      7221,
	})
}

func TestProjectSumsDataParallelEngines(t *testing.T) {
	p := newProjector(time.Nanosecond, time.Nanosecond)
	m, _ := p.project(time.Unix(100, 0), parseExposition(t, "vllm_v1_dp2.txt"), nil, []string{llama})
	w := want{
		NumRequestsRunning:     7,
		NumRequestsWaiting:     3,
		KVCacheUsagePerc:       (0.42 + 0.2) / 2,
		CacheNumGPUBlocks:      27000 + 25000,
		CacheBlockSize:         16,
		AvgTTFTSeconds:         16.0 / 70,
		PrefillTokensPerSecond: (28000 - 5000) / (12 - 70*160.0/7000),
	}
	checkValues(t, "pod", m.pod, w)
	checkValues(t, "model", m.models[llama], w)
}

func TestProjectSplitsSeriesByModelName(t *testing.T) {
	p := newProjector(time.Nanosecond, time.Nanosecond)
	m, _ := p.project(time.Unix(100, 0), parseExposition(t, "vllm_v1_two_models.txt"), nil, []string{"qwen2.5-7b", "llama-3-8b"})
	checkValues(t, "pod", m.pod, want{NumRequestsRunning: 8, NumRequestsWaiting: 3, KVCacheUsagePerc: 0.4, AvgTTFTSeconds: 6.0 / 20})
	checkValues(t, "qwen", m.models["qwen2.5-7b"], want{NumRequestsRunning: 7, NumRequestsWaiting: 3, KVCacheUsagePerc: 0.7, AvgTTFTSeconds: 0.1})
	checkValues(t, "llama", m.models["llama-3-8b"], want{NumRequestsRunning: 1, NumRequestsWaiting: 0, KVCacheUsagePerc: 0.1, AvgTTFTSeconds: 0.5})
}

// pageWithMadeUpModels returns the exposition in testdata file, which has
// the two families below, with n more series of each, each labelled with a
// model_name of its own.
func pageWithMadeUpModels(t testing.TB, file string, n int) []byte {
	t.Helper()
	b := readExposition(t, file)
	for i := range n {
		b = fmt.Appendf(b, "vllm:num_requests_waiting{engine=\"0\",model_name=\"made-up-%d\"} 1\n", i)
	}
	for i := range n {
		b = fmt.Appendf(b, "vllm:prompt_tokens_total{engine=\"0\",model_name=\"made-up-%d\"} %d\n", i, i)
	}
	return b
}

func TestProjectBreaksDownOnlyTheModelsThePodServes(t *testing.T) {
	served := []string{"qwen2.5-7b", "not-on-the-page"}
	// Without made-up models, the series of llama-3-8b are the pod's but
	// not of a model it serves.
	_, base := newProjector(time.Nanosecond, time.Nanosecond).project(time.Unix(100, 0),
		parseExposition(t, "vllm_v1_two_models.txt"), nil, served)

	page := pageWithMadeUpModels(t, "vllm_v1_two_models.txt", 1000)
	p := newProjector(time.Nanosecond, time.Nanosecond)
	for i := range 3 {
		parser := newTextParser()
		families, err := parser.TextToMetricFamilies(bytes.NewReader(page))
		if err != nil {
			t.Fatal(err)
		}
		m, dropped := p.project(time.Unix(100+int64(i), 0), families, nil, served)
		checkValues(t, "pod", m.pod, want{NumRequestsRunning: 8, NumRequestsWaiting: 3 + 1000})
		checkValues(t, "qwen", m.models["qwen2.5-7b"], want{NumRequestsRunning: 7, NumRequestsWaiting: 3, KVCacheUsagePerc: 0.7})
		if len(m.models) != 1 || !m.split {
			t.Fatalf("scrape %d: %d models broken down, split %v; want qwen2.5-7b only, and the page split", i, len(m.models), m.split)
		}
		if len(p.groups) != 2 {
			t.Fatalf("scrape %d: the projector remembers %d groups, want the pod and qwen2.5-7b", i, len(p.groups))
		}
		if base.unserved == 0 || base.example != "llama-3-8b" {
			t.Fatalf("unserved series of the two-model page: %d, %q first; want those of llama-3-8b", base.unserved, base.example)
		}
		if dropped.unserved != base.unserved+2*1000 {
			t.Fatalf("scrape %d: %d unserved series, want %d: llama-3-8b's and two of each made-up model", i, dropped.unserved,
				base.unserved+2*1000)
		}
	}
}

func TestProjectKeepsSubscribedFamilies(t *testing.T) {
	p := newProjector(time.Nanosecond, time.Nanosecond)
	subscribed := map[string]struct{}{
		"vllm:generation_tokens_total":     {},
		"vllm:request_queue_time_seconds":  {},
		"vllm:not_exposed_by_this_engine":  {},
		NumRequestsRunning /* built in */ : {},
	}
	m, _ := p.project(time.Unix(100, 0), parseExposition(t, "vllm_v1_dp2.txt"), subscribed, []string{llama})
	checkValues(t, "pod", m.pod, want{
		"vllm:generation_tokens_total":    20000/4 + 8000/4,
		"vllm:not_exposed_by_this_engine": math.NaN(),
	})
	h := m.pod["vllm:request_queue_time_seconds"].Histogram
	if h == nil {
		t.Fatal("histogram family kept without its histogram")
	}
	if h.Count != 70 || math.Abs(h.Sum-(150+80)*0.05) > 1e-9 {
		t.Errorf("histogram count %v sum %v, want 70 and %v", h.Count, h.Sum, (150+80)*0.05)
	}
	if len(h.Buckets) != 21 || h.Buckets[0].UpperBound != 0.3 || h.Buckets[20].UpperBound != 7680 {
		t.Fatalf("buckets = %+v, want the 21 finite bounds of vLLM's request-time buckets", h.Buckets)
	}
	for i := 1; i < len(h.Buckets); i++ {
		if h.Buckets[i].CumulativeCount < h.Buckets[i-1].CumulativeCount {
			t.Fatalf("bucket %d count %v below previous %v", i, h.Buckets[i].CumulativeCount, h.Buckets[i-1].CumulativeCount)
		}
	}
}

func TestRecentWindowSlidesOverTheWindow(t *testing.T) {
	w := recentWindow{length: 10 * time.Second}
	at := func(s float64) time.Time { return time.Unix(0, int64(s*float64(time.Second))) }
	cnt := func(v float64) counters {
		var c counters
		c.add(cPrefixQueries, v)
		return c
	}
	// The counter grows by 1 per second; scrapes every 0.5 s.
	var last counters
	for s := 0.0; s <= 30; s += 0.5 {
		last = w.observe(at(s), cnt(s))
		if d, _ := last.get(cPrefixQueries); s >= 12 && (d < 10 || d > 10+10.0/windowSteps+0.5) {
			t.Fatalf("at %vs the delta is %v, want the last 10s to 11.75s", s, d)
		}
	}
	if len(w.samples) > windowSteps+2 {
		t.Fatalf("window keeps %d samples, want at most %d", len(w.samples), windowSteps+2)
	}
	// A counter that goes down resets the baseline.
	if d, _ := w.observe(at(31), cnt(3)).get(cPrefixQueries); d != 0 {
		t.Fatalf("delta after a reset = %v, want 0", d)
	}
	if d, _ := w.observe(at(32), cnt(5)).get(cPrefixQueries); d != 2 {
		t.Fatalf("delta after the reset = %v, want 2", d)
	}
}

// BenchmarkScrapeDecodeAndProject measures what a scrape costs once the
// body has arrived: filtering, parsing and deriving the pod's metrics.
func BenchmarkScrapeDecodeAndProject(b *testing.B) { benchScrape(b, "vllm_v1_dp2.txt") }

// BenchmarkScrapeDecodeAndProjectOneEngine is the same for a page of one
// engine core, whose series carry one engine label value.
func BenchmarkScrapeDecodeAndProjectOneEngine(b *testing.B) { benchScrape(b, "vllm_v1_t0.txt") }

// benchScrape measures the scrape of the golden page file.
func benchScrape(b *testing.B, file string) {
	body := readExposition(b, file)
	l := &scrapeLoop{proj: newProjector(DefaultRecentMetricsWindow, DefaultPrefillSpeedWindow), pages: newPageMemo()}
	sel := newMetricSelection(nil)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	now := time.Now()
	for i := 0; b.Loop(); i++ {
		families, err := l.decode(body, sel.filter)
		if err != nil {
			b.Fatal(err)
		}
		l.proj.project(now.Add(time.Duration(i)*50*time.Millisecond), families, nil, []string{llama})
	}
}

// BenchmarkScrapeDecodeChangingShape measures a scrape's decoding when
// every page has another shape than the one before (two golden pages in
// turn), as when series come and go at every scrape: the worst case of
// reading only the values of a page like the last.
func BenchmarkScrapeDecodeChangingShape(b *testing.B) {
	bodies := [][]byte{readExposition(b, "vllm_v1_dp2.txt"), readExposition(b, "vllm_v1_t0.txt")}
	l := &scrapeLoop{pages: newPageMemo()}
	sel := newMetricSelection(nil)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := l.decode(bodies[i%2], sel.filter); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseWholeExposition is the cost without the line filter, for
// comparison.
func BenchmarkParseWholeExposition(b *testing.B) {
	body := readExposition(b, "vllm_v1_dp2.txt")
	parser := newTextParser()
	r := bytes.NewReader(nil)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(body)
		if _, err := parser.TextToMetricFamilies(r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkProjectOnly(b *testing.B) {
	families := parseExposition(b, "vllm_v1_dp2.txt")
	p := newProjector(DefaultRecentMetricsWindow, DefaultPrefillSpeedWindow)
	b.ReportAllocs()
	now := time.Now()
	for i := 0; b.Loop(); i++ {
		p.project(now.Add(time.Duration(i)*50*time.Millisecond), families, nil, []string{llama})
	}
}

func TestLineFilterKeepsWhatProjectionReads(t *testing.T) {
	files := []string{"vllm_v1_t0.txt", "vllm_v1_dp2.txt", "vllm_v1_two_models.txt", "vllm_v0_gpu_cache.txt"}
	subscribed := map[string]struct{}{"vllm:request_queue_time_seconds": {}, "vllm:generation_tokens_total": {}}
	sel := newMetricSelection(subscribed)
	for _, name := range files {
		t.Run(name, func(t *testing.T) {
			body := readExposition(t, name)
			l := &scrapeLoop{pages: newPageMemo()}
			filtered, err := l.decode(body, sel.filter)
			if err != nil {
				t.Fatal(err)
			}
			if len(l.filtered.Bytes()) >= len(body)/4 {
				t.Errorf("filter kept %d of %d bytes", len(l.filtered.Bytes()), len(body))
			}
			now := time.Unix(100, 0)
			served := []string{llama, "qwen2.5-7b", "llama-3-8b"}
			got, _ := newProjector(time.Second, time.Second).project(now, filtered, subscribed, served)
			wantM, _ := newProjector(time.Second, time.Second).project(now, parseExposition(t, name), subscribed, served)
			if !reflect.DeepEqual(got, wantM) {
				t.Fatalf("projection of the filtered exposition differs:\n got %+v\nwant %+v", got, wantM)
			}
		})
	}
}

func TestLineFilterDropsUnwantedLines(t *testing.T) {
	in := "# HELP vllm:num_requests_running Number of requests.\n" +
		"# TYPE vllm:num_requests_running gauge\n" +
		"vllm:num_requests_running{engine=\"0\"} 3.0\n" +
		"\n" +
		"# TYPE vllm:time_to_first_token_seconds histogram\n" +
		"vllm:time_to_first_token_seconds_bucket{le=\"0.1\"} 1.0\n" +
		"vllm:time_to_first_token_seconds_count 2.0\n" +
		"vllm:time_to_first_token_seconds_sum 0.5\n" +
		"vllm:time_to_first_token_seconds_created 1.7e9\n" +
		"process_open_fds 61.0\n" +
		"vllm:num_requests_waiting 1.0" // no final newline
	want := "# TYPE vllm:num_requests_running gauge\n" +
		"vllm:num_requests_running{engine=\"0\"} 3.0\n" +
		"# TYPE vllm:time_to_first_token_seconds histogram\n" +
		"vllm:time_to_first_token_seconds_count 2.0\n" +
		"vllm:time_to_first_token_seconds_sum 0.5\n" +
		"vllm:num_requests_waiting 1.0\n"
	checkFiltered(t, in, want)
}

// checkFiltered fails t unless the line filter of the built-in families
// keeps want of in.
func checkFiltered(t *testing.T, in, want string) {
	t.Helper()
	var out bytes.Buffer
	newLineFilter(nil).filter(&out, []byte(in))
	if out.String() != want {
		t.Fatalf("filtered:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestLineFilterDecidesEachSampleByItsOwnName(t *testing.T) {
	// Runs of one name, and names that begin with the one before.
	in := "vllm:num_requests_running{engine=\"0\"} 3.0\n" +
		"vllm:num_requests_running{engine=\"1\"} 2.0\n" +
		"vllm:num_requests_running_max{engine=\"1\"} 9.0\n" +
		"vllm:num_requests_running\t4.0\n" +
		"vllm:num_requests_running_max 9.0\n" +
		"vllm:num_requests_waiting 1.0\n" +
		"vllm:num_requests_waiting 2.0\n" +
		"vllm:num_requests_waitingx 2.0\n" +
		"{engine=\"0\"} 1.0\n" +
		"{engine=\"1\"} 1.0\n" +
		"vllm:num_requests_waiting{} 3.0\n"
	want := "vllm:num_requests_running{engine=\"0\"} 3.0\n" +
		"vllm:num_requests_running{engine=\"1\"} 2.0\n" +
		"vllm:num_requests_running\t4.0\n" +
		"vllm:num_requests_waiting 1.0\n" +
		"vllm:num_requests_waiting 2.0\n" +
		"vllm:num_requests_waiting{} 3.0\n"
	checkFiltered(t, in, want)
}
