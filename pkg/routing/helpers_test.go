package routing

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/types"
)

const (
	testModel     = "m"
	testNamespace = "ns"
	testBlockSize = 16
)

// fakeMetrics holds pod metrics, scrape states and load records set by the
// test, the metrics all scraped at the time it was last given (zero until
// then), and gives snapshots of them as the Store does; a pod's scrape
// state is fresh unless set. The RealtimeNumRequestsRunning a test sets
// stands for requests other gateways run on the pod: it adds to the
// attempts the test opens on the pod's load record.
type fakeMetrics struct {
	mu      sync.Mutex
	v       map[string]map[string]float64 // pod name -> metric -> value
	states  map[string]cache.ScrapeState  // pod name -> scrape state
	loads   map[string]*inflight.PodLoad  // pod name -> load record
	updated time.Time                     // of every value
}

func newFakeMetrics() *fakeMetrics { return &fakeMetrics{v: map[string]map[string]float64{}} }

func (f *fakeMetrics) set(pod, metric string, v float64) *fakeMetrics {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.v[pod] == nil {
		f.v[pod] = map[string]float64{}
	}
	f.v[pod][metric] = v
	return f
}

// setScrape sets the scrape state of pod.
func (f *fakeMetrics) setScrape(pod string, s cache.ScrapeState) *fakeMetrics {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.states == nil {
		f.states = map[string]cache.ScrapeState{}
	}
	f.states[pod] = s
	return f
}

// scraped sets the time the values were last updated.
func (f *fakeMetrics) scraped(at time.Time) *fakeMetrics {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.updated = at
	return f
}

// Snapshots gives the snapshots of pods, as cache.Store.Snapshots does.
func (f *fakeMetrics) Snapshots(pods []*endpoint.Endpoint, out []cache.PodSnapshot) []cache.PodSnapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.loads == nil {
		f.loads = map[string]*inflight.PodLoad{}
	}
	for _, ep := range pods {
		name := ep.Key.Name
		load := f.loads[name]
		if load == nil {
			load = inflight.NewPodLoad(ep.ID)
			f.loads[name] = load
		}
		v := f.v[name]
		load.SetRemote(int64(v[cache.RealtimeNumRequestsRunning]), nil)
		m := cache.PodMetrics{At: f.updated}
		for _, field := range []struct {
			name string
			dst  *float64
			bit  cache.MetricBits
		}{
			{cache.NumRequestsWaiting, &m.Waiting, cache.HasWaiting},
			{cache.KVCacheUsagePerc, &m.KVCacheUsage, cache.HasKVCacheUsage},
			{cache.AvgTTFTSeconds, &m.AvgTTFTSeconds, cache.HasAvgTTFT},
			{cache.AvgTPOTSeconds, &m.AvgTPOTSeconds, cache.HasAvgTPOT},
			{cache.PrefillTokensPerSecond, &m.PrefillTokensPerSecond, cache.HasPrefillSpeed},
		} {
			if x, ok := v[field.name]; ok {
				*field.dst = x
				m.Measured |= field.bit
			}
		}
		scrape, ok := f.states[name]
		if !ok {
			scrape = cache.ScrapeFresh
		}
		out = append(out, cache.PodSnapshot{Endpoint: ep, Scrape: scrape, Metrics: m, Load: load})
	}
	return out
}

// testPods returns Running, Ready pods p0..p<n-1> serving testModel.
func testPods(n int) []*endpoint.Endpoint {
	pods := make([]*endpoint.Endpoint, n)
	for i := range pods {
		pods[i] = parse(testPod(fmt.Sprintf("p%d", i), fmt.Sprintf("10.0.0.%d", i+1), 0))
	}
	return pods
}

// parse parses pod as the Store does by default.
func parse(pod *v1.Pod) *endpoint.Endpoint { return endpoint.Parse(pod, endpoint.Options{}) }

// testPod returns a Running, Ready pod serving testModel at ip, whose
// engine listens on port (the Store's default when 0).
func testPod(name, ip string, port int) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: testNamespace, Name: name, UID: k8stypes.UID("uid-" + name),
			Labels: map[string]string{endpoint.ModelNameLabel: testModel},
		},
		Status: v1.PodStatus{
			Phase: v1.PodRunning, PodIP: ip,
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}},
		},
	}
	if port != 0 {
		p.Labels[endpoint.ModelPortLabel] = fmt.Sprint(port)
	}
	return p
}

func key(name string) string { return testNamespace + "/" + name }

// newTestIndex returns an empty prefix index.
func newTestIndex(t testing.TB) *indexer.SyncPrefixHashTable {
	t.Helper()
	idx, err := indexer.NewSyncPrefixHashTable(indexer.Config{}, nil)
	if err != nil {
		t.Fatalf("NewSyncPrefixHashTable: %v", err)
	}
	return idx
}

// holds makes pod hold the KV cache of tokens (whole blocks) of testModel
// in medium, as one BlockStored event of a request computed from the first
// token.
func holds(t testing.TB, idx *indexer.SyncPrefixHashTable, pod string, tokens []uint32, medium string) {
	t.Helper()
	holdsAs(t, idx, indexer.Stream{Pod: key(pod), Model: testModel}, "", tokens, medium)
}

