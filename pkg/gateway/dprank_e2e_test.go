package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
)

// dpEngine is a simulated vLLM engine of several data-parallel ranks behind
// one HTTP port, each rank publishing its KV events on its own PUB and
// replay ports (pubPort+rank, replayPort+rank), as vLLM does. It records
// the X-Data-Parallel-Rank values of each request it serves, by request id.
type dpEngine struct {
	t                             *testing.T
	ranks                         int
	httpPort, pubPort, replayPort int

	mu   sync.Mutex
	seen map[string][]string // X-Request-Id -> X-Data-Parallel-Rank values
}

// startDPEngine starts an engine of ranks data-parallel ranks; each of
// configure may change the configuration of each rank's engine core.
func startDPEngine(t *testing.T, ranks int, configure ...func(rank int, cfg *sim.EngineConfig)) *dpEngine {
	ports := testsupport.ConsecutivePorts(t, 2*ranks)
	e := &dpEngine{t: t, ranks: ranks, httpPort: testsupport.FreePorts(t, 1)[0], pubPort: ports[0], replayPort: ports[ranks],
		seen: map[string][]string{}}
	var rs []simserver.Rank
	for r := range ranks {
		pc := publisher.DefaultPublisherConfig()
		pc.Endpoint = fmt.Sprintf("tcp://[::ffff:127.0.0.1]:%d", e.pubPort+r)
		pc.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", e.replayPort+r)
		pc.ReplayPollInterval = 5 * time.Millisecond
		pc.Logger = klog.Background().V(4)
		pub, err := publisher.NewPublisher(pc)
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		cfg := sim.EngineConfig{BlockSize: testBlockSize, NumGPUBlocks: 4096}
		for _, c := range configure {
			c(r, &cfg)
		}
		rs = append(rs, simserver.Rank{Engine: cfg, Sink: pub})
	}
	srv, err := simserver.New(simserver.Config{Model: "llama", Ranks: rs})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(e.httpPort)))
	if err != nil {
		t.Fatal(err)
	}
	inner := srv.Handler()
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("X-Request-Id"); id != "" {
			e.mu.Lock()
			e.seen[id] = r.Header.Values(simserver.HeaderDataParallelRank)
			e.mu.Unlock()
		}
		inner.ServeHTTP(w, r)
	})}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Run(ctx) })
	wg.Go(func() { _ = hs.Serve(ln) })
	t.Cleanup(func() {
		_ = hs.Close()
		cancel()
		wg.Wait()
	})
	return e
}

// endpointYAML is the engine's entry in the gateway's endpoints file.
func (e *dpEngine) endpointYAML(name string) string {
	return fmt.Sprintf("- name: %s\n  address: 127.0.0.1\n  model: llama\n  port: %d\n  pubPort: %d\n  replayPort: %d\n  dpSize: %d\n",
		name, e.httpPort, e.pubPort, e.replayPort, e.ranks)
}

// rankHeader returns the X-Data-Parallel-Rank values the request id
// arrived with.
func (e *dpEngine) rankHeader(id string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.seen[id]
	if !ok {
		e.t.Fatalf("the engine served no request %s", id)
	}
	return v
}

// completeOn has rank of the engine serve a completion of prompt, which
// stores the prompt's whole blocks in that rank's cache.
func (e *dpEngine) completeOn(rank int, prompt []uint32) {
	e.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "llama", "prompt": prompt, "max_tokens": 1})
	resp, data := post(e.t, fmt.Sprintf("http://127.0.0.1:%d/v1/completions", e.httpPort), string(body),
		map[string]string{"X-data-parallel-rank": strconv.Itoa(rank)})
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("rank %d: completion: %d %s", rank, resp.StatusCode, data)
	}
}

// startDPFleet starts a gateway in front of one engine of ranks ranks,
// named dp, configured as startDPEngine does, and waits until it follows
// the engine's every rank.
func startDPFleet(t *testing.T, ranks int, configure ...func(rank int, cfg *sim.EngineConfig)) (*testFleet, *dpEngine) {
	e := startDPEngine(t, ranks, configure...)
	f := &testFleet{t: t}
	f.file = writeEndpoints(t, "endpoints:\n"+e.endpointYAML("dp"))
	f.serve(loadTestConfig(t, map[string]string{
		"KVGATE_POD_DISCOVERY":                  "static",
		"KVGATE_STATIC_ENDPOINTS_FILE":          f.file,
		"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "20",
		"KVGATE_SHUTDOWN_TIMEOUT":               "10s",
		"KVGATE_ROUTING_ALGORITHM":              routing.KVAware,
	}))
	f.waitReady()
	f.waitFollowed("static/dp")
	return f, e
}

