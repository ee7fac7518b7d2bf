package simserver

import (
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches /metrics and parses it with Prometheus' text parser.
func (ts *testServer) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(ts.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || expfmt.ResponseFormat(resp.Header).FormatType() != expfmt.TypeTextPlain {
		t.Fatalf("/metrics status %d content type %q", resp.StatusCode, ct)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return families
}

// metricValue returns the value of the series of family name whose labels
// include want, failing the test when there is none.
func metricValue(t *testing.T, families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f, ok := families[name]
	if !ok {
		t.Fatalf("no metric family %s", name)
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no series of %s with labels %v", name, want)
	return 0
}

func TestMetricsUseVLLMNamesAndLabels(t *testing.T) {
	ts := startServer(t, 2, nil)
	req := map[string]any{"prompt": "measure the prefix cache of this prompt twice", "max_tokens": 3}
	ts.post(t, "/v1/completions", req)
	ts.post(t, "/v1/completions", req)
	families := ts.scrape(t)

	// Both requests went to rank 0: it was idle each time, and ties go to
	// the lowest rank.
	r0 := map[string]string{"model_name": testModel, "engine": "0"}
	if v := metricValue(t, families, "vllm:request_success_total", map[string]string{"engine": "0", "finished_reason": "length"}); v != 2 {
		t.Errorf("request_success_total{length} = %v, want 2", v)
	}
	queries := metricValue(t, families, "vllm:prefix_cache_queries_total", r0)
	hits := metricValue(t, families, "vllm:prefix_cache_hits_total", r0)
	if queries == 0 || hits == 0 || hits >= queries/2 {
		t.Errorf("prefix cache queries %v hits %v: want the second request's full blocks as hits", queries, hits)
	}
	if v := metricValue(t, families, "vllm:generation_tokens_total", r0); v != 6 {
		t.Errorf("generation_tokens_total %v, want 6", v)
	}
	if v := metricValue(t, families, "vllm:prompt_tokens_total", r0); v != queries {
		t.Errorf("prompt_tokens_total %v, want %v", v, queries)
	}
	for name, want := range map[string]float64{
		"vllm:time_to_first_token_seconds":   2,
		"vllm:inter_token_latency_seconds":   4,
		"vllm:time_per_output_token_seconds": 4,
		"vllm:e2e_request_latency_seconds":   2,
		"vllm:request_queue_time_seconds":    2,
		"vllm:request_prefill_time_seconds":  2,
	} {
		if got := metricValue(t, families, name, r0); got != want {
			t.Errorf("%s has %v observations, want %v", name, got, want)
		}
	}
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} {
		if v := metricValue(t, families, name, map[string]string{"model_name": testModel, "engine": "1"}); v != 0 {
			t.Errorf("%s of the idle rank 1 = %v", name, v)
		}
	}
	info := map[string]string{"engine": "1", "block_size": "4", "num_gpu_blocks": "256", "enable_prefix_caching": "True"}
	if v := metricValue(t, families, "vllm:cache_config_info", info); v != 1 {
		t.Errorf("cache_config_info = %v, want 1", v)
	}
}

func TestMetricsRegisterOnTheGivenRegistryOnly(t *testing.T) {
	ts := startServer(t, 1, nil)
	if _, err := New(Config{Model: testModel, Ranks: []Rank{{}}, Registry: ts.registry}); err == nil {
		t.Error("a second server registered the same metrics on one registry")
	}
	if _, err := New(Config{Model: testModel, Ranks: []Rank{{}}}); err != nil {
		t.Errorf("a server with its own registry: %v", err)
	}
}
