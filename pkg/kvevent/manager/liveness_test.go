package manager

import (
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
)

// testDeadPodTimeout is the dead-pod timeout of the liveness tests: short,
// so that the tests wait several of it for what must not happen.
const testDeadPodTimeout = 500 * time.Millisecond

// scrapeSignal stands for the Store's scrapes of each pod: a pod's scrapes
// succeed until failing is called, and succeed again after succeeding.
type scrapeSignal struct {
	mu      sync.Mutex
	failing map[endpoint.Key]time.Time // pod -> its last success
}

func newScrapeSignal() *scrapeSignal { return &scrapeSignal{failing: map[endpoint.Key]time.Time{}} }

// lastScraped is the manager's LastScraped.
func (s *scrapeSignal) lastScraped(pod endpoint.Key) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if last, ok := s.failing[pod]; ok {
		return last
	}
	return time.Now()
}

func (s *scrapeSignal) fail(pod endpoint.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing[pod] = time.Now()
}

func (s *scrapeSignal) succeed(pod endpoint.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.failing, pod)
}

// relayedEngine is a publisher reached through relays of its PUB and
// replay ports, which a test cuts to make the engine vanish from the
// network while it keeps running.
type relayedEngine struct {
	pub           *publisher.Publisher
	pubRelay      *testsupport.Relay
	replayRelay   *testsupport.Relay
	ports, routed kvtest.Ports
}

func newRelayedEngine(t *testing.T) *relayedEngine {
	e := &relayedEngine{ports: kvtest.NewPorts(t)}
	e.pub = kvtest.NewPublisher(t, e.ports, nil)
	e.pubRelay = testsupport.NewRelay(t, "127.0.0.1:"+strconv.Itoa(e.ports.Pub))
	e.replayRelay = testsupport.NewRelay(t, "127.0.0.1:"+strconv.Itoa(e.ports.Router))
	e.routed = kvtest.Ports{Pub: e.pubRelay.Port(), Router: e.replayRelay.Port()}
	return e
}

func (e *relayedEngine) cut() {
	e.pubRelay.Cut()
	e.replayRelay.Cut()
}

func (e *relayedEngine) restore() {
	e.pubRelay.Restore()
	e.replayRelay.Restore()
}

// newLivenessManager starts a manager judging liveness with scrapes and the
// test dead-pod timeout.
func newLivenessManager(t *testing.T, idx kvevent.KVIndex, scrapes *scrapeSignal,
	adjust func(*ManagerConfig)) (*KVEventManager, *prometheus.Registry) {
	return newTestManager(t, idx, func(c *ManagerConfig) {
		c.DeadPodTimeout = testDeadPodTimeout
		c.LastScraped = scrapes.lastScraped
		if adjust != nil {
			adjust(c)
		}
	})
}

func livenessState(m *KVEventManager, pod string) string {
	if l := podState(m, pod).Liveness; l != nil {
		return l.State
	}
	return ""
}

func purges(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	return testsupport.MetricValue(t, reg, "kvgate_kv_event_pod_purges_total", map[string]string{"reason": reason})
}

