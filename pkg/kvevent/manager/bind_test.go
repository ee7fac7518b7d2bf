package manager

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/discovery"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

// dialingPublisher starts a publisher for the pod at ip that connects from
// ip to the gateway's bound endpoint and binds its replay ROUTER at ip.
func dialingPublisher(t testing.TB, ip string, bindPort, routerPort, rank int) *publisher.Publisher {
	return engineDialingFrom(t, ip, fmt.Sprintf("kv@%s:8000@llama", ip), bindPort, routerPort, rank)
}

// engineDialingFrom starts a publisher that connects from address from to
// the gateway's bound endpoint, publishing with topic, and binds its replay
// ROUTER at from.
func engineDialingFrom(t testing.TB, from, topic string, bindPort, routerPort, rank int) *publisher.Publisher {
	return kvtest.NewPublisher(t, kvtest.Ports{Router: routerPort}, func(c *publisher.PublisherConfig) {
		c.Endpoint = fmt.Sprintf("tcp://%s:0;127.0.0.1:%d", from, bindPort)
		c.ReplayEndpoint = fmt.Sprintf("tcp://%s:%d", from, routerPort)
		c.Topic = topic
		c.DataParallelRank = rank
	})
}

func TestBindModeReceivesEnginesThatDialIn(t *testing.T) {
	bind := testsupport.ConsecutivePorts(t, 2)
	routers := testsupport.ConsecutivePorts(t, 2)
	idx := newMemIndex()
	m, reg := newTestManager(t, idx, func(c *ManagerConfig) {
		c.Bind = &transport.BindConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", bind[0]), Ranks: 2}
	})

	single := dialingPublisher(t, "127.0.0.1", bind[0], routers[0], 0)
	dp0 := dialingPublisher(t, "127.0.0.2", bind[0], routers[0], 0)
	dp1 := dialingPublisher(t, "127.0.0.2", bind[0], routers[0], 1)
	stranger := dialingPublisher(t, "127.0.0.3", bind[0], routers[0], 0)
	kvtest.Publish(t, single, 1, 0, 3)
	kvtest.Publish(t, dp0, 2, 0, 2)
	kvtest.Publish(t, dp1, 3, 0, 4)

	m.OnPodAdd(makePod(podSpec{name: "single", ip: "127.0.0.1", ports: kvtest.Ports{Pub: 1, Router: routers[0]}}))
	m.OnPodAdd(makePod(podSpec{name: "dp", ip: "127.0.0.2", ports: kvtest.Ports{Pub: 1, Router: routers[0]}, dpSize: 2}))
	testsupport.Eventually(t, "both pods followed", func() bool {
		return podState(m, "default/single").State == PodStateFollowed && podState(m, "default/dp").State == PodStateFollowed
	})

	// A stream attaches to its engine on the engine's first message after
	// the pod is followed, and replays what was published before.
	streams := []struct {
		id   kvevent.StreamID
		pub  *publisher.Publisher
		tag  int
		next int
	}{
		{kvevent.StreamID{PodKey: "default/single", Model: "llama"}, single, 1, 3},
		{kvevent.StreamID{PodKey: "default/dp", Model: "llama"}, dp0, 2, 2},
		{kvevent.StreamID{PodKey: "default/dp", DPRank: 1, Model: "llama"}, dp1, 3, 4},
	}
	kvtest.RepeatUntil(t, "every stream attached and replayed", func() {
		for i := range streams {
			s := &streams[i]
			kvtest.Publish(t, s.pub, s.tag, s.next, s.next+1)
			s.next++
		}
		kvtest.Publish(t, stranger, 4, 0, 1)
	}, func() bool {
		for _, s := range streams {
			if !idx.holdsExactly(s.id, s.tag, 0, s.next) {
				return false
			}
		}
		return true
	})
	// The stranger's publisher drops what it sends before its connection
	// carries the receiver's subscription: it sends until one is counted.
	kvtest.RepeatUntil(t, "the stranger counted", func() { kvtest.Publish(t, stranger, 4, 0, 1) }, func() bool {
		return testsupport.MetricValue(t, reg, "kvgate_kv_event_bind_ignored_messages_total", map[string]string{"reason": transport.IgnoredUnknownPod}) > 0
	})
	st := podState(m, "default/dp")
	if len(st.Streams) != 2 || !st.Streams[1].Stats.Connected || st.Streams[1].PubEndpoint != fmt.Sprintf("tcp://127.0.0.1:%d", bind[1]) {
		t.Fatalf("snapshot: %+v", st)
	}

	m.OnPodDelete(makePod(podSpec{name: "single"}))
	testsupport.Eventually(t, "deleted pod purged", func() bool { return idx.purgeCount("default/single") == 1 })
	kvtest.Publish(t, single, 1, streams[0].next, streams[0].next+2)
	testsupport.Eventually(t, "the deleted pod's engine is now unknown", func() bool {
		return testsupport.MetricValue(t, reg, "kvgate_kv_event_bind_ignored_messages_total", map[string]string{"reason": transport.IgnoredUnknownPod}) >= 2
	})
	if held := idx.held(streams[0].id); len(held) != 0 {
		t.Fatalf("deleted pod still indexed: %v", held)
	}
}

