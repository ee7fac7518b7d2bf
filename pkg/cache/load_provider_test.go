package cache

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/types"
)

func TestCachedLoadProviderModels(t *testing.T) {
	s := newTestStore(t, noScrape())
	pod := testPod("ns", "p", "m", "10.0.0.1")
	s.AddOrUpdatePod(pod)
	s.reg.entry(pkey("ns", "p")).state.metrics.Store(projectedOnce(time.Now(), parseExposition(t, "vllm_v1_t0.txt"), "m"))
	ctx := types.NewRoutingContext("r", "m")
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

func TestPendingLoadIsZeroForAnIdlePodAndAnErrorForADeletedOne(t *testing.T) {
	s := newTestStore(t, noScrape())
	pod := testPod("ns", "a", "llama", "10.0.0.1")
	s.AddOrUpdatePod(pod)
	p := NewPendingLoadProvider(s, newTestProfiles(t, ""))
	ctx := types.NewRoutingContext("r", "llama")
	if u, err := p.GetUtilization(ctx, pod); err != nil || u != 0 {
		t.Fatalf("utilization of an idle pod = %v, %v; want 0", u, err)
	}
	s.DeletePod(pkey("ns", "a"))
	u, err := p.GetUtilization(ctx, pod)
	if _, ok := errors.AsType[*PodNotFoundError](err); !ok || u != 0 {
		t.Fatalf("utilization of a deleted pod = %v, %v; want a *PodNotFoundError", u, err)
	}
}

func TestPendingLoadFollowsLittlesLaw(t *testing.T) {
	s := newTestStore(t, noScrape())
	l := newTestLedger(t)
	profiled := testPod("ns", "a", "llama", "10.0.0.1", withLabel(endpoint.DefaultDeploymentLabel, "llama-a100"))
	unprofiled := testPod("ns", "b", "llama", "10.0.0.2")
	s.AddOrUpdatePod(profiled)
	s.AddOrUpdatePod(unprofiled)
	profiles := newTestProfiles(t, "")
	p := NewPendingLoadProvider(s, profiles)
	if load, err := p.RequestLoad(types.NewRoutingContext("r0", "llama"), epOf(profiled)); load != 0 || err != nil {
		t.Fatalf("RequestLoad without any profile = %v, %v; want 0", load, err)
	}
	profiles.UpdateModelProfile(ModelGPUProfileKey("llama", "llama-a100"), loadTestProfile(t), false)
	if p.Cap() != 1 {
		t.Fatalf("Cap = %v", p.Cap())
	}

	ctx := types.NewRoutingContext("r1", "llama")
	ctx.PromptTokenCount, ctx.PredictedOutputTokens = 128, 16 // signature [1, 2]
	want := 1 / (6.5 * 0.62)
	c, err := p.GetConsumption(ctx, profiled)
	if err != nil || math.Abs(c-want) > 1e-12 {
		t.Fatalf("GetConsumption = %v, %v; want 1/(6.5*0.62) = %v", c, err, want)
	}

	load, err := p.RequestLoad(ctx, epOf(profiled))
	if err != nil || load != c {
		t.Fatalf("RequestLoad = %v, %v; want what GetConsumption gives, %v", load, err, c)
	}
	h := routeTo(t, s, l, "r1", "llama", pkey("ns", "a"), load)
	if u, err := p.GetUtilization(ctx, profiled); err != nil || math.Abs(u-want) > 1e-12 {
		t.Fatalf("utilization with one request = %v, %v; want %v", u, err, want)
	}
	h.Close(inflight.Done, "")
	if u, _ := p.GetUtilization(ctx, profiled); u != 0 {
		t.Fatalf("utilization after completion = %v", u)
	}

	if _, err := p.GetConsumption(ctx, unprofiled); !errors.Is(err, ErrMissingProfile) {
		t.Fatalf("consumption without a profile: %v", err)
	}
	load, err = p.RequestLoad(ctx, epOf(unprofiled))
	if load != 0 || err != nil {
		t.Fatalf("RequestLoad on an unprofiled pod = %v, %v; want 0", load, err)
	}
	routeTo(t, s, l, "r2", "llama", pkey("ns", "b"), load)
	if u, err := p.GetUtilization(ctx, unprofiled); err != nil || u != 0 {
		t.Fatalf("utilization of an unprofiled pod = %v, %v; want 0", u, err)
	}

	saturated := types.NewRoutingContext("r3", "llama")
	saturated.PromptTokenCount, saturated.PredictedOutputTokens = 2048, 256 // throughput 0
	if _, err := p.GetConsumption(saturated, profiled); !errors.Is(err, ErrSLOFailureRequest) {
		t.Fatalf("consumption at zero throughput: %v", err)
	}
}

func BenchmarkPendingLoadConsumption(b *testing.B) {
	s := newTestStore(b, noScrape())
	pod := testPod("ns", "a", "llama", "10.0.0.1", withLabel(endpoint.DefaultDeploymentLabel, "llama-a100"))
	s.AddOrUpdatePod(pod)
	profiles := newTestProfiles(b, "")
	profiles.UpdateModelProfile(ModelGPUProfileKey("llama", "llama-a100"), loadTestProfile(b), false)
	p := NewPendingLoadProvider(s, profiles)
	ctx := types.NewRoutingContext("r", "llama")
	ctx.PromptTokenCount, ctx.PredictedOutputTokens = 700, 90
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.GetConsumption(ctx, pod); err != nil {
			b.Fatal(err)
		}
	}
}
