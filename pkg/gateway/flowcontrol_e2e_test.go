package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/slo"
	"github.com/kvgate/kvgate/pkg/types"
)

// flowEnv is the environment of a gateway with flow control on (flow) or
// off in front of saturation engines, routing by kv-aware.
func flowEnv(flow bool) map[string]string {
	env := maps.Clone(saturationEnv)
	env[config.FlowControl.Name] = fmt.Sprint(flow)
	env[config.RoutingAlgorithm.Name] = routing.KVAware
	return env
}

// debugSLO returns what GET /debug/slo shows.
func debugSLO(t *testing.T, f *testFleet) sloView {
	t.Helper()
	var v sloView
	status, body := get(t, f.url+"/debug/slo")
	if status != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil {
		t.Fatalf("GET /debug/slo: %d %s", status, body)
	}
	return v
}

// flowWaiting returns the client request ids of the requests waiting in
// the queue of llama, in queue order, as GET /debug/slo shows them, and
// false when it shows no queue for llama.
func flowWaiting(t *testing.T, f *testFleet) ([]string, bool) {
	t.Helper()
	for _, m := range debugSLO(t, f).Models {
		if m.Model == "llama" && m.Queue != nil {
			ids := []string{}
			for _, w := range m.Queue.Waiting {
				ids = append(ids, w.ClientRequestID)
			}
			return ids, true
		}
	}
	return nil, false
}

// waitFlowWaiting waits until GET /debug/slo shows want waiting in the
// queue of llama, in that order.
func waitFlowWaiting(t *testing.T, f *testFleet, want ...string) {
	t.Helper()
	testsupport.EventuallyWhy(t, fmt.Sprintf("%v to wait in llama's queue", want), func() (string, bool) {
		got, _ := flowWaiting(t, f)
		return fmt.Sprint(got), slices.Equal(got, want)
	})
}