// An InferencePool with several target ports stands for one engine whose
// data-parallel ranks each serve HTTP on a port of their own (vLLM's
// external load balancing); the pool's member <pod>-rank-<i> is rank i. In
// bind mode rank i dials bound socket i with the topic of its own HTTP
// port, and its member's stream receives it there.
func TestBindModeFollowsEachMemberOfAMultiPortPoolOnItsRank(t *testing.T) {
	bind := testsupport.ConsecutivePorts(t, 2)
	routers := testsupport.ConsecutivePorts(t, 2)
	idx := newMemIndex()
	m, reg := newTestManager(t, idx, func(c *ManagerConfig) {
		c.Bind = &transport.BindConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", bind[0]), Ranks: 2}
	})
	const ip = "127.0.0.2"
	rank0 := engineDialingFrom(t, ip, fmt.Sprintf("kv@%s:8000@llama", ip), bind[0], routers[0], 0)
	rank1 := engineDialingFrom(t, ip, fmt.Sprintf("kv@%s:8001@llama", ip), bind[0], routers[0], 1)
	kvtest.Publish(t, rank0, 1, 0, 2)
	kvtest.Publish(t, rank1, 2, 0, 3)

	pool := &discovery.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "dp",
		Labels: map[string]string{endpoint.ModelNameLabel: "llama", endpoint.KVEventsEnabledLabel: "true"}}}
	pool.Spec.Selector.MatchLabels = map[string]string{"app": "dp"}
	pool.Spec.TargetPorts = []struct {
		Number int32 `json:"number"`
	}{{Number: 8000}, {Number: 8001}}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "engine", UID: "uid-engine", Labels: map[string]string{"app": "dp"}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: ip,
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
	}
	for _, member := range pool.Members(pod, transport.DefaultPubPort, routers[0]) {
		m.OnPodAdd(member)
	}
	streams := []struct {
		id   kvevent.StreamID
		pub  *publisher.Publisher
		tag  int
		next int
	}{
		{kvevent.StreamID{PodKey: "default/engine-rank-0", Model: "llama"}, rank0, 1, 2},
		{kvevent.StreamID{PodKey: "default/engine-rank-1", DPRank: 1, Model: "llama"}, rank1, 2, 3},
	}
	kvtest.RepeatUntil(t, "each rank's batches indexed under its member", func() {
		for i := range streams {
			s := &streams[i]
			kvtest.Publish(t, s.pub, s.tag, s.next, s.next+1)
			s.next++
		}
	}, func() bool {
		for _, s := range streams {
			if !idx.holdsExactly(s.id, s.tag, 0, s.next) {
				return false
			}
		}
		return true
	})
	if n := testsupport.MetricValue(t, reg, "kvgate_kv_event_bind_ignored_messages_total",
		map[string]string{"reason": transport.IgnoredRankOutOfRange}); n != 0 {
		t.Errorf("%v messages ignored as %s", n, transport.IgnoredRankOutOfRange)
	}
	for i, s := range streams {
		st := podState(m, s.id.PodKey)
		if len(st.Streams) != 1 || st.Streams[0].PubEndpoint != fmt.Sprintf("tcp://127.0.0.1:%d", bind[i]) {
			t.Errorf("%s: %+v, want one stream on bound socket %d", s.id.PodKey, st, i)
		}
	}

	// A pod whose ranks reach beyond the bound sockets cannot be followed.
	m.OnPodAdd(makePod(podSpec{name: "beyond", ip: "127.0.0.3", ports: kvtest.Ports{Pub: 1, Router: routers[0]}, dpSize: 2,
		extra: map[string]string{endpoint.DPStartRankAnnotation: "1"}}))
	testsupport.EventuallyWhy(t, "the pod beyond the bound ranks failed", func() (string, bool) {
		st := podState(m, "default/beyond")
		return fmt.Sprintf("%+v", st), st.State == PodStateFailed && strings.Contains(st.Error, "ranks 1 to 2")
	})
}

