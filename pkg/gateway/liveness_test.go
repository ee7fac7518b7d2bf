package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simanthropic"
	"github.com/kvgate/kvgate/pkg/sim/simresponses"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
)

// testDeadPodTimeout is the gateways' dead-pod timeout in the liveness
// tests: the shortest the configuration accepts with 20 ms scrapes, and
// short enough to wait several of it for what must not happen.
const testDeadPodTimeout = 3 * time.Second

// simEngine is a simulated vLLM engine (package simserver) publishing its
// KV events through a real publisher, which the gateway reaches through
// relays of its HTTP, PUB and replay ports: cutting a relay makes the
// engine vanish from the gateway's network while it keeps running.
type simEngine struct {
	t    *testing.T
	name string
	// httpPort, pubPort and replayPort are the engine's own ports.
	httpPort, pubPort, replayPort int
	http, pub, replay             *testsupport.Relay

	// store runs the engine with vLLM's Responses API store
	// (VLLM_ENABLE_RESPONSES_API_STORE=1).
	store bool

	mu     sync.Mutex
	blocks map[kvevent.BlockHash]struct{} // the blocks the engine's events say it holds
	stop   func()
}

// newSimEngine starts an engine named name and its relays.
func newSimEngine(t *testing.T, name string) *simEngine { return startSimEngine(t, name, false) }

// startSimEngine starts an engine named name and its relays, with vLLM's
// Responses API store when store is set.
func startSimEngine(t *testing.T, name string, store bool) *simEngine {
	ports := testsupport.FreePorts(t, 3)
	e := &simEngine{t: t, name: name, httpPort: ports[0], pubPort: ports[1], replayPort: ports[2], store: store}
	e.start()
	e.http = testsupport.NewRelay(t, e.addr(e.httpPort))
	e.pub = testsupport.NewRelay(t, e.addr(e.pubPort))
	e.replay = testsupport.NewRelay(t, e.addr(e.replayPort))
	t.Cleanup(func() { e.kill() })
	return e
}

func (e *simEngine) addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// start runs a fresh engine process on the engine's ports: an empty cache,
// and a publisher numbering its batches from 0.
func (e *simEngine) start() {
	e.t.Helper()
	pc := publisher.DefaultPublisherConfig()
	pc.Endpoint = fmt.Sprintf("tcp://[::ffff:127.0.0.1]:%d", e.pubPort)
	pc.ReplayEndpoint = "tcp://" + e.addr(e.replayPort)
	pc.ReplayPollInterval = 5 * time.Millisecond
	pc.Logger = klog.Background().V(4)
	pub, err := publisher.NewPublisher(pc)
	if err != nil {
		e.t.Fatalf("engine %s: %v", e.name, err)
	}
	e.mu.Lock()
	e.blocks = map[kvevent.BlockHash]struct{}{}
	e.mu.Unlock()
	srv, err := simserver.New(simserver.Config{Model: "llama", Anthropic: simanthropic.Convert, Responses: simresponses.Convert,
		ResponsesStore: e.store, Ranks: []simserver.Rank{{
			Engine: sim.EngineConfig{BlockSize: testBlockSize, NumGPUBlocks: 4096},
			Sink:   &recordingSink{e: e, pub: pub},
		}}})
	if err != nil {
		e.t.Fatalf("engine %s: %v", e.name, err)
	}
	ln, err := net.Listen("tcp", e.addr(e.httpPort))
	if err != nil {
		e.t.Fatalf("engine %s: %v", e.name, err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Run(ctx) })
	wg.Go(func() { _ = hs.Serve(ln) })
	e.stop = func() {
		_ = hs.Close()
		cancel()
		wg.Wait()
		_ = pub.Close()
	}
}

// kill ends the engine process; its ports close.
func (e *simEngine) kill() {
	if e.stop != nil {
		e.stop()
		e.stop = nil
	}
}

// cut makes the engine vanish from the gateway's network, its events and
// its metrics alike.
func (e *simEngine) cut() {
	e.http.Cut()
	e.pub.Cut()
	e.replay.Cut()
}

func (e *simEngine) restore() {
	e.http.Restore()
	e.pub.Restore()
	e.replay.Restore()
}

// endpointYAML is the engine's entry in the gateway's endpoints file: the
// relays' ports.
func (e *simEngine) endpointYAML() string {
	return fmt.Sprintf("- name: %s\n  address: 127.0.0.1\n  model: llama\n  port: %d\n  pubPort: %d\n  replayPort: %d\n",
		e.name, e.http.Port(), e.pub.Port(), e.replay.Port())
}

// complete has the engine itself serve a completion of prompt, one token
// long, which stores the prompt's whole blocks in its cache.
func (e *simEngine) complete(prompt []uint32) {
	e.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "llama", "prompt": prompt, "max_tokens": 1})
	resp, data := post(e.t, "http://"+e.addr(e.httpPort)+"/v1/completions", string(body), nil)
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("engine %s: completion: %d %s", e.name, resp.StatusCode, data)
	}
}

// held returns how many blocks the engine's events say it holds.
func (e *simEngine) held() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.blocks)
}