// holdsAs stores tokens as blocks computed with adapter lora on stream s.
func holdsAs(t testing.TB, idx *indexer.SyncPrefixHashTable, s indexer.Stream, lora string, tokens []uint32, medium string) {
	t.Helper()
	n := len(tokens) / testBlockSize
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%s/%s/%d/%d", s.Pod, lora, medium, len(tokens), tokens[0])
	base := h.Sum64()
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = base + uint64(i)
	}
	ev := &kvevent.BlockStoredEvent{
		BlockHashes: hashes,
		TokenIDs:    tokens[:n*testBlockSize],
		BlockSize:   testBlockSize,
		LoraName:    lora,
		Medium:      medium,
		GroupIdx:    kvevent.NoGroup,
	}
	if err := idx.ApplyBatch(s, &kvevent.EventBatch{Events: []kvevent.KVEvent{ev}}); err != nil {
		t.Fatalf("ApplyBatch: %v", err)
	}
}

// prompt returns n token ids starting at from.
func prompt(from, n int) []uint32 {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(from + i)
	}
	return toks
}

// request returns a routing context for tokens, asking for algorithm.
func request(id, algorithm string, tokens []uint32) *types.RoutingContext {
	ctx := types.NewRoutingContext(id, testModel)
	ctx.Algorithm = algorithm
	ctx.PromptTokenIDs = tokens
	return ctx
}

// snapshotter gives the snapshots of pods: the test's fakeMetrics or a
// cache.Store.
type snapshotter interface {
	Snapshots(pods []*endpoint.Endpoint, out []cache.PodSnapshot) []cache.PodSnapshot
}

// newTestRouter returns a Router reading the snapshots of source (see route)
// and idx (which may be nil), with a seeded random source, its metrics on a
// fresh registry, and a request ledger on the Router's clock that it
// observes (see startPrefill), its metrics on the same registry.
func newTestRouter(t testing.TB, source snapshotter, idx PrefixIndex, adjust ...func(*Config)) (*Router, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{Rand: rand.NewPCG(1, 2), Registerer: reg}
	if idx != nil {
		cfg.Index = idx
	}
	for _, a := range adjust {
		a(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	l, err := inflight.New(inflight.Config{Now: cfg.Now, Registerer: reg})
	if err != nil {
		t.Fatalf("inflight.New: %v", err)
	}
	l.Observe(r.Observer())
	testLedgers.Store(r, l)
	testSources.Store(r, source)
	return r, reg
}

// testSources holds the snapshot source of each Router of newTestRouter.
var testSources sync.Map // *Router -> snapshotter

// snaps returns the snapshots of pods from r's source.
func snaps(r *Router, pods []*endpoint.Endpoint) []cache.PodSnapshot {
	src, _ := testSources.Load(r)
	return src.(snapshotter).Snapshots(pods, nil)
}

// testLedgers holds the request ledger of each Router of newTestRouter.
var testLedgers sync.Map // *Router -> *inflight.Ledger

// startPrefill sends the request d was decided for to its pod, as the
// gateway does: it admits a request to r's ledger and opens an attempt on
// the decision's route.
func startPrefill(r *Router, d *Decision) *inflight.Handle {
	l, _ := testLedgers.Load(r)
	return l.(*inflight.Ledger).Admit("test", testModel).Route(d.Route())
}

// inFlightPrefills returns the prefills queued in r's ledger.
func inFlightPrefills(t testing.TB, reg *prometheus.Registry) float64 {
	t.Helper()
	return testsupport.MetricValue(t, reg, "kvgate_routing_inflight_prefills", nil)
}

// route routes ctx among the snapshots of pods and fails the test on error.
func route(t testing.TB, r *Router, ctx *types.RoutingContext, pods []*endpoint.Endpoint) *Decision {
	t.Helper()
	var d Decision
	if err := r.Route(context.Background(), ctx, snaps(r, pods), &d); err != nil {
		t.Fatalf("Route(%s): %v", ctx.Algorithm, err)
	}
	return &d
}

// routeBurst routes n requests, the i-th ctx(i), among pods, sending each
// to its pod (startPrefill), where it stays in flight until the test ends,
// and returns how many each pod got, by key.
func routeBurst(t testing.TB, r *Router, pods []*endpoint.Endpoint, n int, ctx func(i int) *types.RoutingContext) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := range n {
		d := route(t, r, ctx(i), pods)
		startPrefill(r, d)
		got[d.PodKey]++
	}
	return got
}

// candidate returns the candidate entry of pod name.
func candidate(t testing.TB, d *Decision, name string) *Candidate {
	t.Helper()
	for i := range d.Candidates {
		if d.Candidates[i].Pod == key(name) {
			return &d.Candidates[i]
		}
	}
	t.Fatalf("no candidate %s in %+v", name, d.Candidates)
	return nil
}

// newManualClock returns a clock the test moves, for Config.Now.
func newManualClock() *testsupport.Clock { return testsupport.NewClock(time.Unix(1_800_000_000, 0)) }