// waitRank waits until /debug/match says kv-aware sends prompt to the pod
// dp with the rank want (-1 for none), holding blocks of it.
func (f *testFleet) waitRank(prompt []uint32, want, blocks int) {
	f.t.Helper()
	testsupport.EventuallyWhy(f.t, fmt.Sprintf("kv-aware to name rank %d for a prompt dp holds %d blocks of", want, blocks), func() (string, bool) {
		m := f.match(prompt)
		for _, d := range m.Decisions {
			if d.Algorithm == routing.KVAware && len(d.Candidates) == 1 {
				return mustJSON(d), d.DPRank == want && d.Candidates[0].MatchedBlocks == blocks
			}
		}
		return "no kv-aware decision", false
	})
}

// completeThrough sends a completion of prompt through the gateway as
// request id, with the extra headers, and returns the tokens the engine
// found cached.
func (f *testFleet) completeThrough(id string, prompt []uint32, headers map[string]string) int {
	f.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "llama", "prompt": prompt, "max_tokens": 1})
	h := map[string]string{"X-Request-Id": id}
	for k, v := range headers {
		h[k] = v
	}
	resp, data := post(f.t, f.url+"/v1/completions", string(body), h)
	if resp.StatusCode != http.StatusOK {
		f.t.Fatalf("%s: %d %s", id, resp.StatusCode, data)
	}
	var out struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		f.t.Fatalf("%s: %v: %s", id, err, data)
	}
	return out.Usage.PromptTokensDetails.CachedTokens
}

// TestARequestRunsOnTheRankHoldingItsPrefix warms a prompt on rank 1 of an
// engine of two data-parallel ranks behind one port, and sends its
// continuation through the gateway: it must reach the engine naming rank 1,
// whose cache holds the prefix, where vLLM's load balancer would have sent
// it to either rank. A prompt both ranks hold as much of, or none, leaves
// the rank to the engine, and a rank the client names itself is kept.
func TestARequestRunsOnTheRankHoldingItsPrefix(t *testing.T) {
	f, e := startDPFleet(t, 2)
	warm := simTokens(11, 4)
	e.completeOn(1, warm)
	f.waitRank(warm, 1, 4)
	next := append(append([]uint32{}, warm...), simTokens(12, 2)...)
	if cached := f.completeThrough("to-rank-1", next, nil); cached != len(warm) {
		t.Errorf("the continuation found %d tokens cached, want the %d rank 1 holds", cached, len(warm))
	}
	if got := e.rankHeader("to-rank-1"); len(got) != 1 || got[0] != "1" {
		t.Errorf("the engine got X-Data-Parallel-Rank %q, want [1]", got)
	}
	if got := f.metric(`kvgate_gateway_dp_rank_requests_total{result="pinned"}`); got != 1 {
		t.Errorf("pinned requests = %v, want 1", got)
	}

	both := simTokens(13, 4)
	e.completeOn(0, both)
	e.completeOn(1, both)
	f.waitRank(both, -1, 4)
	f.completeThrough("both-ranks", append(append([]uint32{}, both...), simTokens(14, 1)...), nil)
	if got := e.rankHeader("both-ranks"); len(got) != 0 {
		t.Errorf("a prompt both ranks hold went with X-Data-Parallel-Rank %q, want none", got)
	}
	f.completeThrough("no-rank", simTokens(15, 3), nil)
	if got := e.rankHeader("no-rank"); len(got) != 0 {
		t.Errorf("a prompt no rank holds went with X-Data-Parallel-Rank %q, want none", got)
	}

	if cached := f.completeThrough("client-rank", next, map[string]string{"X-Data-Parallel-Rank": "0"}); cached != 0 {
		t.Errorf("on the rank the client named, %d tokens were cached, want none", cached)
	}
	if got := e.rankHeader("client-rank"); len(got) != 1 || got[0] != "0" {
		t.Errorf("a request naming rank 0 reached the engine with X-Data-Parallel-Rank %q, want [0]", got)
	}
	if got := f.metric(`kvgate_gateway_dp_rank_requests_total{result="pinned"}`) +
		f.metric(`kvgate_gateway_dp_rank_requests_total{result="balanced"}`); got != 1 {
		t.Errorf("requests with a rank = %v, want only the 1 pinned", got)
	}
	testsupport.Eventually(t, "the pinned requests to end", func() bool { return f.gw.pins.pinned("static/dp", 1) == 0 })
}