func TestDeadPodIsPurgedOnceAndRebuiltWhenItComesBack(t *testing.T) {
	idx, scrapes := newMemIndex(), newScrapeSignal()
	m, reg := newLivenessManager(t, idx, scrapes, nil)
	e := newRelayedEngine(t)
	kvtest.Publish(t, e.pub, 1, 0, 5)
	m.OnPodAdd(makePod(podSpec{name: "vllm", ports: e.routed}))
	s := kvevent.StreamID{PodKey: "default/vllm", Model: "llama"}
	testsupport.Eventually(t, "the engine's batches indexed", func() bool { return idx.holdsExactly(s, 1, 0, 5) })
	testsupport.Eventually(t, "the pod judged live", func() bool { return livenessState(m, "default/vllm") == LivenessLive })

	// The engine vanishes from the network: its stream and its scrapes
	// stop, while it keeps running and publishing.
	died := time.Now()
	e.cut()
	scrapes.fail(endpoint.Key{Namespace: "default", Name: "vllm"})
	kvtest.Publish(t, e.pub, 1, 5, 8)
	testsupport.EventuallyWhy(t, "the dead pod purged", func() (string, bool) {
		st := podState(m, "default/vllm")
		return mustJSON(st), idx.purgeCount("default/vllm") == 1 && len(idx.podStreams("default/vllm")) == 0 &&
			st.Liveness != nil && st.Liveness.State == LivenessDead
	})
	if took := time.Since(died); took < testDeadPodTimeout {
		t.Fatalf("purged %v after the engine vanished, before the dead-pod timeout %v", took, testDeadPodTimeout)
	}
	if n := purges(t, reg, PurgeDead); n != 1 {
		t.Errorf("purges{reason=dead} = %v, want 1", n)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_kv_event_dead_pods", nil); n != 1 {
		t.Errorf("dead pods = %v, want 1", n)
	}
	// It stays dead, and is not purged again and again.
	stillDead := time.Now()
	testsupport.Eventually(t, "five dead-pod timeouts", func() bool { return time.Since(stillDead) > 5*testDeadPodTimeout })
	if n := idx.purgeCount("default/vllm"); n != 1 || livenessState(m, "default/vllm") != LivenessDead {
		t.Fatalf("after five timeouts dead: %d purges, liveness %q; want 1 purge and still dead", n, livenessState(m, "default/vllm"))
	}

	// The same engine comes back, having published meanwhile: its stream,
	// restarted when it died, replays from its first batch and rebuilds
	// exactly what it holds.
	e.restore()
	kvtest.Publish(t, e.pub, 1, 8, 10)
	testsupport.EventuallyWhy(t, "the returning engine rebuilt exactly", func() (string, bool) {
		return mustJSON(idx.held(s)), idx.holdsExactly(s, 1, 0, 10)
	})
	testsupport.Eventually(t, "the pod live again", func() bool { return livenessState(m, "default/vllm") == LivenessLive })
	if n := testsupport.MetricValue(t, reg, "kvgate_kv_event_dead_pods", nil); n != 0 {
		t.Errorf("dead pods = %v, want 0", n)
	}
	if n := idx.purgeCount("default/vllm"); n != 1 {
		t.Errorf("%d purges, want the one of its death", n)
	}
}

func TestEitherLivenessSignalAloneKeepsAPodsBlocks(t *testing.T) {
	idx, scrapes := newMemIndex(), newScrapeSignal()
	m, reg := newLivenessManager(t, idx, scrapes, nil)
	// quiet publishes nothing after its first batches; silent's stream is
	// cut while its scrapes succeed; unscraped's scrapes fail while its
	// stream flows.
	engines := map[string]*relayedEngine{}
	for i, name := range []string{"quiet", "silent", "unscraped"} {
		e := newRelayedEngine(t)
		engines[name] = e
		kvtest.Publish(t, e.pub, i+1, 0, 3)
		m.OnPodAdd(makePod(podSpec{name: name, ports: e.routed}))
	}
	stream := func(name string) kvevent.StreamID { return kvevent.StreamID{PodKey: "default/" + name, Model: "llama"} }
	testsupport.Eventually(t, "every engine's batches indexed", func() bool {
		return idx.holdsExactly(stream("quiet"), 1, 0, 3) && idx.holdsExactly(stream("silent"), 2, 0, 3) &&
			idx.holdsExactly(stream("unscraped"), 3, 0, 3)
	})

	engines["silent"].cut()
	testsupport.Eventually(t, "the silent engine's stream disconnected", func() bool {
		st := podState(m, "default/silent")
		return len(st.Streams) == 1 && !st.Streams[0].Stats.Connected
	})
	scrapes.fail(endpoint.Key{Namespace: "default", Name: "unscraped"})
	from, next := time.Now(), 3
	kvtest.RepeatUntil(t, "five dead-pod timeouts", func() {
		kvtest.Publish(t, engines["unscraped"].pub, 3, next, next+1)
		next++
	}, func() bool { return time.Since(from) > 5*testDeadPodTimeout })
	testsupport.Eventually(t, "the unscraped engine's batches indexed", func() bool {
		return idx.holdsExactly(stream("unscraped"), 3, 0, next)
	})
	for name, tag := range map[string]int{"quiet": 1, "silent": 2} {
		if !idx.holdsExactly(stream(name), tag, 0, 3) || idx.purgeCount("default/"+name) != 0 {
			t.Errorf("%s: holds %v, %d purges; want its batches kept", name, idx.held(stream(name)), idx.purgeCount("default/"+name))
		}
	}
	for _, name := range []string{"quiet", "silent", "unscraped"} {
		if got := livenessState(m, "default/"+name); got != LivenessLive {
			t.Errorf("%s: liveness %q, want live", name, got)
		}
	}
	if n := purges(t, reg, PurgeDead); n != 0 {
		t.Errorf("purges{reason=dead} = %v, want 0", n)
	}

	// Once the silent engine's scrapes fail too, it is dead.
	scrapes.fail(endpoint.Key{Namespace: "default", Name: "silent"})
	testsupport.Eventually(t, "the silent engine purged once its scrapes fail too", func() bool {
		return idx.purgeCount("default/silent") == 1 && livenessState(m, "default/silent") == LivenessDead
	})
	// A successful scrape makes it live again, its stream still cut.
	scrapes.succeed(endpoint.Key{Namespace: "default", Name: "silent"})
	testsupport.Eventually(t, "the silent engine live again", func() bool {
		return livenessState(m, "default/silent") == LivenessLive
	})
}