func TestFollowingLogNamesTheEndpointsAndTopicInUse(t *testing.T) {
	bind := testsupport.FreePorts(t, 1)[0]
	for _, tc := range []struct {
		name    string
		bind    *transport.BindConfig
		want    []string
		wantNot string
	}{
		{
			name: "connect",
			want: []string{`"mode"="connect"`, `"pubEndpoint"="tcp://127.0.0.9:6000"`,
				`"replayEndpoint"="tcp://127.0.0.9:6001"`, `"topic"=""`},
		},
		{
			name: "bind",
			bind: &transport.BindConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", bind)},
			want: []string{`"mode"="bind"`, fmt.Sprintf(`"pubEndpoint"="tcp://127.0.0.1:%d"`, bind),
				`"replayEndpoint"="tcp://127.0.0.9:6001"`, `"topic"="kv@127.0.0.9:8000@llama"`},
			wantNot: "6000",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &kvtest.LogLines{}
			m, _ := newTestManager(t, newMemIndex(), func(c *ManagerConfig) {
				c.Bind = tc.bind
				c.Logger = funcr.New(logs.Add, funcr.Options{})
			})
			m.OnPodAdd(makePod(podSpec{name: "p", ip: "127.0.0.9", ports: kvtest.Ports{Pub: 6000, Router: 6001}}))
			testsupport.Eventually(t, "the pod to be followed", func() bool { return len(logs.Containing(`"Following KV events"`)) > 0 })
			line := logs.Containing(`"Following KV events"`)[0]
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("log line %s lacks %s", line, w)
				}
			}
			if tc.wantNot != "" && strings.Contains(line, tc.wantNot) {
				t.Errorf("log line %s names port %s, which bind mode does not use", line, tc.wantNot)
			}
			started := logs.Containing(`"Started KV event manager"`)
			if len(started) != 1 || !strings.Contains(started[0], `"mode"="`+tc.name+`"`) ||
				tc.bind != nil && strings.Contains(started[0], "pubPort") {
				t.Errorf("start logged %q", started)
			}
		})
	}
}

// newBindManager starts a manager in bind mode on a free port, which it
// returns; adjust may change the bind configuration first.
func newBindManager(t testing.TB, idx kvevent.KVIndex, adjust func(*ManagerConfig)) (*KVEventManager, *prometheus.Registry, int) {
	t.Helper()
	bind := testsupport.FreePorts(t, 1)[0]
	m, reg := newTestManager(t, idx, func(c *ManagerConfig) {
		c.Bind = &transport.BindConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", bind)}
		if adjust != nil {
			adjust(c)
		}
	})
	return m, reg, bind
}

func TestBindModeTrustsATopicOnlyFromTheAddressItNames(t *testing.T) {
	routers := testsupport.FreePorts(t, 3)
	idx := newMemIndex()
	m, reg, bind := newBindManager(t, idx, nil)
	m.OnPodAdd(makePod(podSpec{name: "real", ip: "127.0.0.2", ports: kvtest.Ports{Pub: 1, Router: routers[0]}}))
	testsupport.Eventually(t, "the pod followed", func() bool { return podState(m, "default/real").State == PodStateFollowed })

	// Another process speaks first, for the pod's identity and for the
	// pod's address with another port.
	forgers := []*publisher.Publisher{
		engineDialingFrom(t, "127.0.0.3", "kv@127.0.0.2:8000@llama", bind, routers[1], 0),
		engineDialingFrom(t, "127.0.0.3", "kv@127.0.0.2:9999@llama", bind, routers[2], 0),
	}
	mismatches := func() float64 {
		return testsupport.MetricValue(t, reg, "kvgate_kv_event_bind_ignored_messages_total",
			map[string]string{"reason": transport.IgnoredPeerMismatch})
	}
	next := 0
	kvtest.RepeatUntil(t, "both forgers ignored", func() {
		for _, f := range forgers {
			kvtest.Publish(t, f, 9, next, next+1)
		}
		next++
	}, func() bool { return mismatches() >= 2 })

	real := dialingPublisher(t, "127.0.0.2", bind, routers[0], 0)
	id := kvevent.StreamID{PodKey: "default/real", Model: "llama"}
	n := 0
	kvtest.RepeatUntil(t, "the real engine's batches, and only those", func() {
		kvtest.Publish(t, real, 1, n, n+1)
		n++
		for _, f := range forgers {
			kvtest.Publish(t, f, 9, next, next+1)
		}
		next++
	}, func() bool { return idx.holdsExactly(id, 1, 0, n) })
	st := podState(m, "default/real")
	if len(st.Streams) != 1 || st.Streams[0].Stats.PublisherRestarts != 0 || !st.Streams[0].Stats.Connected {
		t.Fatalf("stream %+v: want it connected, never restarted by the forgers", st.Streams)
	}
}