// TestARankRunningTooManyPinnedRequestsIsLeftToTheEngine pins requests to
// rank 1 of an engine of two ranks until the rank runs the bound's pinned
// requests: the next request for the prefix rank 1 holds goes without a
// rank, the engine balancing it, and is counted.
func TestARankRunningTooManyPinnedRequestsIsLeftToTheEngine(t *testing.T) {
	f, e := startDPFleet(t, 2)
	warm := simTokens(21, 4)
	e.completeOn(1, warm)
	f.waitRank(warm, 1, 4)
	// Requests in flight pinned to rank 1, none to rank 0: the bound
	// holds at minRankPins.
	for range minRankPins {
		if !f.gw.pins.take("static/dp", 1, 2, scrapedRanks{}) {
			t.Fatal("the bound refused a pin below minRankPins")
		}
	}
	f.completeThrough("balanced", append(append([]uint32{}, warm...), simTokens(22, 1)...), nil)
	if got := e.rankHeader("balanced"); len(got) != 0 {
		t.Errorf("a request for a rank running %d pinned requests, its other rank none, went with X-Data-Parallel-Rank %q",
			minRankPins, got)
	}
	if got := f.metric(`kvgate_gateway_dp_rank_requests_total{result="balanced"}`); got != 1 {
		t.Errorf("balanced requests = %v, want 1", got)
	}
	for range minRankPins {
		f.gw.pins.give("static/dp", 1)
	}
	// The balanced request may have run on rank 0, which then holds the
	// prompt as well: another prompt of rank 1's is pinned again.
	warm = simTokens(23, 4)
	e.completeOn(1, warm)
	f.waitRank(warm, 1, 4)
	f.completeThrough("pinned", append(append([]uint32{}, warm...), simTokens(24, 1)...), nil)
	if got := e.rankHeader("pinned"); len(got) != 1 || got[0] != "1" {
		t.Errorf("once the rank's pinned requests ended, the request went with X-Data-Parallel-Rank %q, want [1]", got)
	}
}

// TestARankTakesPinnedRequestsUpToTheBound: a rank of a pod takes pinned
// requests while it runs fewer than minRankPins of them, or fewer than
// rankPinFactor times the mean of the pod's other ranks; an ended request
// makes room again.
func TestARankTakesPinnedRequestsUpToTheBound(t *testing.T) {
	for _, tc := range []struct {
		name   string
		size   int
		others []int // pinned requests of ranks 1.. before rank 0's
		want   int   // the pinned requests rank 0 takes
	}{
		{"the other rank runs none", 2, []int{0}, minRankPins},
		{"the other rank runs 3", 2, []int{3}, rankPinFactor * 3},
		{"three others run 1, 2, 3", 4, []int{1, 2, 3}, rankPinFactor * 2},
		{"three others run 1 in all", 4, []int{1, 0, 0}, minRankPins},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The other ranks' pins, set as they may stand after rank 0's
			// ended.
			pp := &podPins{ranks: make([]int, tc.size)}
			for r, n := range tc.others {
				pp.ranks[r+1], pp.total = n, pp.total+n
			}
			p := rankPins{pods: map[string]*podPins{"ns/p": pp}}
			got := 0
			for p.take("ns/p", 0, tc.size, scrapedRanks{}) {
				if got++; got > 100 {
					t.Fatal("rank 0 takes pins without bound")
				}
			}
			if got != tc.want {
				t.Errorf("rank 0 took %d pinned requests, want %d", got, tc.want)
			}
			p.give("ns/p", 0)
			if !p.take("ns/p", 0, tc.size, scrapedRanks{}) {
				t.Error("a pin ended and rank 0 took no other")
			}
		})
	}
	var p rankPins
	if !p.take("ns/p", 1, 2, scrapedRanks{}) {
		t.Fatal("the first pin of a pod was refused")
	}
	p.give("ns/p", 1)
	p.give("ns/p", 1)
	if len(p.pods) != 0 || p.pinned("ns/p", 1) != 0 {
		t.Errorf("a pod whose pins ended is kept: %+v", p.pods)
	}
}

