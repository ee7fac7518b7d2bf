package extproc

import (
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/gateway"
)

func TestFlowControlHoldsRequestsThroughEnvoyWhileEveryEngineIsSaturated(t *testing.T) {
	// A kv-aware request arriving while the one engine is saturated waits
	// in the gateway, Envoy asked to wait for it, and goes to the engine
	// once it frees.
	f := start(t, 1, options{engine: smallKVEngines, env: map[string]string{
		"KVGATE_FLOW_CONTROL":                    "true",
		"KVGATE_ROUTING_ALGORITHM":               "kv-aware",
		"KVGATE_SATURATION_KV_CACHE_UTILIZATION": "0.3",
		"KVGATE_SATURATION_METRICS_STALENESS_MS": "3000",
		"KVGATE_EXTPROC_MAX_MESSAGE_TIMEOUT":     "60s",
	}, configure: func(c *gateway.Config) { c.Objectives = objectives{"batch": -1} }})
	release := holdEngine(t, f.engines[0])
	// A sheddable request is refused once the gateway reads the engine as
	// saturated.
	n := 0
	awaitShed(t, f, &n, "the engine to read as saturated")

	length := func() float64 {
		return f.metric(t, "kvgate_slo_queue_length", map[string]string{"model": simModel})
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		for length() < 1 {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		release()
	}()
	x := f.envoy.start(t, buffered, objectiveRequest(1000, ""))
	if x.immediate != nil {
		t.Fatalf("the request while saturated was answered %v, want it held and routed", x.immediate)
	}
	x.destination()
	if len(x.overrides) != 1 || x.overrides[0] <= time.Second {
		t.Errorf("the request that waited asked Envoy to wait %v, want once, more than a second", x.overrides)
	}
	x.forward(256)
	if x.status != http.StatusOK {
		t.Fatalf("the request held: %d %s", x.status, x.respBody)
	}
	if q := f.metric(t, "kvgate_slo_queued_total", map[string]string{"model": simModel}); q != 1 {
		t.Errorf("kvgate_slo_queued_total = %v, want 1", q)
	}
}
