package cache

import (
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// latencyPage returns a vLLM page of one model's prompt tokens, prefill
// time and time to first token.
func latencyPage(t *testing.T, prompt, prefillSum, prefillCount, ttftSum, ttftCount float64) map[string]*dto.MetricFamily {
	t.Helper()
	page := fmt.Sprintf(`# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} %g
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="m"} 0
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_sum{model_name="m"} %g
vllm:request_prefill_time_seconds_count{model_name="m"} %g
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{model_name="m"} %g
vllm:time_to_first_token_seconds_count{model_name="m"} %g
`, prompt, prefillSum, prefillCount, ttftSum, ttftCount)
	parser := newTextParser()
	fams, err := parser.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// A page whose counters no engine writes (a prompt-token counter jumping
// to 1e300, a TTFT count of 2^62) publishes no prefill speed or mean
// latency from them: the pod would look idle or infinitely fast. A mean
// latency that was never taken cannot outlive the page either.
func TestImplausibleSpeedsAndLatenciesAreNotPublished(t *testing.T) {
	p := newProjector(time.Minute, time.Minute)
	t0 := time.Unix(1000, 0)
	p.project(t0, latencyPage(t, 1000, 1, 10, 5, 10), nil, []string{"m"})
	m, _ := p.project(t0.Add(5*time.Second), latencyPage(t, 1e300, 2, 20, 10, 1<<62), nil, []string{"m"})
	if v := m.builtin.PrefillTokensPerSecond; m.builtin.Measured&HasPrefillSpeed != 0 && v > MaxPrefillTokensPerSecond {
		t.Errorf("prefill speed %g tokens/s published", v)
	}
	if v := m.builtin.AvgTTFTSeconds; m.builtin.Measured&HasAvgTTFT != 0 && v < minMeanLatency {
		t.Errorf("mean TTFT %g s published", v)
	}
	for i := 2; i < 30; i++ { // an idle engine: no new observations
		m, _ = p.project(t0.Add(time.Duration(5*i)*time.Second), latencyPage(t, 2000, 2, 20, 10, 20), nil, []string{"m"})
	}
	if v := m.builtin.AvgTTFTSeconds; v < minMeanLatency {
		t.Errorf("mean TTFT %g s two minutes after the page", v)
	}
}

func TestPrefillSpeedsBeyondTheBoundsAreNotMeasured(t *testing.T) {
	for _, tokens := range []float64{1e-290, 1e300} {
		s := PrefillSample{ComputedTokens: tokens, PrefillSeconds: 10, Prefills: 5}
		if v, ok := s.TokensPerSecond(); ok {
			t.Errorf("%g tokens in 10 s: measured %g tokens/s", tokens, v)
		}
	}
	if v, ok := (PrefillSample{ComputedTokens: 1e5, PrefillSeconds: 10, Prefills: 5}).TokensPerSecond(); !ok || v != 1e4 {
		t.Errorf("1e5 tokens in 10 s: %g tokens/s, %v; want 10000", v, ok)
	}
}
