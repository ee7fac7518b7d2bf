package cache

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

func TestCachedLoadProviderModels(t *testing.T) {
	s := newTestStore(t, nil, noScrape())
	pod := testPod("ns", "p", "m", "10.0.0.1")
	s.AddOrUpdatePod(pod)
	s.reg.entry(pkey("ns", "p")).state.metrics.Store(newProjector(time.Second, time.Second).project(time.Now(), parseExposition(t, "vllm_v1_t0.txt"), nil))
	ctx := routed("r", "m", pod)
	ctx.PromptTokenCount, ctx.PredictedOutputTokens = 1000, 600

	tests := []struct {
		metric            string
		util, consumption float64
	}{
		{NumRequestsRunning, 4, 1},
		{NumRequestsWaiting, 1, 1},
		{RealtimeNumRequestsRunning, 0, 1},
		{KVCacheUsagePerc, 0.42, 100.0 / 27000}, // 1600 tokens fill 100 blocks of 16
	}
	for _, tt := range tests {
		t.Run(tt.metric, func(t *testing.T) {
			p, err := NewCachedLoadProvider(s, tt.metric)
			if err != nil {
				t.Fatal(err)
			}
			if u, err := p.GetUtilization(ctx, pod); err != nil || u != tt.util {
				t.Fatalf("GetUtilization = %v, %v; want %v", u, err, tt.util)
			}
			if c, err := p.GetConsumption(ctx, pod); err != nil || math.Abs(c-tt.consumption) > 1e-12 {
				t.Fatalf("GetConsumption = %v, %v; want %v", c, err, tt.consumption)
			}
		})
	}

	unscraped := testPod("ns", "fresh", "m", "10.0.0.2")
	s.AddOrUpdatePod(unscraped)
	kv, _ := NewCachedLoadProvider(s, KVCacheUsagePerc)
	if _, err := kv.GetConsumption(ctx, unscraped); !errors.Is(err, ErrMetricNotFound) {
		t.Fatalf("KV consumption on a pod without cache config: %v", err)
	}
	for _, metric := range []string{RealtimeNormalizedPendings, AvgTTFTSeconds, "made_up"} {
		if _, err := NewCachedLoadProvider(s, metric); err == nil {
			t.Errorf("NewCachedLoadProvider(%s) accepted a metric without a load model", metric)
		}
	}
}

func TestPendingLoadFollowsLittlesLaw(t *testing.T) {
	s := newTestStore(t, nil, noScrape())
	profiled := testPod("ns", "a", "llama", "10.0.0.1", withLabel(endpoint.DefaultDeploymentLabel, "llama-a100"))
	unprofiled := testPod("ns", "b", "llama", "10.0.0.2")
	s.AddOrUpdatePod(profiled)
	s.AddOrUpdatePod(unprofiled)
	s.UpdateModelProfile(ModelGPUProfileKey("llama", "llama-a100"), loadTestProfile(t), false)
	p := NewPendingLoadProvider(s, s)
	if p.Cap() != 1 {
		t.Fatalf("Cap = %v", p.Cap())
	}

	ctx := routed("r1", "llama", profiled)
	ctx.PromptTokenCount, ctx.PredictedOutputTokens = 128, 16 // signature [1, 2]
	want := 1 / (6.5 * 0.62)
	c, err := p.GetConsumption(ctx, profiled)
	if err != nil || math.Abs(c-want) > 1e-12 {
		t.Fatalf("GetConsumption = %v, %v; want 1/(6.5*0.62) = %v", c, err, want)
	}

	term := s.AddRequestCount(ctx, "r1", "llama")
	if u, err := p.GetUtilization(ctx, profiled); err != nil || math.Abs(u-want) > 1e-12 {
		t.Fatalf("utilization with one request = %v, %v; want %v", u, err, want)
	}
	s.DoneRequestCount(ctx, "r1", "llama", term)
	if u, _ := p.GetUtilization(ctx, profiled); u != 0 {
		t.Fatalf("utilization after completion = %v", u)
	}

	if _, err := p.GetConsumption(ctx, unprofiled); !errors.Is(err, ErrMissingProfile) {
		t.Fatalf("consumption without a profile: %v", err)
	}
	s.AddRequestCount(routed("r2", "llama", unprofiled), "r2", "llama")
	if u, err := p.GetUtilization(ctx, unprofiled); err != nil || u != 0 {
		t.Fatalf("utilization of an unprofiled pod = %v, %v; want 0", u, err)
	}

	saturated := routed("r3", "llama", profiled)
	saturated.PromptTokenCount, saturated.PredictedOutputTokens = 2048, 256 // throughput 0
	if _, err := p.GetConsumption(saturated, profiled); !errors.Is(err, ErrSLOFailureRequest) {
		t.Fatalf("consumption at zero throughput: %v", err)
	}
}

func BenchmarkPendingLoadConsumption(b *testing.B) {
	s := newTestStore(b, nil, noScrape())
	pod := testPod("ns", "a", "llama", "10.0.0.1", withLabel(endpoint.DefaultDeploymentLabel, "llama-a100"))
	s.AddOrUpdatePod(pod)
	s.UpdateModelProfile(ModelGPUProfileKey("llama", "llama-a100"), loadTestProfile(b), false)
	p := NewPendingLoadProvider(s, s)
	ctx := routed("r", "llama", pod)
	ctx.PromptTokenCount, ctx.PredictedOutputTokens = 700, 90
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.GetConsumption(ctx, pod); err != nil {
			b.Fatal(err)
		}
	}
}
