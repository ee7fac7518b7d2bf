package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/sim/simtest"
	"github.com/kvgate/kvgate/pkg/slo"
	"github.com/kvgate/kvgate/pkg/types"
)

// simDeployment is the deployment of the simulated engines' pods, whose
// GPU profile a test may set.
const simDeployment = "sim-a100"

// startSimFleet runs n simulated vLLM engines (startSims) serving model
// llama with latency lat, and a gateway in front of them (serveSims).
func startSimFleet(t *testing.T, n int, lat sim.LatencyModel, env map[string]string) *testFleet {
	t.Helper()
	return serveSims(t, startSims(t, n, lat), env)
}

// startSims runs n simulated vLLM engines (the vllm-sim server, in
// process) serving model llama with latency lat until the test ends, and
// returns their pods, of deployment simDeployment.
func startSims(t *testing.T, n int, lat sim.LatencyModel) staticPods {
	t.Helper()
	var pods staticPods
	for i := range n {
		e := simtest.Serve(t, simserver.Config{Model: "llama", Ranks: []simserver.Rank{{
			Engine: sim.EngineConfig{BlockSize: 16, NumGPUBlocks: 8192, Latency: lat},
		}}})
		port := e.Port
		name := fmt.Sprint("sim-", i)
		pods = append(pods, &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: k8stypes.UID("uid-" + name),
				Labels: map[string]string{endpoint.ModelNameLabel: "llama", endpoint.ModelPortLabel: strconv.Itoa(port),
					endpoint.DefaultDeploymentLabel: simDeployment}},
			Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1",
				Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
		})
	}
	return pods
}

// serveSims runs a gateway in front of the simulated engines' pods,
// configured by env on top of the fleet's. The pods come from a pod source
// of the test's; KV event sync is off (the engines publish none): requests
// are tokenized by the engines and routed on load and time predictions
// alone.
func serveSims(t *testing.T, pods staticPods, env map[string]string) *testFleet {
	t.Helper()
	return serveSimsWith(t, pods, env, nil)
}

// serveSimsWith is serveSims with the loaded Config adjusted by configure
// (when not nil).
func serveSimsWith(t *testing.T, pods staticPods, env map[string]string, configure func(*Config)) *testFleet {
	t.Helper()
	f := &testFleet{t: t}
	full := map[string]string{
		"KVGATE_POD_DISCOVERY":                      "static",
		"KVGATE_STATIC_ENDPOINTS_FILE":              writeEndpoints(t, "endpoints: []\n"),
		"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS":     "20",
		"KVGATE_SHUTDOWN_TIMEOUT":                   "10s",
		"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false",
	}
	for k, v := range env {
		full[k] = v
	}
	cfg := loadTestConfig(t, full)
	cfg.PodSource = pods
	if configure != nil {
		configure(&cfg)
	}
	f.serve(cfg)
	f.waitReady()
	return f
}

// staticPods is a pod source delivering fixed pods.
type staticPods []*v1.Pod

func (p staticPods) Run(ctx context.Context, _ *rest.Config, sink cache.PodSink, synced func()) error {
	for _, pod := range p {
		sink.AddOrUpdatePod(pod)
	}
	synced()
	<-ctx.Done()
	return nil
}

// simPrompt is a prompt of about n tokens of the simulator's tokenizer,
// distinct per i.
func simPrompt(i, n int) string {
	var b strings.Builder
	for j := range n {
		fmt.Fprintf(&b, "w%d_%d ", i, j)
	}
	return b.String()
}

// openedOrder records the order in which the gateway's request ledger
// opens attempts, by the number of the request id (ids grow with the order
// the gateway received the requests in).
type openedOrder struct {
	mu  sync.Mutex
	ids []int
}

func (o *openedOrder) observer() inflight.Observer {
	return inflight.Observer{Opened: func(h *inflight.Handle) {
		n := requestNumber(h.Request().ID())
		o.mu.Lock()
		o.ids = append(o.ids, n)
		o.mu.Unlock()
	}}
}

// requestNumber returns the number that ends the gateway's request id,
// which grows with the order the gateway received its requests in.
func requestNumber(id string) int {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	return n
}

func (o *openedOrder) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.ids)
}

func (o *openedOrder) list() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]int(nil), o.ids...)
}

// startQuarterPodFleet runs two engines under slo-least-load-pulling with a
// 60 s objective, and a GPU profile that gives each request a quarter of a
// pod: the fleet serves eight at once. It returns the fleet and its
// model's queue.
func startQuarterPodFleet(t *testing.T) (*testFleet, *slo.QueueRouter) {
	t.Helper()
	return startQuarterPodFleetWith(t, nil)
}

// startQuarterPodFleetWith is startQuarterPodFleet with the gateway's
// Config adjusted by configure (when not nil).
func startQuarterPodFleetWith(t *testing.T, configure func(*Config)) (*testFleet, *slo.QueueRouter) {
	t.Helper()
	lat := sim.LatencyModel{StepOverhead: 20 * time.Millisecond, PrefillPerToken: 50 * time.Microsecond}
	f := serveSimsWith(t, startSims(t, 2, lat), map[string]string{
		"KVGATE_ROUTING_ALGORITHM": "slo-least-load-pulling",
		"KVGATE_SLO_TTFT":          "60s",
	}, configure)
	f.gw.profiles.UpdateModelProfile(cache.ModelGPUProfileKey("llama", simDeployment), &cache.ModelGPUProfile{
		Indexes: [][]float64{{1}, {1}}, Tputs: [][]float64{{4}}, E2E: [][]float64{{1}}}, true)
	q, err := f.gw.queues.GetRouter(&types.RoutingContext{Model: "llama"})
	if err != nil {
		t.Fatal(err)
	}
	return f, q
}

