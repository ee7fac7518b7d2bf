package manager

import (
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

// dialingPublisher starts a publisher for the pod at ip that connects to the
// gateway's bound endpoint and binds its replay ROUTER at ip.
func dialingPublisher(t testing.TB, ip string, bindPort, routerPort, rank int) *publisher.Publisher {
	return kvtest.NewPublisher(t, kvtest.Ports{Router: routerPort}, func(c *publisher.PublisherConfig) {
		c.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", bindPort)
		c.ReplayEndpoint = fmt.Sprintf("tcp://%s:%d", ip, routerPort)
		c.Topic = fmt.Sprintf("kv@%s:8000@llama", ip)
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
	testsupport.Eventually(t, "the stranger counted", func() bool {
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
				`"replayEndpoint"="tcp://127.0.0.9:6001"`, `"topic"="kv@127.0.0.9:<port>@llama"`},
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