func TestBindModeKeepsTheEnginesOfOneAddressApart(t *testing.T) {
	routers := testsupport.FreePorts(t, 3)
	idx := newMemIndex()
	m, _, bind := newBindManager(t, idx, nil)
	const ip = "127.0.0.4"
	var engines []*publisher.Publisher
	var ids []kvevent.StreamID
	for i := range 3 {
		port := 8000 + i
		name := fmt.Sprintf("engine-%d", i)
		m.OnPodAdd(makePod(podSpec{name: name, ip: ip, ports: kvtest.Ports{Pub: 1, Router: routers[i]},
			extra: map[string]string{endpoint.ModelPortLabel: strconv.Itoa(port)}}))
		engines = append(engines, engineDialingFrom(t, ip, fmt.Sprintf("kv@%s:%d@llama", ip, port), bind, routers[i], 0))
		ids = append(ids, kvevent.StreamID{PodKey: "default/" + name, Model: "llama"})
	}
	// A fourth pod claims the first engine's identity: its messages could
	// belong to either, so it is not followed.
	m.OnPodAdd(makePod(podSpec{name: "twin", ip: ip, ports: kvtest.Ports{Pub: 1, Router: routers[0]},
		extra: map[string]string{endpoint.ModelPortLabel: "8000"}}))
	testsupport.Eventually(t, "the engines followed and the twin refused", func() bool {
		for i := range 3 {
			if podState(m, ids[i].PodKey).State != PodStateFollowed {
				return false
			}
		}
		tw := podState(m, "default/twin")
		return tw.State == PodStateFailed && strings.Contains(tw.Error, "already follows")
	})
	n := 0
	kvtest.RepeatUntil(t, "each engine's batches in its own stream", func() {
		for i, e := range engines {
			kvtest.Publish(t, e, 1+i, n, n+1)
		}
		n++
	}, func() bool {
		for i, id := range ids {
			if !idx.holdsExactly(id, 1+i, 0, n) {
				return false
			}
		}
		return true
	})
}

func TestBindModeTellsADeadEngineFromAQuietOne(t *testing.T) {
	routers := testsupport.FreePorts(t, 2)
	idx := newMemIndex()
	const liveness = time.Second
	m, _, bind := newBindManager(t, idx, func(c *ManagerConfig) {
		c.Bind.LivenessTimeout = liveness
		c.Client.ReplayTimeout, c.Client.MaxReplayDuration = 300*time.Millisecond, 300*time.Millisecond
	})
	quiet := dialingPublisher(t, "127.0.0.5", bind, routers[0], 0)
	dead := dialingPublisher(t, "127.0.0.6", bind, routers[1], 0)
	m.OnPodAdd(makePod(podSpec{name: "quiet", ip: "127.0.0.5", ports: kvtest.Ports{Pub: 1, Router: routers[0]}}))
	m.OnPodAdd(makePod(podSpec{name: "dead", ip: "127.0.0.6", ports: kvtest.Ports{Pub: 1, Router: routers[1]}}))
	stats := func(pod string) transport.ClientStats {
		st := podState(m, pod)
		if len(st.Streams) == 0 {
			return transport.ClientStats{}
		}
		return st.Streams[0].Stats
	}
	next := 0
	kvtest.RepeatUntil(t, "both streams connected", func() {
		kvtest.Publish(t, quiet, 1, next, next+1)
		kvtest.Publish(t, dead, 2, next, next+1)
		next++
	}, func() bool { return stats("default/quiet").Connected && stats("default/dead").Connected })

	dead.Close()
	lastLive := time.Now()
	testsupport.Eventually(t, "the dead engine's stream disconnected", func() bool {
		st := stats("default/dead")
		return !st.Connected && st.Disconnections == 1
	})
	if st := stats("default/dead"); st.DisconnectedSince.Sub(st.LastHeardTime) < liveness || st.DisconnectedSince.After(time.Now()) {
		t.Fatalf("dead stream: DisconnectedSince %v, want the liveness timeout after it was last heard (%v)",
			st.DisconnectedSince, st.LastHeardTime)
	}
	// The quiet engine publishes nothing more, yet answers the probes.
	testsupport.Eventually(t, "three liveness timeouts of silence", func() bool { return time.Since(lastLive) > 3*liveness })
	if st := stats("default/quiet"); !st.Connected || st.Disconnections != 0 || time.Since(st.LastHeardTime) > liveness {
		t.Fatalf("quiet stream %+v: want it connected, heard within %v", st, liveness)
	}

	// The engine comes back: its stream is connected again.
	dead = dialingPublisher(t, "127.0.0.6", bind, routers[1], 0)
	kvtest.RepeatUntil(t, "the revived engine's stream connected", func() { kvtest.Publish(t, dead, 3, 0, 1) },
		func() bool { return stats("default/dead").Connected })
}
