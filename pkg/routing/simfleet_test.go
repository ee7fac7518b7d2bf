package routing

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/sim"
)

// workload describes a synthetic trace: requests that share one of docs
// document prefixes (popularity Zipf-distributed), each followed by a
// question of its own, arriving as a Poisson process.
type workload struct {
	requests, docs           int
	docTokens, questionToken int
	ratePerSecond            float64
	zipf                     float64
	seed                     uint64
}

type simRequest struct {
	id      string
	arrival time.Duration
	prompt  []uint32
}

// trace generates the workload's requests.
func (w workload) trace() []simRequest {
	rng := rand.New(rand.NewPCG(w.seed, 7))
	docs := make([][]uint32, w.docs)
	for i := range docs {
		docs[i] = sim.RandomPieces(rng, w.docTokens)
	}
	// Zipf weights over the documents.
	cdf := make([]float64, w.docs)
	sum := 0.0
	for i := range cdf {
		sum += 1 / math.Pow(float64(i+1), w.zipf)
		cdf[i] = sum
	}
	var out []simRequest
	at := time.Duration(0)
	for i := range w.requests {
		at += time.Duration(rng.ExpFloat64() / w.ratePerSecond * float64(time.Second))
		doc, _ := slices.BinarySearch(cdf, rng.Float64()*sum)
		p := append(slices.Clone(docs[min(doc, w.docs-1)]), sim.RandomPieces(rng, w.questionToken)...)
		out = append(out, simRequest{id: fmt.Sprint("req-", i), arrival: at, prompt: p})
	}
	return out
}

// simEngine is one engine of the fleet and what the gateway and its Store
// know of it.
type simEngine struct {
	pod     *endpoint.Endpoint
	engine  *sim.Engine
	busy    bool
	stepEnd time.Time
	// load is the engine's load record in the gateway's request ledger;
	// computed counts the prompt tokens it computed.
	load     *inflight.PodLoad
	computed int
	attempts map[string]*inflight.Handle
	// Recent measurements, as the Store derives them from vLLM's metrics.
	prefill, tpot, ttft window
}

// window keeps the last few samples of a ratio.
type window struct{ num, den []float64 }

func (w *window) add(num, den float64) {
	const keep = 32
	w.num, w.den = append(w.num, num), append(w.den, den)
	if len(w.num) > keep {
		w.num, w.den = w.num[1:], w.den[1:]
	}
}

// sums returns the sums of the numerators and denominators.
func (w *window) sums() (num, den float64) {
	for i := range w.num {
		num, den = num+w.num[i], den+w.den[i]
	}
	return num, den
}

func (w *window) ratio() (float64, bool) {
	n, d := w.sums()
	return n / d, d > 0
}

// prefillSpeed is the Store's PrefillTokensPerSecond over the window of
// prefills: computed tokens and prefill times, with the engine's recent
// inter-token latency as its step time.
func (e *simEngine) prefillSpeed() (float64, bool) {
	tokens, seconds := e.prefill.sums()
	step, _ := e.tpot.ratio()
	return cache.PrefillSample{
		ComputedTokens: tokens, Prefills: float64(len(e.prefill.num)), PrefillSeconds: seconds, StepSeconds: step,
	}.TokensPerSecond()
}

// simFleet runs engines, the index and a router in virtual time.
type simFleet struct {
	t       testing.TB
	start   time.Time
	now     time.Time
	engines []*simEngine
	byName  map[string]*simEngine
	pods    []*endpoint.Endpoint
	index   *indexer.SyncPrefixHashTable
	router  *Router
	ledger  *inflight.Ledger
	snaps   []cache.PodSnapshot

	promptTokens, cachedTokens int
	ttfts                      []float64
}