// TestAnAttemptOfAnEndedRequestHoldsNoPin opens an attempt pinned to a rank
// for a request that ended meanwhile: the ledger does not open it, nor
// tell the observers of its close, and the rank's count stays clear.
func TestAnAttemptOfAnEndedRequestHoldsNoPin(t *testing.T) {
	f, _ := startDPFleet(t, 2)
	pods, err := f.gw.ready().store.ListPodsByModel("llama")
	if err != nil || len(pods) != 1 {
		t.Fatalf("pods %v, %v", pods, err)
	}
	req := f.gw.ledger.Admit("ended", "llama")
	req.End()
	x := &exchange{}
	x.d.DPRank = 1
	h := f.gw.openAttempt(x, req, inflight.Route{Pod: f.gw.ready().store.PodLoad(pods[0].Key), Endpoint: pods[0]})
	if o, _ := h.Outcome(); o != inflight.Expired || !h.Route().DPPinned {
		t.Fatalf("the attempt: outcome %q, pinned %v; want a pinned attempt, expired", o, h.Route().DPPinned)
	}
	if n := f.gw.pins.pinned(pods[0].ID, 1); n != 0 {
		t.Errorf("rank 1 counts %d pinned requests, want none", n)
	}
}

// pinned returns the attempts in flight pinned to rank of pod.
func (p *rankPins) pinned(pod string, rank int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pp := p.pods[pod]; pp != nil && rank < len(pp.ranks) {
		return pp.ranks[rank]
	}
	return 0
}