func TestPodsWithoutAScrapeSignalAreJudgedByTheirStreams(t *testing.T) {
	idx := newMemIndex()
	m, reg := newTestManager(t, idx, func(c *ManagerConfig) { c.DeadPodTimeout = testDeadPodTimeout })
	e := newRelayedEngine(t)
	kvtest.Publish(t, e.pub, 1, 0, 3)
	m.OnPodAdd(makePod(podSpec{name: "vllm", ports: e.routed}))
	s := kvevent.StreamID{PodKey: "default/vllm", Model: "llama"}
	testsupport.Eventually(t, "the engine's batches indexed", func() bool { return idx.holdsExactly(s, 1, 0, 3) })
	e.cut()
	testsupport.Eventually(t, "the disconnected pod purged", func() bool {
		return idx.purgeCount("default/vllm") == 1 && livenessState(m, "default/vllm") == LivenessDead
	})
	if l := podState(m, "default/vllm").Liveness; l == nil || !l.LastScraped.IsZero() {
		t.Errorf("liveness %+v: want no last scrape", l)
	}
	if n := purges(t, reg, PurgeDead); n != 1 {
		t.Errorf("purges{reason=dead} = %v, want 1", n)
	}
}

func TestBindModePurgesADeadEngineAndFollowsItsReturn(t *testing.T) {
	router := testsupport.FreePorts(t, 1)[0]
	idx, scrapes := newMemIndex(), newScrapeSignal()
	const liveness = time.Second
	m, reg, bind := newBindManager(t, idx, func(c *ManagerConfig) {
		c.Bind.LivenessTimeout = liveness
		c.Client.ReplayTimeout, c.Client.MaxReplayDuration = 300*time.Millisecond, 300*time.Millisecond
		c.DeadPodTimeout = testDeadPodTimeout
		c.LastScraped = scrapes.lastScraped
	})
	engine := dialingPublisher(t, "127.0.0.7", bind, router, 0)
	kvtest.Publish(t, engine, 1, 0, 3)
	m.OnPodAdd(makePod(podSpec{name: "vllm", ip: "127.0.0.7", ports: kvtest.Ports{Pub: 1, Router: router}}))
	s := kvevent.StreamID{PodKey: "default/vllm", Model: "llama"}
	next := 3
	kvtest.RepeatUntil(t, "the engine's batches indexed", func() {
		kvtest.Publish(t, engine, 1, next, next+1)
		next++
	}, func() bool { return idx.holdsExactly(s, 1, 0, next) })

	died := time.Now()
	engine.Close()
	scrapes.fail(endpoint.Key{Namespace: "default", Name: "vllm"})
	testsupport.Eventually(t, "the dead engine purged", func() bool {
		return idx.purgeCount("default/vllm") == 1 && livenessState(m, "default/vllm") == LivenessDead
	})
	if took := time.Since(died); took < liveness+testDeadPodTimeout {
		t.Errorf("purged %v after the engine died, before its liveness timeout and the dead-pod timeout", took)
	}
	if n := purges(t, reg, PurgeDead); n != 1 {
		t.Errorf("purges{reason=dead} = %v, want 1", n)
	}

	// The engine restarts: its stream starts from its first batch.
	engine = dialingPublisher(t, "127.0.0.7", bind, router, 0)
	next = 0
	kvtest.RepeatUntil(t, "the restarted engine's batches indexed", func() {
		kvtest.Publish(t, engine, 2, next, next+1)
		next++
	}, func() bool { return idx.holdsExactly(s, 2, 0, next) })
	testsupport.Eventually(t, "the pod live again", func() bool { return livenessState(m, "default/vllm") == LivenessLive })
}

func TestDeadPodTimeoutMustNotBeNegative(t *testing.T) {
	_, err := NewKVEventManager(ManagerConfig{Index: newMemIndex(), DeadPodTimeout: -time.Second})
	if err == nil {
		t.Fatal("a negative DeadPodTimeout was accepted")
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