// fleetConfig is the engines' shape: small caches, chunked prefill.
var fleetConfig = sim.EngineConfig{
	BlockSize:           testBlockSize,
	NumGPUBlocks:        1024,
	MaxNumSeqs:          64,
	MaxNumBatchedTokens: 2048,
	DefaultOutputTokens: 16,
	Events:              true,
	Latency: sim.LatencyModel{
		StepOverhead:    4 * time.Millisecond,
		PrefillPerToken: 40 * time.Microsecond,
		DecodePerToken:  150 * time.Microsecond,
	},
}

// newSimFleet builds n engines of fleetConfig and a router; with truth,
// kv-aware reads the engines' caches instead of the index.
func newSimFleet(t testing.TB, n int, truth bool) *simFleet {
	lats := make([]sim.LatencyModel, n)
	for i := range lats {
		lats[i] = fleetConfig.Latency
	}
	return newSimFleetOf(t, lats, truth)
}

// newSimFleetOf builds engines of fleetConfig with the given latency
// models, one per engine, and a router.
func newSimFleetOf(t testing.TB, lats []sim.LatencyModel, truth bool) *simFleet {
	f := &simFleet{t: t, start: time.Unix(1_800_000_000, 0), byName: map[string]*simEngine{}, index: newTestIndex(t)}
	f.now = f.start
	for i, lat := range lats {
		cfg := fleetConfig
		cfg.Latency = lat
		cfg.HashSeed = fmt.Sprint("engine-", i)
		e, err := sim.NewEngine(cfg)
		if err != nil {
			t.Fatal(err)
		}
		pod := parse(testPod(fmt.Sprintf("p%d", i), fmt.Sprintf("10.0.0.%d", i+1), 0))
		se := &simEngine{pod: pod, engine: e, load: inflight.NewPodLoad(pod.ID), attempts: map[string]*inflight.Handle{}}
		f.engines = append(f.engines, se)
		f.byName[se.pod.Key.Name] = se
		f.pods = append(f.pods, se.pod)
	}
	var idx PrefixIndex = f.index
	if truth {
		idx = engineTruth{f}
	}
	clock := func() time.Time { return f.now }
	r, err := New(Config{Index: idx, Rand: rand.NewPCG(3, 4), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	f.router = r
	if f.ledger, err = inflight.New(inflight.Config{Now: clock}); err != nil {
		t.Fatal(err)
	}
	f.ledger.Observe(r.Observer())
	return f
}

// snapshots serves what the Store would know of the engines, with no
// scrape state: every engine's metrics are current.
func (f *simFleet) snapshots(out []cache.PodSnapshot) []cache.PodSnapshot {
	for _, e := range f.engines {
		q := e.engine.QueueState()
		m := cache.PodMetrics{At: f.now, Waiting: float64(q.Waiting), KVCacheUsage: q.KVCacheUsage,
			Measured: cache.HasWaiting | cache.HasKVCacheUsage}
		if v, ok := e.prefillSpeed(); ok {
			m.PrefillTokensPerSecond, m.Measured = v, m.Measured|cache.HasPrefillSpeed
		}
		if v, ok := e.tpot.ratio(); ok {
			m.AvgTPOTSeconds, m.Measured = v, m.Measured|cache.HasAvgTPOT
		}
		if v, ok := e.ttft.ratio(); ok {
			m.AvgTTFTSeconds, m.Measured = v, m.Measured|cache.HasAvgTTFT
		}
		out = append(out, cache.PodSnapshot{Endpoint: e.pod, Metrics: m, Load: e.load})
	}
	return out
}

// engineTruth matches prompts against the engines' actual caches.
type engineTruth struct{ f *simFleet }

func (o engineTruth) MatchPrefix(_, _ string, tokens []uint32, pods []string, out *indexer.MatchResult) {
	out.BlockSize, out.PromptBlocks = testBlockSize, len(tokens)/testBlockSize
	out.Pods = out.Pods[:0]
	for _, p := range pods {
		e := o.f.byName[p[len(testNamespace)+1:]]
		n := e.engine.CachedPrefixBlocks(tokens, nil)
		out.Pods = append(out.Pods, indexer.PodMatch{Pod: p, Blocks: n, Tokens: n * testBlockSize, GPUBlocks: n, GPUTokens: n * testBlockSize})
	}
}

// run routes the trace with algorithm and plays it to the end.
func (f *simFleet) run(algorithm string, trace []simRequest) {
	var d Decision
	next := 0
	for {
		var stepper *simEngine
		for _, e := range f.engines {
			if e.busy && (stepper == nil || e.stepEnd.Before(stepper.stepEnd)) {
				stepper = e
			}
		}
		arrival := next < len(trace)
		if arrival && stepper != nil && f.start.Add(trace[next].arrival).After(stepper.stepEnd) {
			arrival = false
		}
		switch {
		case arrival:
			r := trace[next]
			next++
			f.now = f.start.Add(r.arrival)
			f.arrive(algorithm, r, &d)
		case stepper != nil:
			f.now = stepper.stepEnd
			f.endStep(stepper)
		default:
			return
		}
	}
}

func (f *simFleet) arrive(algorithm string, r simRequest, d *Decision) {
	ctx := request(r.id, algorithm, r.prompt)
	f.snaps = f.snapshots(f.snaps[:0])
	if err := f.router.Route(context.Background(), ctx, f.snaps, d); err != nil {
		f.t.Fatal(err)
	}
	e := f.byName[d.Endpoint.Key.Name]
	e.attempts[r.id] = f.ledger.Admit(r.id, testModel).Route(d.Route())
	if err := e.engine.Add(sim.RequestSpec{ID: r.id, Prompt: r.prompt}, f.now); err != nil {
		f.t.Fatal(err)
	}
	f.kick(e)
}

// kick starts a step on an idle engine with work.
func (f *simFleet) kick(e *simEngine) {
	if e.busy {
		return
	}
	if end, ok := e.engine.BeginStep(f.now); ok {
		e.busy, e.stepEnd = true, end
	}
}

func (f *simFleet) endStep(e *simEngine) {
	res := e.engine.EndStep()
	e.busy = false
	if res.Batch != nil {
		if err := f.index.ApplyBatch(indexer.Stream{Pod: e.pod.ID, Model: testModel}, res.Batch); err != nil {
			f.t.Fatal(err)
		}
	}
	for _, out := range res.Outputs {
		st, tm := out.Stats, out.Stats.Timings
		if st.OutputTokens == 1 {
			f.promptTokens += st.PromptTokens
			f.cachedTokens += st.CachedTokens
			f.ttfts = append(f.ttfts, tm.TTFT().Seconds())
			e.computed += st.PromptTokens - st.CachedTokens
			e.prefill.add(float64(st.PromptTokens-st.CachedTokens), tm.FirstToken.Sub(tm.Scheduled).Seconds())
			e.ttft.add(tm.TTFT().Seconds(), 1)
			e.attempts[out.RequestID].FirstToken()
		}
		if out.Finished {
			h := e.attempts[out.RequestID]
			h.Close(inflight.Done, "")
			h.Request().End()
			delete(e.attempts, out.RequestID)
			if st.OutputTokens > 1 {
				e.tpot.add(tm.LastToken.Sub(tm.FirstToken).Seconds(), float64(st.OutputTokens-1))
			}
		}
	}
	f.kick(e)
}

// result summarises a run.
type result struct {
	hitRatio, p50, p90 float64
}

func (f *simFleet) result() result {
	slices.Sort(f.ttfts)
	q := func(p float64) float64 { return f.ttfts[int(p*float64(len(f.ttfts)-1))] }
	return result{hitRatio: float64(f.cachedTokens) / float64(f.promptTokens), p50: q(0.5), p90: q(0.9)}
}

func (r result) String() string {
	return fmt.Sprintf("hit %.3f, TTFT p50 %.0f ms p90 %.0f ms", r.hitRatio, r.p50*1000, r.p90*1000)
}