// recordingSink publishes an engine's batches and keeps the block set they
// describe.
type recordingSink struct {
	e   *simEngine
	pub *publisher.Publisher
}

func (s *recordingSink) Publish(b *kvevent.EventBatch) error {
	s.e.mu.Lock()
	for _, ev := range b.Events {
		switch ev := ev.(type) {
		case *kvevent.BlockStoredEvent:
			for _, h := range ev.BlockHashes {
				s.e.blocks[h] = struct{}{}
			}
		case *kvevent.BlockRemovedEvent:
			for _, h := range ev.BlockHashes {
				delete(s.e.blocks, h)
			}
		case *kvevent.AllBlocksClearedEvent:
			clear(s.e.blocks)
		}
	}
	s.e.mu.Unlock()
	return s.pub.Publish(b)
}

// simTokens is a prompt of whole blocks, distinct for each seed.
func simTokens(seed, blocks int) []uint32 {
	p := make([]uint32, blocks*testBlockSize)
	for i := range p {
		p[i] = sim.FirstPieceID + uint32(seed*7919+i*31)%(sim.VocabSize-sim.FirstPieceID)
	}
	return p
}

// startLivenessFleet starts a gateway in front of engines with the test
// dead-pod timeout, and waits until it follows every engine.
func startLivenessFleet(t *testing.T, engines ...*simEngine) *testFleet {
	f := &testFleet{t: t}
	yaml := "endpoints:\n"
	for _, e := range engines {
		yaml += e.endpointYAML()
	}
	f.file = writeEndpoints(t, yaml)
	f.serve(loadTestConfig(t, map[string]string{
		"KVGATE_POD_DISCOVERY":                  "static",
		"KVGATE_STATIC_ENDPOINTS_FILE":          f.file,
		"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "20",
		"KVGATE_SHUTDOWN_TIMEOUT":               "10s",
		"KVGATE_KV_EVENTS_DEAD_POD_TIMEOUT":     testDeadPodTimeout.String(),
	}))
	f.waitReady()
	for _, e := range engines {
		f.waitFollowed("static/" + e.name)
	}
	return f
}

// podBlocks returns the blocks the gateway's index holds for pod, and the
// pod's view in /debug/kvcache.
func (f *testFleet) podBlocks(pod string) (int, podView) {
	for _, m := range f.kvcache().Models {
		for _, p := range m.Pods {
			if p.Pod == "static/"+pod {
				n := 0
				for _, b := range p.Blocks {
					n += b
				}
				return n, p
			}
		}
	}
	return 0, podView{}
}

// matched returns how many leading blocks of tokens each pod holds, by
// /debug/match: a match, which counts as activity of the pods it credits.
func (f *testFleet) matched(tokens []uint32) map[string]int {
	out := map[string]int{}
	for _, p := range f.match(tokens).Pods {
		out[p.Pod] = p.MatchedBlocks
	}
	return out
}

// keepMatching matches prompts every 20 ms until the test ends, as routing
// does under traffic.
func (f *testFleet) keepMatching(prompts ...[]uint32) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	f.t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	bodies := make([]string, len(prompts))
	for i, p := range prompts {
		b, _ := json.Marshal(map[string]any{"model": "llama", "tokens": p})
		bodies[i] = string(b)
	}
	wg.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			for _, b := range bodies {
				_, _, _ = tryPost(f.adminURL+"/debug/match", b, nil)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
}

// waitRebuilt waits until the index holds exactly the blocks e's events
// say it holds, each of prompts whole.
func (f *testFleet) waitRebuilt(e *simEngine, prompts ...[]uint32) {
	f.t.Helper()
	testsupport.EventuallyWhy(f.t, "the index to hold exactly "+e.name+"'s blocks", func() (string, bool) {
		n, p := f.podBlocks(e.name)
		if n != e.held() {
			return fmt.Sprintf("index %d blocks, engine %d: %s", n, e.held(), mustJSON(p)), false
		}
		for _, prompt := range prompts {
			if got := f.matched(prompt)["static/"+e.name]; got != len(prompt)/testBlockSize {
				return fmt.Sprintf("a prompt matched %d blocks of %d", got, len(prompt)/testBlockSize), false
			}
		}
		return "", true
	})
}

func liveness(p podView) string {
	if p.Liveness == nil {
		return ""
	}
	return p.Liveness.State
}

