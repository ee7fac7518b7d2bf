package routing

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/inflight"
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