// TestARankTheEngineShowsQueueingTakesNoPin: a rank whose scraped load has
// at least minRankPins requests waiting, and a score (waiting×4 + running)
// of at least rankPinFactor times the mean of the pod's other ranks, takes
// no pin though this gateway pinned nothing to it; a rank without a queue,
// or no busier than the bound, takes one.
func TestARankTheEngineShowsQueueingTakesNoPin(t *testing.T) {
	at := time.Unix(100, 0)
	for _, tc := range []struct {
		name  string
		loads []cache.RankLoad
		want  bool
	}{
		{"no loads scraped", nil, true},
		{"queueing, the other rank idle", []cache.RankLoad{{}, {Running: 1, Waiting: 3}}, false},
		{"running many, queueing none", []cache.RankLoad{{}, {Running: 10}}, true},
		{"one waiting, the other rank idle", []cache.RankLoad{{}, {Waiting: 1}}, true},
		{"two waiting, the other rank running 4", []cache.RankLoad{{Running: 4}, {Waiting: 2}}, false},
		{"two waiting, the other rank running 5", []cache.RankLoad{{Running: 5}, {Waiting: 2}}, true},
		{"four ranks, the others' mean a quarter", []cache.RankLoad{{Running: 2}, {Waiting: 2}, {Running: 2}, {Running: 2}}, false},
		{"four ranks, the others' mean over half", []cache.RankLoad{{Running: 5}, {Waiting: 2}, {Running: 5}, {Running: 5}}, true},
		{"the scrape has no load of rank 1", []cache.RankLoad{{Running: 9}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size := max(2, len(tc.loads))
			var p rankPins
			if got := p.take("ns/p", 1, size, scrapedRanks{at: at, loads: tc.loads}); got != tc.want {
				t.Errorf("rank 1 took a pin: %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPinsSinceAScrapeCountOnTheRanksScrapedLoad: the attempts this gateway
// pinned to a rank since its pod's latest scrape began add to the rank's
// scraped load, which could not count them, until the next scrape.
func TestPinsSinceAScrapeCountOnTheRanksScrapedLoad(t *testing.T) {
	// Rank 0 runs 5 requests, 3 of them pinned by this gateway before the
	// scrape; rank 1 has 2 waiting: a score of 8 against 5, below the
	// bound of 10.
	p := rankPins{pods: map[string]*podPins{"ns/p": {total: 3, ranks: []int{3, 0}}}}
	loads := []cache.RankLoad{{Running: 5}, {Waiting: 2}}
	for i, at := range []time.Time{time.Unix(100, 0), time.Unix(101, 0)} {
		got := 0
		for p.take("ns/p", 1, 2, scrapedRanks{at: at, loads: loads}) {
			if got++; got > 100 {
				t.Fatal("rank 1 takes pins without bound")
			}
		}
		if got != 2 {
			t.Errorf("scrape %d: rank 1 took %d pins, want 2 (its score of 8 rising to the bound of 10)", i, got)
		}
	}
}

// loadRank sends the engine n completions pinned to rank, each generating
// up to maxTokens, which run until ctx ends; the returned function waits
// until they all ended.
func (e *dpEngine) loadRank(ctx context.Context, rank, n, maxTokens int) (wait func()) {
	var wg sync.WaitGroup
	for i := range n {
		body, _ := json.Marshal(map[string]any{"model": "llama", "prompt": simTokens(900+i, 2), "max_tokens": maxTokens})
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/v1/completions", e.httpPort),
				bytes.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(simserver.HeaderDataParallelRank, strconv.Itoa(rank))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
	return wg.Wait
}

// TestARankTheEngineReportsQueueingIsLeftToTheEngine loads rank 1 of an
// engine of two ranks with requests sent to the engine directly, which the
// gateway pinned none of: once the engine's metrics show rank 1 queueing,
// a request for a prefix rank 1 holds goes without a rank and is counted
// balanced; once the load drained, rank 1 is pinned again.
func TestARankTheEngineReportsQueueingIsLeftToTheEngine(t *testing.T) {
	f, e := startDPFleet(t, 2, func(rank int, cfg *sim.EngineConfig) {
		if rank == 1 {
			// One request at a time, each step 10 ms: a long one holds
			// the rank and the others queue.
			cfg.MaxNumSeqs, cfg.Latency.StepOverhead = 1, 10*time.Millisecond
		}
	})
	pods, err := f.gw.ready().store.ListPodsByModel("llama")
	if err != nil || len(pods) != 1 {
		t.Fatalf("pods %v, %v", pods, err)
	}
	ranks := func() []cache.RankLoad {
		s := f.gw.ready().store.Snapshots(pods, nil)[0]
		if s.Scrape != cache.ScrapeFresh {
			return nil
		}
		return s.Metrics.Ranks
	}
	warm := simTokens(31, 4)
	e.completeOn(1, warm)
	f.waitRank(warm, 1, 4)

	ctx, cancel := context.WithCancel(context.Background())
	wait := e.loadRank(ctx, 1, 4, 4000)
	t.Cleanup(func() { cancel(); wait() })
	testsupport.EventuallyWhy(t, "the scraped load of rank 1 to show 3 requests waiting", func() (string, bool) {
		r := ranks()
		return fmt.Sprint(r), len(r) == 2 && r[1].Waiting >= 3 && r[1].Running == 1
	})
	f.completeThrough("queued", append(append([]uint32{}, warm...), simTokens(32, 1)...), nil)
	if got := e.rankHeader("queued"); len(got) != 0 {
		t.Errorf("a request for a rank the engine reports queueing went with X-Data-Parallel-Rank %q, want none", got)
	}
	if got := f.metric(`kvgate_gateway_dp_rank_requests_total{result="balanced"}`); got != 1 {
		t.Errorf("balanced requests = %v, want 1", got)
	}

	cancel()
	wait()
	testsupport.EventuallyWhy(t, "the scraped load of rank 1 to drain", func() (string, bool) {
		r := ranks()
		return fmt.Sprint(r), len(r) == 2 && r[1] == cache.RankLoad{}
	})
	// The balanced request may have run on rank 0, which then holds the
	// prompt as well: another prompt of rank 1's is pinned.
	warm = simTokens(33, 4)
	e.completeOn(1, warm)
	f.waitRank(warm, 1, 4)
	f.completeThrough("drained", append(append([]uint32{}, warm...), simTokens(34, 1)...), nil)
	if got := e.rankHeader("drained"); len(got) != 1 || got[0] != "1" {
		t.Errorf("once rank 1's load drained, the request went with X-Data-Parallel-Rank %q, want [1]", got)
	}
	if got := f.metric(`kvgate_gateway_dp_rank_requests_total{result="pinned"}`); got != 1 {
		t.Errorf("pinned requests = %v, want 1", got)
	}
}