func TestSLOQueueAdmitsABurstAsCapacityFreesInDeadlineOrderAndLetsDisconnectsGo(t *testing.T) {
	// Twenty-four requests, sent one after the other, exceed the eight the
	// fleet serves at once: the rest wait in the gateway and are sent as
	// requests complete, earliest deadline (here, earliest arrival) first,
	// well within their 60 s objective.
	f, q := startQuarterPodFleet(t)
	var order openedOrder
	f.gw.ledger.Observe(order.observer())

	const n = 24
	const cancelled = 20 // this request's client goes away while it waits
	results := make([]chan sloAnswer, n)
	var cancel context.CancelFunc
	for i := range n {
		ctx := context.Background()
		if i == cancelled {
			ctx, cancel = context.WithCancel(ctx)
		}
		opened, waiting := order.len(), q.Len()
		results[i] = sendObjective(ctx, f.url, i, fmt.Sprint("client-", i), "", `,"max_tokens":40`)
		// The next request is sent once this one is sent on or waits: a
		// pass sending a waiting request on leaves the sum as it was.
		testsupport.Eventually(t, fmt.Sprintf("request %d to be routed or queued", i), func() bool {
			return order.len()+q.Len() > opened+waiting
		})
		if i == cancelled && q.Len() == 0 {
			t.Fatalf("request %d was sent at once: the burst did not exceed the fleet", i)
		}
	}
	// What waits now is sent as capacity frees, in this order.
	var waiting []int
	for _, w := range q.Status().Waiting {
		waiting = append(waiting, requestNumber(w.RequestID))
		// The client's own id is shown beside the gateway's.
		if c, ok := strings.CutPrefix(w.ClientRequestID, "client-"); !ok || c == "" {
			t.Errorf("waiting request %s shows client request id %q, want the client's client-<i>", w.RequestID, w.ClientRequestID)
		}
	}
	if len(waiting) < 2 {
		t.Fatalf("%d requests wait, want a burst beyond the fleet", len(waiting))
	}
	cancel()
	if r := <-results[cancelled]; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the cancelled request ended with %+v", r)
	}
	testsupport.EventuallyWhy(t, "the cancelled request to leave the queue", func() (string, bool) {
		n := testsupport.MetricValue(t, f.gw.registry, "kvgate_slo_requests_total", map[string]string{"outcome": "cancelled"})
		return fmt.Sprint(n), n == 1
	})
	for i := range n {
		if i == cancelled {
			continue
		}
		if r := <-results[i]; r.err != nil || r.status != http.StatusOK {
			t.Errorf("request %d: %+v, want 200", i, r)
		}
	}
	ids := order.list()
	if len(ids) != n-1 {
		t.Fatalf("%d attempts opened, want %d: every request but the cancelled one, once", len(ids), n-1)
	}
	var sent []int
	for _, id := range ids {
		if slices.Contains(waiting, id) {
			sent = append(sent, id)
		}
	}
	if want := slices.DeleteFunc(slices.Clone(waiting), func(id int) bool { return !slices.Contains(sent, id) }); len(sent) != len(waiting)-1 ||
		!slices.Equal(sent, want) {
		t.Fatalf("the requests waiting in deadline order %v were sent in the order %v; want all but the cancelled one, in that order",
			waiting, sent)
	}
	admitted := testsupport.MetricValue(t, f.gw.registry, "kvgate_slo_requests_total", map[string]string{"outcome": "admitted"})
	queued := testsupport.MetricValue(t, f.gw.registry, "kvgate_slo_queued_total", nil)
	if admitted != n-1 || queued < n-8 || q.Len() != 0 {
		t.Fatalf("admitted %v, queued %v, %d still waiting; want %d admitted, at least %d of them after waiting, none left",
			admitted, queued, q.Len(), n-1, n-8)
	}
}

func TestSLOAlgorithmsAnswer429WithRetryAfterWhatTheyCannotServe(t *testing.T) {
	lat := sim.LatencyModel{StepOverhead: 5 * time.Millisecond, PrefillPerToken: 2 * time.Millisecond}
	f := startSimFleet(t, 1, lat, map[string]string{
		"KVGATE_SLO_MODELS": "llama=ttft:100ms",
		"KVGATE_ROUTING_DEFAULT_PREFILL_TOKENS_PER_SECOND": "500",
	})
	// A prompt of some 1,100 tokens takes 2.2 s to prefill: no pod can
	// return its first token within 100 ms.
	for _, alg := range []string{"slo", "slo-least-load", "slo-pack-load"} {
		resp, body := post(t, f.url+"/v1/completions", completion(simPrompt(0, 200), `,"max_tokens":2`),
			map[string]string{"routing-strategy": alg})
		var e apiError
		if resp.StatusCode != http.StatusTooManyRequests || json.Unmarshal(body, &e) != nil || e.Error.Code != codeSLOUnmeetable ||
			resp.Header.Get(HeaderRetryAfter) == "" {
			t.Errorf("%s: %d %s (Retry-After %q), want 429 %s with Retry-After", alg, resp.StatusCode, body,
				resp.Header.Get(HeaderRetryAfter), codeSLOUnmeetable)
		}
	}
	// A Messages request is refused alike, in Anthropic's shape.
	resp, mbody := post(t, f.url+PathMessages, anthropicBody(simPrompt(0, 200), ""), map[string]string{"routing-strategy": "slo"})
	if e := decodeAnthropicError(t, mbody); resp.StatusCode != http.StatusTooManyRequests || e.Type != typeRateLimit ||
		resp.Header.Get(HeaderRetryAfter) == "" {
		t.Errorf("Messages: %d %s (Retry-After %q), want 429 %s in Anthropic's shape with Retry-After", resp.StatusCode, mbody,
			resp.Header.Get(HeaderRetryAfter), typeRateLimit)
	}
	// kv-aware does not read the objective.
	if resp, body := post(t, f.url+"/v1/completions", completion(simPrompt(0, 200), `,"max_tokens":2`), nil); resp.StatusCode != http.StatusOK {
		t.Errorf("kv-aware: %d %s, want 200", resp.StatusCode, body)
	}
	var v sloView
	status, body := get(t, f.url+"/debug/slo")
	if status != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil || len(v.Models) != 1 ||
		v.Models[0].SLO != "ttft:100ms" || v.Models[0].Source != "model" || v.Models[0].Queue == nil {
		t.Fatalf("GET /debug/slo: %d %s", status, body)
	}
}

