package routing

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

func TestOpenedAttemptsFeedTheGaugesAndThePredictionRatio(t *testing.T) {
	clock := newManualClock()
	r, reg := newTestRouter(t, uniformFleet(2), nil, func(c *Config) { c.Now = clock.Now })
	d := route(t, r, request("r", KVAware, prompt(0, 1000)), testPods(2))
	p := startPrefill(r, d)
	if g := testsupport.MetricValue(t, reg, "kvgate_routing_inflight_prefill_tokens", nil); g != 1000 {
		t.Fatalf("inflight_prefill_tokens %v, want 1000", g)
	}
	// Predicted 0.1 s prefill + 0.02 s step; the first token takes 0.24 s.
	clock.Advance(240 * time.Millisecond)
	p.FirstToken()
	if n := testsupport.MetricValue(t, reg, "kvgate_routing_ttft_prediction_ratio", nil); n != 1 {
		t.Fatalf("prediction ratio observed %v times, want 1", n)
	}
	if g := testsupport.MetricValue(t, reg, "kvgate_routing_inflight_prefills", nil); g != 0 {
		t.Fatalf("inflight_prefills %v after the first token, want 0", g)
	}
	// A prefill ended by a close is not compared with its prediction.
	startPrefill(r, route(t, r, request("r", KVAware, prompt(0, 1000)), testPods(2))).Close(inflight.Done, "")
	if n := testsupport.MetricValue(t, reg, "kvgate_routing_ttft_prediction_ratio", nil); n != 1 {
		t.Fatalf("prediction ratio observed %v times after a close, want still 1", n)
	}
	if rt := (&Decision{}).Route(); rt.Pod != nil {
		t.Fatal("the route of an empty decision names a pod")
	}
}

func TestClosedAttemptsCompareThePredictedCacheWithTheEngines(t *testing.T) {
	idx := newTestIndex(t)
	r, reg := newTestRouter(t, uniformFleet(2), idx)
	p := prompt(0, 2048)
	holds(t, idx, "p0", p[:1024], kvevent.MediumGPU)
	counts := func() [3]float64 {
		var c [3]float64
		for i, name := range []string{"predicted", "found", "reported"} {
			c[i] = testsupport.MetricValue(t, reg, "kvgate_routing_cached_tokens_"+name+"_total", nil)
		}
		return c
	}
	closeWith := func(u inflight.Usage, withUsage bool) {
		t.Helper()
		d := route(t, r, request("r", KVAware, p), testPods(2))
		if d.PodKey != key("p0") || d.Chosen().UncachedTokens != 1024 {
			t.Fatalf("routed to %s with %d uncached tokens, want p0 with 1024", d.PodKey, d.Chosen().UncachedTokens)
		}
		h := startPrefill(r, d)
		if withUsage {
			h.ReportUsage(u)
		}
		h.Close(inflight.Done, "")
	}

	// The engine found 512 of the 1,024 tokens routing counted on.
	closeWith(inflight.Usage{PromptTokens: 2048, CompletionTokens: 1, CachedTokens: 512, CachedReported: true}, true)
	if got := counts(); got != [3]float64{1024, 512, 512} {
		t.Fatalf("predicted, found, reported = %v, want [1024 512 512]", got)
	}
	// It found more than predicted: found stops at the prediction.
	closeWith(inflight.Usage{PromptTokens: 2048, CompletionTokens: 1, CachedTokens: 1536, CachedReported: true}, true)
	if got := counts(); got != [3]float64{2048, 1536, 2048} {
		t.Fatalf("predicted, found, reported = %v, want [2048 1536 2048]", got)
	}
	// No cached tokens reported, or no usage: nothing to compare.
	closeWith(inflight.Usage{PromptTokens: 2048, CompletionTokens: 1}, true)
	closeWith(inflight.Usage{}, false)
	if got := counts(); got != [3]float64{2048, 1536, 2048} {
		t.Fatalf("predicted, found, reported = %v after attempts without cached tokens, want them unchanged", got)
	}
}