func TestFlowControlHoldsRequestsWhileEveryEngineIsSaturated(t *testing.T) {
	// Three gateways in front of the same two engines, both saturated:
	// one with flow control off, one with it on, one with it on and a
	// queue that holds a request one second at most.
	engines := startSaturationEngines(t, 2)
	off := serveSimsWith(t, engines.pods, flowEnv(false), func(c *Config) { c.Objectives = testObjectives })
	on := serveSimsWith(t, engines.pods, flowEnv(true), func(c *Config) { c.Objectives = testObjectives })
	brief := serveSimsWith(t, engines.pods, flowEnv(true), func(c *Config) { c.SLO.MaxWait = time.Second })
	var order openedOrder
	on.gw.ledger.Observe(order.observer())

	// With capacity, flow control sends a request on at once.
	for _, f := range []*testFleet{off, on, brief} {
		waitKV(t, f, map[int]bool{0: false, 1: false})
	}
	if r := <-sendObjective(context.Background(), on.url, 0, "first", "", `,"max_tokens":2`); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("a request with capacity under flow control: %+v, want 200", r)
	}
	if got, _ := flowWaiting(t, on); len(got) != 0 {
		t.Fatalf("%v wait with capacity", got)
	}

	releases := []func(){engines.hold(t, 0), engines.hold(t, 1)}
	for _, f := range []*testFleet{off, on, brief} {
		waitKV(t, f, map[int]bool{0: true, 1: true})
	}

	// Without flow control, the request goes on to an engine at once.
	if r := <-sendObjective(context.Background(), off.url, 1, "off", "", `,"max_tokens":2`); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("a request while saturated without flow control: %+v, want 200", r)
	}
	if got, queued := flowWaiting(t, off); queued {
		t.Errorf("without flow control, llama has a queue, with %v waiting", got)
	}

	// A request that waits longer than the queue holds one is answered
	// 429 pool_saturated with a Retry-After, after a second's wait.
	sent := time.Now()
	r := <-sendObjective(context.Background(), brief.url, 2, "expires", "", `,"max_tokens":2`)
	if r.status != http.StatusTooManyRequests || r.code != codePoolSaturated || r.retryAfter != "1" {
		t.Errorf("a request waiting past the longest wait: %+v, want 429 %s with Retry-After 1", r, codePoolSaturated)
	}
	if waited := time.Since(sent); waited < time.Second {
		t.Errorf("the request was refused after %v, before the longest wait (1s)", waited)
	}
	if n := brief.metric(`kvgate_slo_requests_total{model="llama",outcome="expired"}`); n != 1 {
		t.Errorf(`kvgate_slo_requests_total{outcome="expired"} = %v, want 1`, n)
	}

	// With flow control, requests wait in the gateway: /debug/slo and the
	// queue-length metric show them.
	answers := map[string]chan sloAnswer{}
	answers["plain-0"] = sendObjective(context.Background(), on.url, 3, "plain-0", "", `,"max_tokens":4`)
	waitFlowWaiting(t, on, "plain-0")
	if n := on.metric(`kvgate_slo_queue_length{model="llama"}`); n != 1 {
		t.Errorf(`kvgate_slo_queue_length{model="llama"} = %v, want 1`, n)
	}

	// A waiting request whose client goes away leaves the queue.
	ctx, cancel := context.WithCancel(context.Background())
	gone := sendObjective(ctx, on.url, 4, "gone", "", `,"max_tokens":4`)
	waitFlowWaiting(t, on, "plain-0", "gone")
	cancel()
	if r := <-gone; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the request whose client went away ended with %+v", r)
	}
	waitFlowWaiting(t, on, "plain-0")

	// A request of a higher priority waits ahead of the earlier one, and
	// so does one picked by a front end such as ext_proc, behind it.
	answers["interactive-0"] = sendObjective(context.Background(), on.url, 5, "interactive-0", "interactive", `,"max_tokens":4`)
	waitFlowWaiting(t, on, "interactive-0", "plain-0")
	picked := pickAsync(context.Background(), on.gw.Picker(), PickRequest{Path: PathCompletions, ClientRequestID: "picked-0",
		Body: []byte(completion(simPrompt(6, 20), `,"max_tokens":4`))})
	waitFlowWaiting(t, on, "interactive-0", "plain-0", "picked-0")
	clients := waitingClients(mustQueue(t, on))

	// A sheddable request is refused as without flow control.
	if r := <-sendObjective(context.Background(), on.url, 7, "batch-0", "batch", `,"max_tokens":4`); r.status != http.StatusTooManyRequests ||
		r.code != codePoolSaturated || r.retryAfter == "" {
		t.Errorf("a sheddable request while saturated: %+v, want 429 %s with a Retry-After", r, codePoolSaturated)
	}

	// Once one engine frees, the pool has capacity: the waiting requests
	// leave the queue, the higher priority first, each routed by kv-aware
	// among both engines, the other still saturated.
	releases[0]()
	waitFlowWaiting(t, on)
	releases[1]()
	for id, a := range answers {
		if r := <-a; r.err != nil || r.status != http.StatusOK {
			t.Errorf("%s: %+v, want 200", id, r)
		}
	}
	p := <-picked
	if p.err != nil || p.k.Endpoint() == nil {
		t.Fatalf("the picked request ended with %+v, want a pod", p)
	}
	p.k.End()
	want := []string{"interactive-0", "plain-0", "picked-0"}
	if sent := sentClients(&order, clients); !slices.Equal(sent, want) {
		t.Errorf("the waiting requests were sent in the order %v, want %v", sent, want)
	}
	for outcome, want := range map[string]float64{"admitted": 4, "cancelled": 1, "shed": 0, "expired": 0} {
		if n := on.metric(fmt.Sprintf(`kvgate_slo_requests_total{model="llama",outcome=%q}`, outcome)); n != want {
			t.Errorf("kvgate_slo_requests_total{outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
	if n := on.metric(`kvgate_gateway_shed_requests_total{model="llama"}`); n != 1 {
		t.Errorf("kvgate_gateway_shed_requests_total = %v, want 1", n)
	}
}

func TestFlowControlRoutesAmongEveryPodOnceOneHasCapacity(t *testing.T) {
	// Engine 0 is saturated, engine 1 has capacity: the pool does, and a
	// request goes on at once, routed by its algorithm among both engines,
	// as the Inference Extension's flow control hands a request to its
	// scheduler (kv-aware must stay free to choose the pod holding a
	// prefix). With random routing, 16 requests all going to engine 1
	// would mean the candidates were confined to the pods with capacity
	// (one chance in 65,536 otherwise).
	engines := startSaturationEngines(t, 2)
	env := flowEnv(true)
	env[config.RoutingAlgorithm.Name] = routing.Random
	f := serveSimsWith(t, engines.pods, env, nil)
	waitKV(t, f, map[int]bool{0: false, 1: false})
	release := engines.hold(t, 0)
	defer release()
	waitKV(t, f, map[int]bool{0: true, 1: false})
	pods := map[string]int{}
	for i := range 16 {
		r := <-sendObjective(context.Background(), f.url, i, fmt.Sprint("r-", i), "", `,"max_tokens":2`)
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request %d: %+v, want 200", i, r)
		}
		pods[r.pod]++
	}
	if len(pods) != 2 {
		t.Errorf("the requests went to %v, want both engines, the saturated one too", pods)
	}
	if got, _ := flowWaiting(t, f); len(got) != 0 {
		t.Errorf("%v wait, want every request sent at once", got)
	}
}

// mustQueue returns the queue of llama.
func mustQueue(t *testing.T, f *testFleet) *slo.QueueRouter {
	t.Helper()
	q, err := f.gw.queues.GetRouter(&types.RoutingContext{Model: "llama"})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestFlowControlCountsTheRequestsSentSinceTheLatestScrape(t *testing.T) {
	// One engine, scraped once at start and not again for the test's
	// length, with nothing waiting: the scrape alone says it has capacity.
	// With a queue depth of 0, the request this gateway sent it since then,
	// still before its first token, takes that capacity: the next request
	// waits until it ends, and a sheddable one, which would have to wait,
	// is refused with 429 pool_saturated.
	env := flowEnv(true)
	env[config.SaturationQueueDepth.Name] = "0"
	env[config.PodMetricRefreshInterval.Name] = "60000"
	env[config.SaturationMetricsStaleness.Name] = "120000"
	f := serveSimsWith(t, startSims(t, 1, sim.LatencyModel{StepOverhead: 20 * time.Millisecond}), env,
		func(c *Config) { c.Objectives = testObjectives })
	testsupport.Eventually(t, "the engine's first scrape", func() bool {
		pods, err := f.gw.store.ListPodsByModel("llama")
		return err == nil && len(pods) == 1 && f.gw.store.PodScrapeState(pods[0].Key) == cache.ScrapeFresh
	})
	var order openedOrder
	f.gw.ledger.Observe(order.observer())

	// A long request that is not streamed: its prefill counts as queued
	// until it ends.
	ctx, cancel := context.WithCancel(context.Background())
	long := sendObjective(ctx, f.url, 0, "long", "", `,"max_tokens":4000`)
	testsupport.Eventually(t, "the long request to be sent", func() bool { return order.len() == 1 })
	if got, _ := flowWaiting(t, f); len(got) != 0 {
		t.Fatalf("%v wait, want the long request sent at once", got)
	}

	next := sendObjective(context.Background(), f.url, 1, "next", "", `,"max_tokens":2`)
	waitFlowWaiting(t, f, "next")
	if r := <-sendObjective(context.Background(), f.url, 2, "batch-0", "batch", `,"max_tokens":2`); r.status != http.StatusTooManyRequests ||
		r.code != codePoolSaturated || r.retryAfter == "" {
		t.Errorf("a sheddable request while another waits: %+v, want 429 %s with a Retry-After", r, codePoolSaturated)
	}
	if n := f.metric(`kvgate_gateway_shed_requests_total{model="llama"}`); n != 1 {
		t.Errorf("kvgate_gateway_shed_requests_total = %v, want 1", n)
	}

	// The long request ends (its client goes away): the next one goes.
	cancel()
	if r := <-long; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the long request ended with %+v", r)
	}
	if r := <-next; r.err != nil || r.status != http.StatusOK {
		t.Fatalf("the waiting request: %+v, want 200", r)
	}
}