func TestSLOQueueCountsTheLoadOtherGatewayReplicasSentThroughRedis(t *testing.T) {
	// Two gateway replicas share one engine and one Redis. The GPU profile
	// in Redis gives each request the whole pod and an objective of 60 s to
	// the first token. A request sent through replica A takes the pod;
	// replica B learns it from A's shared pending load, so it refuses a
	// slo-least-load request (429) and holds a slo-least-load-pulling one
	// until A's request ends, then sends it on.
	srv := testredis.Start(t)
	rc := srv.NewClient(t)
	profile, err := json.Marshal(cache.ModelGPUProfile{Deployment: simDeployment, Indexes: [][]float64{{1}, {1}},
		Tputs: [][]float64{{1}}, E2E: [][]float64{{1}}, SLOs: cache.ModelSLOs{TTFT: 60}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Set(context.Background(), cache.ModelGPUProfileKey("llama", simDeployment), profile, 0).Err(); err != nil {
		t.Fatal(err)
	}
	pods := startSims(t, 1, sim.LatencyModel{StepOverhead: 20 * time.Millisecond, PrefillPerToken: 50 * time.Microsecond})
	env := map[string]string{"KVGATE_REDIS_ADDRESS": srv.Addr, "KVGATE_ROUTING_ALGORITHM": "slo-least-load-pulling"}
	a, b := serveSims(t, pods, env), serveSims(t, pods, env)
	for _, f := range []*testFleet{a, b} {
		testsupport.Eventually(t, "the GPU profile to load from Redis", func() bool {
			return f.gw.profiles.Lookup("llama", simDeployment) != nil
		})
	}

	// A's request generates for minutes (8,000 steps of 20 ms): it holds
	// the pod until its client goes away.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.url+"/v1/completions",
			strings.NewReader(completion(simPrompt(0, 20), `,"max_tokens":8000,"stream":true`)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		held <- err
	}()
	testsupport.Eventually(t, "replica B to count the pending load replica A sent to the pod", func() bool {
		loads := b.gw.store.PodLoads()
		return len(loads) == 1 && loads[0].PendingLoad() >= 1
	})

	resp, body := post(t, b.url+"/v1/completions", completion(simPrompt(1, 20), `,"max_tokens":4`),
		map[string]string{"routing-strategy": "slo-least-load"})
	var e apiError
	if resp.StatusCode != http.StatusTooManyRequests || json.Unmarshal(body, &e) != nil || e.Error.Code != codeSLONoCapacity ||
		resp.Header.Get(HeaderRetryAfter) == "" {
		t.Fatalf("slo-least-load on replica B: %d %s (Retry-After %q), want 429 %s with Retry-After", resp.StatusCode, body,
			resp.Header.Get(HeaderRetryAfter), codeSLONoCapacity)
	}

	q, err := b.gw.queues.GetRouter(&types.RoutingContext{Model: "llama"})
	if err != nil {
		t.Fatal(err)
	}
	pulled := make(chan int, 1)
	go func() {
		resp, _ := post(t, b.url+"/v1/completions", completion(simPrompt(2, 20), `,"max_tokens":4`), nil)
		pulled <- resp.StatusCode
	}()
	testsupport.Eventually(t, "the request to wait in replica B's queue", func() bool { return q.Len() == 1 })
	var v sloView
	if status, body := get(t, b.url+"/debug/slo"); status != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil ||
		len(v.Models) != 1 || v.Models[0].SLO != "ttft:1m0s" || v.Models[0].Source != slo.SourceProfile ||
		v.Models[0].Queue == nil || v.Models[0].Queue.Length != 1 {
		t.Fatalf("GET /debug/slo on replica B: %d %s; want the profile's objective and one request waiting", status, body)
	}

	cancel()
	if err := <-held; !errors.Is(err, context.Canceled) {
		t.Fatalf("replica A's request ended with %v", err)
	}
	if status := <-pulled; status != http.StatusOK {
		t.Fatalf("the request that waited in replica B: %d, want 200", status)
	}
	for outcome, want := range map[string]float64{"admitted": 1, "rejected": 1, "expired": 0} {
		if n := testsupport.MetricValue(t, b.gw.registry, "kvgate_slo_requests_total", map[string]string{"outcome": outcome}); n != want {
			t.Errorf("replica B: kvgate_slo_requests_total{outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
	if n := testsupport.MetricValue(t, b.gw.registry, "kvgate_slo_queued_total", nil); n != 1 {
		t.Errorf("replica B: kvgate_slo_queued_total = %v, want 1", n)
	}
}

func TestAModelLeavingTheFleetDropsItsQueueAndPredictor(t *testing.T) {
	// The profile gives each request the whole pod: a request held on it
	// makes the next one wait in the queue.
	f := startSimFleet(t, 1, sim.LatencyModel{StepOverhead: 20 * time.Millisecond}, map[string]string{
		"KVGATE_ROUTING_ALGORITHM": "slo-least-load-pulling",
		"KVGATE_SLO_TTFT":          "60s",
	})
	f.gw.profiles.UpdateModelProfile(cache.ModelGPUProfileKey("llama", simDeployment), &cache.ModelGPUProfile{
		Indexes: [][]float64{{1}, {1}}, Tputs: [][]float64{{1}}, E2E: [][]float64{{1}}}, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := make(chan struct{})
	go func() {
		defer close(held)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/completions",
			strings.NewReader(completion(simPrompt(0, 20), `,"max_tokens":8000,"stream":true`)))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	q, err := f.gw.queues.GetRouter(&types.RoutingContext{Model: "llama"})
	if err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the first request to take the pod", func() bool {
		loads := f.gw.store.PodLoads()
		return len(loads) == 1 && loads[0].PendingLoad() >= 1
	})
	type result struct {
		status int
		body   []byte
	}
	waited := make(chan result, 1)
	go func() {
		resp, body := post(t, f.url+"/v1/completions", completion(simPrompt(1, 20), `,"max_tokens":4`), nil)
		waited <- result{resp.StatusCode, body}
	}()
	testsupport.Eventually(t, "the second request to wait", func() bool { return q.Len() == 1 })
	predictor, err := f.gw.predictors.GetOutputPredictor("llama")
	if err != nil {
		t.Fatal(err)
	}
	pod := f.gw.store.ListPods()[0].Pod

	f.gw.store.DeletePod(endpoint.KeyOf(pod))
	r := <-waited
	var e apiError
	if r.status != http.StatusServiceUnavailable || json.Unmarshal(r.body, &e) != nil || e.Error.Code != codeNoReadyPod {
		t.Fatalf("the request waiting when its model left: %d %s, want 503 %s", r.status, r.body, codeNoReadyPod)
	}
	if models := f.gw.queues.Models(); len(models) != 0 {
		t.Errorf("queues of %v remain after their model left", models)
	}
	for _, name := range []string{"kvgate_slo_queue_length", "kvgate_slo_requests_total", "kvgate_slo_queued_total"} {
		if n := testsupport.MetricSeries(t, f.gw.registry, name, map[string]string{"model": "llama"}); n != 0 {
			t.Errorf("%s has %d series of the model that left", name, n)
		}
	}
	cancel()
	<-held

	// The model comes back with a fresh predictor and queue.
	f.gw.store.AddOrUpdatePod(pod)
	again, err := f.gw.predictors.GetOutputPredictor("llama")
	if err != nil || again == predictor {
		t.Errorf("the model's predictor after it came back: %p, %v; want a new one", again, err)
	}
	if q2, err := f.gw.queues.GetRouter(&types.RoutingContext{Model: "llama"}); err != nil || q2 == q {
		t.Errorf("the model's queue after it came back: %p, %v; want a new one", q2, err)
	}
}

func TestAnAdapterUnloadedFromEveryPodDropsItsQueueAndPredictor(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{"KVGATE_ADAPTER_REFRESH_INTERVAL": "20ms"}})
	a := f.engine("a")
	a.setAdapters("sql-lora")
	testsupport.Eventually(t, "sql-lora to be served", func() bool { return f.gw.store.HasModel("sql-lora") })
	body := `{"model":"sql-lora","prompt":"hello","max_tokens":4}`
	if resp, data := post(t, f.url+"/v1/completions", body, map[string]string{"routing-strategy": "slo-least-load"}); resp.StatusCode != http.StatusOK {
		t.Fatalf("request for sql-lora: %d %s", resp.StatusCode, data)
	}
	if !slices.Contains(f.gw.queues.Models(), "sql-lora") {
		t.Fatalf("no queue for sql-lora after its request: %v", f.gw.queues.Models())
	}
	testsupport.Eventually(t, "the request's usage to reach sql-lora's predictor", func() bool {
		_, ok := f.gw.predictors.Histograms()["sql-lora"]
		return ok
	})

	// The engine unloads the adapter: no pod serves it any more.
	a.setAdapters()
	testsupport.Eventually(t, "sql-lora to leave the fleet", func() bool { return !f.gw.store.HasModel("sql-lora") })
	testsupport.EventuallyWhy(t, "sql-lora's queue and predictor to go", func() (string, bool) {
		_, predicted := f.gw.predictors.Histograms()["sql-lora"]
		queued := slices.Contains(f.gw.queues.Models(), "sql-lora")
		return fmt.Sprintf("queue %v, predictor %v", queued, predicted), !queued && !predicted
	})
	if n := testsupport.MetricSeries(t, f.gw.registry, "kvgate_slo_requests_total", map[string]string{"model": "sql-lora"}); n != 0 {
		t.Errorf("kvgate_slo_requests_total has %d series of the adapter that left", n)
	}
}

func TestTheServedDeploymentsProfilesLoadWhateverOtherProfilesRedisHolds(t *testing.T) {
	srv := testredis.Start(t)
	rc := srv.NewClient(t)
	ctx := context.Background()
	profile := func(cost float64) string {
		return fmt.Sprintf(`{"gpu":"x","cost":%v,"indexes":[[1],[1]],"tputs":[[1]],"e2e":[[1]],"created":1}`, cost)
	}
	// Profiles of deployments this fleet does not run, far more than a
	// refresh loads.
	for i := range 200 {
		if err := rc.Set(ctx, cache.ModelGPUProfileKey("llama", fmt.Sprint("elsewhere-", i)), profile(1), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rc.Set(ctx, cache.ModelGPUProfileKey("llama", simDeployment), profile(7), 0).Err(); err != nil {
		t.Fatal(err)
	}
	f := &testFleet{t: t}
	cfg := loadTestConfig(t, map[string]string{
		"KVGATE_POD_DISCOVERY":                      "static",
		"KVGATE_STATIC_ENDPOINTS_FILE":              writeEndpoints(t, "endpoints: []\n"),
		"KVGATE_SHUTDOWN_TIMEOUT":                   "10s",
		"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false",
		"KVGATE_REDIS_ADDRESS":                      srv.Addr,
	})
	cfg.Redis.Profiles.MaxProfiles = 4
	cfg.Redis.Profiles.RefreshInterval = 20 * time.Millisecond
	cfg.PodSource = staticPods{&v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "uid-a",
			Labels: map[string]string{endpoint.ModelNameLabel: "llama", endpoint.DefaultDeploymentLabel: simDeployment}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1",
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
	}}
	f.serve(cfg)
	f.waitReady()
	testsupport.EventuallyWhy(t, "the profile of the fleet's deployment to load", func() (string, bool) {
		p := f.gw.profiles.Lookup("llama", simDeployment)
		return fmt.Sprintf("%d profiles held, the fleet's: %v", f.gw.profiles.Len(), p != nil), p != nil && p.Cost == 7
	})
	if n := f.gw.profiles.Len(); n > 4 {
		t.Errorf("%d profiles held, more than the 4 a refresh loads", n)
	}
}

func TestThePickerHoldsSLORequestsInTheModelsQueue(t *testing.T) {
	// Requests picked by a front end such as ext_proc, eight at most at once.
	f, q := startQuarterPodFleet(t)
	p := f.gw.Picker()
	pick := func(ctx context.Context, i int, strategy string) chan pickResult {
		return pickAsync(ctx, p, PickRequest{Path: PathCompletions, Strategy: strategy,
			Body: []byte(completion(simPrompt(i, 20), `,"max_tokens":40`))})
	}

	// Fill the fleet until a request waits.
	held, waiting := fillPicker(t, p, q, context.Background())
	defer func() {
		for _, k := range held {
			k.End()
		}
	}()

	// A request whose front end gives up leaves the queue at once.
	ctx, cancel := context.WithCancel(context.Background())
	gone := pick(ctx, 100, "")
	testsupport.Eventually(t, "a second request to wait", func() bool { return q.Len() == 2 })
	cancel()
	if r := <-gone; r.k != nil || r.err == nil || r.err.Status != statusClientClosed {
		t.Fatalf("the request given up ended with %+v, want 499", r)
	}
	if q.Len() != 1 {
		t.Fatalf("%d requests wait, want the first one only", q.Len())
	}

	// An algorithm that does not hold refuses, saying when to retry.
	r := <-pick(context.Background(), 101, "slo-least-load")
	if v, ok := r.err.RetryAfterHeader(); r.k != nil || r.err.Status != http.StatusTooManyRequests || r.err.Code != codeSLONoCapacity || !ok || v == "" {
		t.Fatalf("slo-least-load on a full fleet: %+v, want 429 %s with a Retry-After", r, codeSLONoCapacity)
	}

	// The request waiting is picked once a request ends.
	held[0].End()
	held = held[1:]
	r = <-waiting
	if r.err != nil || r.k.Endpoint() == nil {
		t.Fatalf("the waiting request ended with %+v, want a pod", r)
	}
	held = append(held, r.k)
	for outcome, want := range map[string]float64{"cancelled": 1, "rejected": 1} {
		if n := testsupport.MetricValue(t, f.gw.registry, "kvgate_slo_requests_total", map[string]string{"outcome": outcome}); n != want {
			t.Errorf("%s requests %v, want %v", outcome, n, want)
		}
	}
}

// pickResult is what Picker.Pick returned.
type pickResult struct {
	k   *Pick
	err *Error
}

// pickAsync picks in with p, until ctx ends, in a goroutine of its own; the
// result comes on the channel returned.
func pickAsync(ctx context.Context, p *Picker, in PickRequest) chan pickResult {
	ch := make(chan pickResult, 1)
	go func() {
		k, err := p.Pick(ctx, in)
		ch <- pickResult{k, err}
	}()
	return ch
}

// fillPicker picks requests with p, one after the other until ctx ends,
// until one waits in q (the fleet of startQuarterPodFleet is full), and
// returns the picks made and the channel of the one waiting.
func fillPicker(t *testing.T, p *Picker, q *slo.QueueRouter, ctx context.Context) (held []*Pick, waiting chan pickResult) {
	t.Helper()
	for i := 0; ; i++ {
		if i > 16 {
			t.Fatalf("%d requests were picked at once: the fleet did not fill", len(held))
		}
		ch := pickAsync(ctx, p, PickRequest{Path: PathCompletions, ClientRequestID: fmt.Sprint("hold-", i),
			Body: []byte(completion(simPrompt(1000+i, 20), `,"max_tokens":40`))})
		testsupport.Eventually(t, fmt.Sprintf("request %d to be picked or queued", i), func() bool { return len(ch) == 1 || q.Len() == 1 })
		if q.Len() == 1 {
			return held, ch
		}
		r := <-ch
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
		held = append(held, r.k)
	}
}

// fillPickerEmptyQueue fills the fleet through p until a request waits
// in q, gives that one up, and waits until it left q: the fleet is full
// and the queue empty. It returns the requests picked, for the caller to
// end.
func fillPickerEmptyQueue(t *testing.T, p *Picker, q *slo.QueueRouter) (held []*Pick) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	held, gone := fillPicker(t, p, q, ctx)
	cancel()
	if r := <-gone; r.k != nil {
		t.Fatalf("the request given up was picked: %+v", r)
	}
	testsupport.Eventually(t, "the request given up to leave the queue", func() bool { return q.Len() == 0 })
	return held
}

func TestEverySLOQueueRefusalAnswersItsOwnErrorCode(t *testing.T) {
	for reason, want := range map[string]string{
		slo.ReasonQueueFull: codeSLOQueueFull, slo.ReasonUnmeetable: codeSLOUnmeetable, slo.ReasonNoCapacity: codeSLONoCapacity,
		slo.ReasonExpired: codeSLOExpired, slo.ReasonDisplaced: codeSLODisplaced, slo.ReasonSheddable: codeSLOSheddable,
	} {
		if got := sloCodes[reason]; got != want {
			t.Errorf("a request the queue refused with %s is answered with code %q, want %q", reason, got, want)
		}
	}
}

// testObjectives are InferenceObjectives as the Gateway API Inference
// Extension gives them: interactive requests go first, batch ones are
// sheddable.
var testObjectives = objectiveMap{"interactive": 10, "batch": -1}

// unsaturated never finds the simulated engines saturated, so that only
// the SLO queue refuses sheddable requests, however late a loaded machine
// scrapes the pods.
var unsaturated = SaturationConfig{QueueDepth: 1 << 20, KVCacheUtilization: 1, MetricsStaleness: time.Hour}

// sloAnswer is how a request sent through the proxy ended: its status, its
// error's code and its Retry-After, or err when no response came whole.
type sloAnswer struct {
	status     int
	code       string
	retryAfter string
	pod        string // HeaderTargetPodName
	err        error
}

// sendObjective sends through the proxy at url a completion of prompt
// simPrompt(n, 20) with extra body members, with X-Request-Id id and, when
// objective is not "", HeaderInferenceObjective, until ctx ends. Its one
// answer comes on the channel returned once its body was read whole.
func sendObjective(ctx context.Context, url string, n int, id, objective, extra string) chan sloAnswer {
	var headers map[string]string
	if objective != "" {
		headers = map[string]string{HeaderInferenceObjective: objective}
	}
	return sendWithHeaders(ctx, url, n, id, headers, extra)
}

// sendWithHeaders is sendObjective with headers of its own in place of
// the objective's.
func sendWithHeaders(ctx context.Context, url string, n int, id string, headers map[string]string, extra string) chan sloAnswer {
	ch := make(chan sloAnswer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions",
			strings.NewReader(completion(simPrompt(n, 20), extra)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Request-Id", id)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ch <- sloAnswer{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		a := sloAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get(HeaderRetryAfter),
			pod: resp.Header.Get(HeaderTargetPodName), err: err}
		var e apiError
		if resp.StatusCode != http.StatusOK && json.Unmarshal(body, &e) == nil {
			a.code = e.Error.Code
		}
		ch <- a
	}()
	return ch
}

// holdQuarterPodFleet fills the fleet of startQuarterPodFleet through its
// proxy with streamed requests that generate for minutes, until one more
// has to wait in q (that one's client then goes away), and returns how many
// hold it and release, which ends them; release also runs when the test
// ends.
func holdQuarterPodFleet(t *testing.T, f *testFleet, q *slo.QueueRouter, order *openedOrder) (held int, release func()) {
	t.Helper()
	var cancels []context.CancelFunc
	var answers []chan sloAnswer
	release = func() {
		for _, cancel := range cancels {
			cancel()
		}
		for _, a := range answers {
			<-a
		}
		cancels, answers = nil, nil
	}
	t.Cleanup(release)
	for i := 0; ; i++ {
		if i > 16 {
			t.Fatalf("%d requests were sent at once: the fleet did not fill", i)
		}
		ctx, cancel := context.WithCancel(context.Background())
		opened := order.len()
		a := sendObjective(ctx, f.url, 1000+i, fmt.Sprint("hold-", i), "", `,"max_tokens":8000,"stream":true`)
		testsupport.Eventually(t, fmt.Sprintf("holding request %d to be routed or queued", i), func() bool {
			return order.len() > opened || q.Len() == 1
		})
		if q.Len() == 0 {
			cancels, answers = append(cancels, cancel), append(answers, a)
			continue
		}
		cancel()
		if r := <-a; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("the request that found the fleet full ended with %+v, want its client gone", r)
		}
		testsupport.Eventually(t, "the request whose client went away to leave the queue", func() bool { return q.Len() == 0 })
		return len(cancels), release
	}
}

// waitingClients returns the client request ids of the requests waiting in
// q, by the number of their gateway request id (requestNumber).
func waitingClients(q *slo.QueueRouter) map[int]string {
	m := map[int]string{}
	for _, w := range q.Status().Waiting {
		m[requestNumber(w.RequestID)] = w.ClientRequestID
	}
	return m
}

// sentClients returns the client request ids of clients, by gateway
// request number, in the order order saw their attempts open.
func sentClients(order *openedOrder, clients map[int]string) []string {
	var sent []string
	for _, n := range order.list() {
		if c, ok := clients[n]; ok {
			sent = append(sent, c)
		}
	}
	return sent
}

func TestSLOQueueSendsHigherPriorityObjectivesFirstAndShedsSheddableOnesThatWouldWait(t *testing.T) {
	// The fleet is full. Requests without an objective (priority 0) wait,
	// then requests of the interactive objective (10): once capacity frees,
	// the interactive ones are sent first, though they came later; a batch
	// request (sheddable) is refused at once rather than wait.
	f, q := startQuarterPodFleetWith(t, func(c *Config) { c.Objectives, c.Saturation = testObjectives, unsaturated })
	var order openedOrder
	f.gw.ledger.Observe(order.observer())
	_, release := holdQuarterPodFleet(t, f, q, &order)

	answers := map[string]chan sloAnswer{}
	queue := func(n int, id, objective string) {
		waiting := q.Len()
		answers[id] = sendObjective(context.Background(), f.url, n, id, objective, `,"max_tokens":4`)
		testsupport.Eventually(t, id+" to wait", func() bool { return q.Len() == waiting+1 })
	}
	for i := range 3 {
		queue(i, fmt.Sprint("plain-", i), "")
	}
	for i := range 3 {
		queue(10+i, fmt.Sprint("interactive-", i), "interactive")
	}
	want := []string{"interactive-0", "interactive-1", "interactive-2", "plain-0", "plain-1", "plain-2"}

	// GET /debug/slo lists the waiting requests in the order they will be
	// sent, each with its priority.
	var v struct {
		Models []struct {
			Queue *struct {
				Waiting []struct {
					ClientRequestID string `json:"clientRequestID"`
					Priority        *int   `json:"priority"`
				} `json:"waiting"`
			} `json:"queue"`
		} `json:"models"`
	}
	status, body := get(t, f.url+"/debug/slo")
	if status != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil || len(v.Models) != 1 || v.Models[0].Queue == nil {
		t.Fatalf("GET /debug/slo: %d %s", status, body)
	}
	var shown []string
	for _, w := range v.Models[0].Queue.Waiting {
		wantPriority := map[bool]int{true: 10, false: 0}[strings.HasPrefix(w.ClientRequestID, "interactive-")]
		if w.Priority == nil {
			t.Errorf("GET /debug/slo shows waiting request %s without a priority: %s", w.ClientRequestID, body)
		} else if *w.Priority != wantPriority {
			t.Errorf("GET /debug/slo shows waiting request %s with priority %d, want %d", w.ClientRequestID, *w.Priority, wantPriority)
		}
		shown = append(shown, w.ClientRequestID)
	}
	if !slices.Equal(shown, want) {
		t.Errorf("GET /debug/slo lists the waiting requests as %v, want %v", shown, want)
	}

	// A sheddable request would have to wait: it is refused at once.
	shed := sendObjective(context.Background(), f.url, 20, "batch-0", "batch", `,"max_tokens":4`)
	testsupport.Eventually(t, "the sheddable request to be answered or to wait", func() bool { return len(shed) == 1 || q.Len() > 6 })
	if q.Len() > 6 {
		t.Fatalf("the sheddable request waits, want it refused at once")
	}
	if r := <-shed; r.status != http.StatusTooManyRequests || r.code != codeSLOSheddable || r.retryAfter == "" {
		t.Errorf("the sheddable request: %+v, want 429 %s with a Retry-After", r, codeSLOSheddable)
	}

	clients := waitingClients(q)
	release()
	for id, a := range answers {
		if r := <-a; r.err != nil || r.status != http.StatusOK {
			t.Errorf("%s: %+v, want 200", id, r)
		}
	}
	if sent := sentClients(&order, clients); !slices.Equal(sent, want) {
		t.Errorf("the waiting requests were sent in the order %v, want %v: the higher priority first, then by deadline", sent, want)
	}
	if n := testsupport.MetricValue(t, f.gw.registry, "kvgate_slo_requests_total", map[string]string{"outcome": "shed"}); n != 1 {
		t.Errorf("kvgate_slo_requests_total{outcome=\"shed\"} = %v, want 1", n)
	}
}

func TestAHigherPriorityObjectiveTakesTheLatestLowerPriorityPlaceInAFullSLOQueue(t *testing.T) {
	// The queue holds three requests. It fills with requests without an
	// objective; each interactive request arriving then takes the place of
	// the one of the latest deadline, which is answered 429 slo_displaced,
	// while one more request without an objective finds the queue full.
	// Every request ends once, with one answer.
	f, q := startQuarterPodFleetWith(t, func(c *Config) {
		c.Objectives, c.Saturation, c.SLO.MaxQueueLength = testObjectives, unsaturated, 3
	})
	var order openedOrder
	f.gw.ledger.Observe(order.observer())
	held, release := holdQuarterPodFleet(t, f, q, &order)

	answers := map[string]chan sloAnswer{}
	send := func(n int, id, objective string) chan sloAnswer {
		answers[id] = sendObjective(context.Background(), f.url, n, id, objective, `,"max_tokens":4`)
		return answers[id]
	}
	for i := range 3 {
		send(i, fmt.Sprint("plain-", i), "")
		testsupport.Eventually(t, fmt.Sprintf("plain-%d to wait", i), func() bool { return q.Len() == i+1 })
	}
	// refusedFor sends a request to the full queue and returns the
	// request refused for it: the one that left the queue, or itself.
	refused := map[string]sloAnswer{}
	refusedFor := func(n int, id, objective string) string {
		send(n, id, objective)
		var gone string
		testsupport.Eventually(t, "a request to be refused for "+id, func() bool {
			for other, a := range answers {
				if len(a) == 1 {
					gone = other
					return true
				}
			}
			return false
		})
		refused[gone] = <-answers[gone]
		delete(answers, gone)
		return gone
	}
	for _, r := range []struct {
		n                      int
		id, objective, refused string
	}{
		{10, "interactive-0", "interactive", "plain-2"},
		{3, "plain-3", "", "plain-3"},
		{11, "interactive-1", "interactive", "plain-1"},
	} {
		if gone := refusedFor(r.n, r.id, r.objective); gone != r.refused {
			t.Fatalf("%s arriving at the full queue refused %s (%+v), want %s", r.id, gone, refused[gone], r.refused)
		}
	}
	for id, code := range map[string]string{"plain-2": codeSLODisplaced, "plain-1": codeSLODisplaced, "plain-3": codeSLOQueueFull} {
		if r := refused[id]; r.status != http.StatusTooManyRequests || r.code != code || r.retryAfter == "" {
			t.Errorf("%s: %+v, want 429 %s with a Retry-After", id, r, code)
		}
	}
	want := []string{"interactive-0", "interactive-1", "plain-0"}
	clients := waitingClients(q)
	if len(clients) != len(want) {
		t.Fatalf("%d requests wait, want %v", len(clients), want)
	}

	release()
	for id, a := range answers {
		if r := <-a; r.err != nil || r.status != http.StatusOK {
			t.Errorf("%s: %+v, want 200", id, r)
		}
	}
	if sent := sentClients(&order, clients); !slices.Equal(sent, want) {
		t.Errorf("the waiting requests were sent in the order %v, want %v", sent, want)
	}
	// The holding requests, the one let go when the fleet was full, and
	// the six above: each counted once, by how it ended.
	wantOutcomes := map[string]float64{"admitted": float64(held + 3), "cancelled": 1, "displaced": 2, "rejected": 1,
		"shed": 0, "expired": 0, "dropped": 0}
	for outcome, want := range wantOutcomes {
		if n := testsupport.MetricValue(t, f.gw.registry, "kvgate_slo_requests_total", map[string]string{"outcome": outcome}); n != want {
			t.Errorf("kvgate_slo_requests_total{outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
	if n := testsupport.MetricValue(t, f.gw.registry, "kvgate_slo_requests_total", nil); n != float64(held+7) {
		t.Errorf("kvgate_slo_requests_total counts %v requests, want the %d sent", n, held+7)
	}
}

func TestThePickerSendsHigherPriorityObjectivesFirst(t *testing.T) {
	// As through the proxy: requests a front end such as ext_proc picks
	// with the interactive objective are picked before the earlier ones
	// without an objective once capacity frees.
	var reqs []PickRequest
	for i := range 3 {
		reqs = append(reqs, PickRequest{Path: PathCompletions, ClientRequestID: fmt.Sprint("plain-", i),
			Body: []byte(completion(simPrompt(i, 20), `,"max_tokens":40`))})
	}
	for i := range 3 {
		reqs = append(reqs, PickRequest{Path: PathCompletions, ClientRequestID: fmt.Sprint("interactive-", i),
			Objective: "interactive", Body: []byte(completion(simPrompt(10+i, 20), `,"max_tokens":40`))})
	}
	sent := pickedInOrder(t, func(c *Config) { c.Objectives = testObjectives }, reqs)
	want := []string{"interactive-0", "interactive-1", "interactive-2", "plain-0", "plain-1", "plain-2"}
	if !slices.Equal(sent, want) {
		t.Errorf("the waiting requests were picked in the order %v, want %v: the higher priority first, then by deadline", sent, want)
	}
}

// pickedInOrder fills, through its picker, a fleet of quarter pods
// configured by configure, queues reqs in their order (each waiting
// before the next is sent), frees the fleet, and returns the client
// request ids of reqs in the order they were picked.
func pickedInOrder(t *testing.T, configure func(*Config), reqs []PickRequest) []string {
	t.Helper()
	f, q := startQuarterPodFleetWith(t, configure)
	var order openedOrder
	f.gw.ledger.Observe(order.observer())
	p := f.gw.Picker()

	held := fillPickerEmptyQueue(t, p, q)
	defer func() {
		for _, k := range held {
			k.End()
		}
	}()
	picks := map[string]chan pickResult{}
	for _, r := range reqs {
		waiting := q.Len()
		picks[r.ClientRequestID] = pickAsync(context.Background(), p, r)
		testsupport.Eventually(t, r.ClientRequestID+" to wait", func() bool { return q.Len() == waiting+1 })
	}
	clients := waitingClients(q)

	for _, k := range held {
		k.End()
	}
	held = nil
	for id, ch := range picks {
		r := <-ch
		if r.err != nil || r.k.Endpoint() == nil {
			t.Errorf("%s ended with %+v, want a pod", id, r)
			continue
		}
		held = append(held, r.k)
	}
	return sentClients(&order, clients)
}