func TestGatewayPurgesADeadEngineUnderTrafficAndRebuildsItWhenItReturns(t *testing.T) {
	a, b := newSimEngine(t, "a"), newSimEngine(t, "b")
	pa, pb := simTokens(1, 4), simTokens(2, 4)
	a.complete(pa)
	b.complete(pb)
	f := startLivenessFleet(t, a, b)
	f.waitRebuilt(a, pa)
	f.waitRebuilt(b, pb)
	f.keepMatching(pa, pb)

	// The death below is judged from a's last scrape: there must be one.
	testsupport.EventuallyWhy(t, "a scraped", func() (string, bool) {
		_, p := f.podBlocks("a")
		return mustJSON(p), p.Liveness != nil && p.Liveness.LastScrapeAgeSeconds != nil
	})

	// a vanishes from the network, events and metrics alike, while
	// requests keep matching its blocks; it keeps running and serving.
	died := time.Now()
	a.cut()
	testsupport.EventuallyWhy(t, "the dead engine's blocks to leave the index", func() (string, bool) {
		n, p := f.podBlocks("a")
		return mustJSON(p), n == 0 && liveness(p) == "dead"
	})
	if took := time.Since(died); took < testDeadPodTimeout {
		t.Fatalf("a purged %v after it vanished, before the dead-pod timeout %v", took, testDeadPodTimeout)
	}
	if n := f.metric(`kvgate_kv_event_pod_purges_total{reason="dead"}`); n != 1 {
		t.Errorf("dead purges = %v, want 1", n)
	}
	if n := f.metric("kvgate_kv_event_dead_pods"); n != 1 {
		t.Errorf("dead pods = %v, want 1", n)
	}
	if got := f.matched(pb)["static/b"]; got != 4 {
		t.Errorf("b matches %d blocks, want its 4", got)
	}
	_, p := f.podBlocks("a")
	if l := p.Liveness; l.EventsDownSeconds == nil || *l.EventsDownSeconds < testDeadPodTimeout.Seconds() ||
		l.LastScrapeAgeSeconds == nil || l.DeadForSeconds == nil {
		t.Errorf("dead pod's liveness %s: want its events down and its last scrape for the timeout", mustJSON(l))
	}

	// Behind the partition a serves more; it comes back, and its stream,
	// restarted when it died, rebuilds all it holds from its first batch.
	pa2 := simTokens(3, 5)
	a.complete(pa2)
	a.restore()
	f.waitRebuilt(a, pa, pa2)
	testsupport.EventuallyWhy(t, "a live again", func() (string, bool) {
		_, p := f.podBlocks("a")
		return mustJSON(p), liveness(p) == "live"
	})
	if n := f.metric(`kvgate_kv_event_pod_purges_total{reason="dead"}`); n != 1 {
		t.Errorf("dead purges = %v after a came back, want 1", n)
	}

	// a's process dies and a new one starts on its ports: the index holds
	// what the new one holds, and nothing of the old.
	a.kill()
	testsupport.EventuallyWhy(t, "the killed engine's blocks to leave the index", func() (string, bool) {
		n, p := f.podBlocks("a")
		return mustJSON(p), n == 0 && liveness(p) == "dead"
	})
	a.start()
	pa3 := simTokens(4, 3)
	a.complete(pa3)
	f.waitRebuilt(a, pa3)
	if got := f.matched(pa)["static/a"]; got != 0 {
		t.Errorf("the restarted engine matches %d blocks of a prompt only its previous process held", got)
	}
	if n := f.metric(`kvgate_kv_event_pod_purges_total{reason="dead"}`); n != 2 {
		t.Errorf("dead purges = %v, want one per death", n)
	}
}

func TestGatewayKeepsTheBlocksOfEnginesThatAreQuietOrLoseOneSignal(t *testing.T) {
	quiet, noMetrics, noEvents := newSimEngine(t, "quiet"), newSimEngine(t, "no-metrics"), newSimEngine(t, "no-events")
	prompts := map[*simEngine][]uint32{quiet: simTokens(1, 4), noMetrics: simTokens(2, 4), noEvents: simTokens(3, 4)}
	for e, p := range prompts {
		e.complete(p)
	}
	f := startLivenessFleet(t, quiet, noMetrics, noEvents)
	for e, p := range prompts {
		f.waitRebuilt(e, p)
	}
	f.keepMatching(prompts[quiet], prompts[noMetrics], prompts[noEvents])

	// quiet publishes nothing more; no-metrics' /metrics is unreachable
	// while its events flow; no-events' streams are cut while its metrics
	// answer.
	noMetrics.http.Cut()
	noEvents.pub.Cut()
	noEvents.replay.Cut()
	testsupport.EventuallyWhy(t, "no-events' stream disconnected", func() (string, bool) {
		_, p := f.podBlocks("no-events")
		return mustJSON(p), len(p.Ranks) == 1 && p.Ranks[0].Client != nil && !p.Ranks[0].Client.Connected
	})
	// For three dead-pod timeouts, no-metrics goes on serving and
	// publishing.
	var more [][]uint32
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for from, seed := time.Now(), 10; time.Since(from) < 3*testDeadPodTimeout; seed++ {
		p := simTokens(seed, 2)
		noMetrics.complete(p)
		more = append(more, p)
		<-tick.C
	}

	for e, p := range prompts {
		if e == noMetrics {
			f.waitRebuilt(e, append([][]uint32{p}, more...)...)
			continue
		}
		if n, v := f.podBlocks(e.name); n != e.held() || liveness(v) != "live" {
			t.Errorf("%s: index holds %d blocks of its %d, liveness %q; want all, live", e.name, n, e.held(), liveness(v))
		}
	}
	if n := f.metric(`kvgate_kv_event_pod_purges_total{reason="dead"}`); n != 0 {
		t.Errorf("dead purges = %v, want 0", n)
	}
}
