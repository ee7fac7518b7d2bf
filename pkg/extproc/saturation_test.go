package extproc

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simtest"
)

// objectives is a gateway.ObjectivePriorities of fixed objectives.
type objectives map[string]int

func (o objectives) Priority(name string) (int, bool) {
	p, ok := o[name]
	return p, ok
}

// smallKVEngines gives each engine a KV cache of 64 blocks of 16 tokens,
// stepping every 50 ms: a held prompt of some 420 tokens fills more than
// the tests' 0.3 threshold, and leaves room for small requests.
func smallKVEngines(c *sim.EngineConfig) {
	c.NumGPUBlocks = 65
	c.Latency = sim.LatencyModel{StepOverhead: 50 * time.Millisecond}
}

// holdEngine streams a long completion from e directly and returns once its
// first token came: its prompt of some 420 tokens holds its KV cache until
// release hangs up.
func holdEngine(t *testing.T, e *simEngine) (release func()) {
	t.Helper()
	var prompt strings.Builder
	for i := 0; len(sim.Tokenizer{}.Encode(prompt.String(), true)) < 420; i++ {
		fmt.Fprintf(&prompt, "held%s%d ", e.name, i)
	}
	return simtest.Hold(t, e.url, simModel, prompt.String(), 500)
}

// objectiveRequest is a small completion naming objective.
func objectiveRequest(i int, objective string) request {
	r := completionRequest(fmt.Sprint("short ", i), "")
	if objective != "" {
		r.headers = map[string]string{gateway.HeaderInferenceObjective: objective}
	}
	return r
}

// retryAfter returns the retry-after header an immediate response sets.
func retryAfter(x *exchange) string {
	for _, h := range x.immediate.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}

// awaitShed sends sheddable requests (objective batch) through Envoy,
// numbered from *n on, until the picker refuses one: until it reads the
// engines as saturated. A request served meanwhile is relayed whole.
func awaitShed(t *testing.T, f *fixture, n *int, what string) {
	t.Helper()
	testsupport.EventuallyWhy(t, what, func() (string, bool) {
		*n++
		x := f.envoy.start(t, buffered, objectiveRequest(*n, "batch"))
		if x.immediate == nil {
			x.forward(256)
			return fmt.Sprintf("served: %d", x.status), false
		}
		return fmt.Sprintf("%v", x.immediate), true
	})
}

func TestSheddableRequestsAreRefusedThroughEnvoyWhileEveryEngineIsSaturated(t *testing.T) {
	f := start(t, 2, options{engine: smallKVEngines, env: map[string]string{
		"KVGATE_SATURATION_KV_CACHE_UTILIZATION": "0.3",
		"KVGATE_SATURATION_METRICS_STALENESS_MS": "3000",
	}, configure: func(c *gateway.Config) { c.Objectives = objectives{"batch": -1, "chat": 0} }})
	n := 0
	servedSheddable := func() (string, bool) {
		n++
		x := f.envoy.start(t, buffered, objectiveRequest(n, "batch"))
		if x.immediate != nil {
			return fmt.Sprintf("%v", x.immediate), false
		}
		x.forward(256)
		return fmt.Sprintf("served: %d %s", x.status, x.respBody), x.status == http.StatusOK
	}
	// Once the engines are scraped, they have capacity.
	testsupport.EventuallyWhy(t, "a sheddable request to be served while the engines are idle", servedSheddable)

	release := holdEngine(t, f.engines[0])
	holdEngine(t, f.engines[1])
	awaitShed(t, f, &n, "a sheddable request to be refused while every engine is saturated")
	shed := f.metric(t, "kvgate_gateway_shed_requests_total", map[string]string{"model": simModel})
	if shed < 1 {
		t.Errorf("kvgate_gateway_shed_requests_total = %v; want at least 1", shed)
	}
	for _, mode := range modes {
		x := f.envoy.start(t, mode, objectiveRequest(100, "batch"))
		ir := x.immediate
		if ir == nil || ir.GetStatus().GetCode() != http.StatusTooManyRequests {
			t.Fatalf("%s: a sheddable request while saturated: %v; want 429", mode.name, ir)
		}
		if _, code := errorOf(t, ir.GetBody()); code != "pool_saturated" || retryAfter(x) != "1" {
			t.Errorf("%s: code %q, retry-after %q; want pool_saturated, 1", mode.name, code, retryAfter(x))
		}
		// Priority 0, named or not, is never shed.
		for _, objective := range []string{"chat", ""} {
			x := f.envoy.start(t, mode, objectiveRequest(200, objective))
			if x.immediate != nil {
				t.Fatalf("%s: objective %q while saturated: %v; want it routed", mode.name, objective, x.immediate)
			}
			x.forward(256)
			if x.status != http.StatusOK {
				t.Fatalf("%s: objective %q while saturated: %d %s", mode.name, objective, x.status, x.respBody)
			}
		}
	}
	if got := f.metric(t, "kvgate_gateway_shed_requests_total", map[string]string{"model": simModel}); got != shed+float64(len(modes)) {
		t.Errorf("kvgate_gateway_shed_requests_total = %v; want %v", got, shed+float64(len(modes)))
	}

	release()
	testsupport.EventuallyWhy(t, "a sheddable request to be served once an engine has capacity", servedSheddable)
}
