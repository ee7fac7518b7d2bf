package manager

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

func TestTargetForPodDecidesEligibility(t *testing.T) {
	ports := kvtest.Ports{Pub: 6000, Router: 6100}
	now := metav1.Now()
	tests := []struct {
		name   string
		pod    func() *v1.Pod
		reason IneligibleReason
		errHas string
	}{
		{"eligible", func() *v1.Pod { return makePod(podSpec{name: "a", ports: ports}) }, "", ""},
		{"label missing", func() *v1.Pod { return makePod(podSpec{name: "a", ports: ports, unlabelled: true}) }, ReasonKVEventsDisabled, ""},
		{"label not true", func() *v1.Pod {
			p := makePod(podSpec{name: "a", ports: ports})
			p.Labels[endpoint.KVEventsEnabledLabel] = "yes"
			return p
		}, ReasonKVEventsDisabled, ""},
		{"enabled by annotation", func() *v1.Pod {
			p := makePod(podSpec{name: "a", ports: ports, unlabelled: true})
			p.Annotations[endpoint.KVEventsEnabledLabel] = "true"
			return p
		}, "", ""},
		{"no model", func() *v1.Pod {
			p := makePod(podSpec{name: "a", ports: ports})
			delete(p.Labels, endpoint.ModelNameLabel)
			return p
		}, ReasonNoModel, ""},
		{"model from annotation", func() *v1.Pod {
			p := makePod(podSpec{name: "a", ports: ports})
			delete(p.Labels, endpoint.ModelNameLabel)
			p.Annotations[endpoint.ModelNameLabel] = "llama"
			return p
		}, "", ""},
		{"terminating", func() *v1.Pod {
			p := makePod(podSpec{name: "a", ports: ports})
			p.DeletionTimestamp = &now
			return p
		}, ReasonTerminating, ""},
		{"pending", func() *v1.Pod {
			p := makePod(podSpec{name: "a", ports: ports})
			p.Status.Phase = v1.PodPending
			return p
		}, ReasonNotRunning, ""},
		{"no IP", func() *v1.Pod { p := makePod(podSpec{name: "a", ports: ports}); p.Status.PodIP = ""; return p }, ReasonNoIP, ""},
		{"not ready", func() *v1.Pod { return makePod(podSpec{name: "a", ports: ports, notReady: true}) }, ReasonNotReady, ""},
		{"no ready condition", func() *v1.Pod {
			p := makePod(podSpec{name: "a", ports: ports})
			p.Status.Conditions = nil
			return p
		}, ReasonNotReady, ""},
		{"bad pub port", func() *v1.Pod {
			return makePod(podSpec{name: "a", ports: ports, extra: map[string]string{endpoint.PubPortAnnotation: "70000"}})
		}, ReasonInvalidConfig, endpoint.PubPortAnnotation},
		{"bad dp size", func() *v1.Pod {
			return makePod(podSpec{name: "a", ports: ports, extra: map[string]string{endpoint.DPSizeAnnotation: "0"}})
		}, ReasonInvalidConfig, endpoint.DPSizeAnnotation},
		{"dp ports overlap", func() *v1.Pod {
			return makePod(podSpec{name: "a", ports: kvtest.Ports{Pub: 5557, Router: 5558}, dpSize: 2})
		}, ReasonInvalidConfig, "overlap"},
		{"dp ports spaced", func() *v1.Pod {
			return makePod(podSpec{name: "a", ports: kvtest.Ports{Pub: 5557, Router: 5559}, dpSize: 2})
		}, "", ""},
		{"dp start rank", func() *v1.Pod {
			return makePod(podSpec{name: "a", ports: kvtest.Ports{Pub: 5557, Router: 5559}, dpSize: 2,
				extra: map[string]string{endpoint.DPStartRankAnnotation: "6"}})
		}, "", ""},
		{"last rank at the bound", func() *v1.Pod {
			return makePod(podSpec{name: "a", ports: ports, dpSize: 2,
				extra: map[string]string{endpoint.DPStartRankAnnotation: strconv.Itoa(endpoint.MaxDPSize - 2)}})
		}, "", ""},
		{"last rank beyond the bound", func() *v1.Pod {
			return makePod(podSpec{name: "a", ports: ports, dpSize: 2,
				extra: map[string]string{endpoint.DPStartRankAnnotation: strconv.Itoa(endpoint.MaxDPSize - 1)}})
		}, ReasonInvalidConfig, endpoint.DPStartRankAnnotation},
		{"negative dp start rank", func() *v1.Pod {
			return makePod(podSpec{name: "a", ports: ports, extra: map[string]string{endpoint.DPStartRankAnnotation: "-1"}})
		}, ReasonInvalidConfig, endpoint.DPStartRankAnnotation},
		{"dp start rank's ports beyond 65535", func() *v1.Pod {
			return makePod(podSpec{name: "a", ports: kvtest.Ports{Pub: 65530, Router: 0},
				extra: map[string]string{endpoint.DPStartRankAnnotation: "6"}})
		}, ReasonInvalidConfig, "beyond 65535"},
		{"replay disabled with any dp size", func() *v1.Pod {
			return makePod(podSpec{name: "a", ports: kvtest.Ports{Pub: 5557, Router: 0}, dpSize: 8})
		}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target, reason, err := TargetForPod(tt.pod(), DefaultStreamDefaults())
			if reason != tt.reason {
				t.Fatalf("reason = %q (%v), want %q", reason, err, tt.reason)
			}
			// An unready pod has its target, which a manager following it
			// keeps following.
			if wantTarget := reason == "" || reason == ReasonNotReady; (target != PodTarget{}) != wantTarget {
				t.Fatalf("target = %+v, want one: %v", target, wantTarget)
			}
			if (err != nil) != (tt.errHas != "") || err != nil && !strings.Contains(err.Error(), tt.errHas) {
				t.Fatalf("err = %v, want one mentioning %q", err, tt.errHas)
			}
		})
	}
}

func TestTargetForPodReadsOverridesAndDefaults(t *testing.T) {
	p := makePod(podSpec{name: "a", ip: "10.0.0.7", ports: kvtest.Ports{Pub: 7000, Router: 7100}, dpSize: 4,
		extra: map[string]string{endpoint.TopicAnnotation: "kv@10.0.0.7:8000@llama"}})
	p.Labels[endpoint.LoraIDLabel] = "12"
	p.Labels[endpoint.ModelPortLabel] = "8011"
	got, reason, err := TargetForPod(p, DefaultStreamDefaults())
	want := PodTarget{PodKey: "default/a", UID: "uid-a", IP: "10.0.0.7", Model: "llama", LoraID: "12", PubPort: 7000,
		ReplayPort: 7100, Topic: "kv@10.0.0.7:8000@llama", DPSize: 4, EnginePort: 8011}
	if reason != "" || err != nil || got != want {
		t.Fatalf("TargetForPod = %+v, %q, %v; want %+v", got, reason, err, want)
	}
	bare := makePod(podSpec{name: "b"})
	bare.Annotations = nil
	got, _, _ = TargetForPod(bare, StreamDefaults{PubPort: 5600, Topic: "kv"})
	if got.PubPort != 5600 || got.ReplayPort != 0 || got.Topic != "kv" || got.DPSize != 1 || got.EnginePort != endpoint.DefaultEnginePort {
		t.Fatalf("defaults not applied: %+v", got)
	}
	if id := got.streamID(0); id != (kvevent.StreamID{PodKey: "default/b", Model: "llama"}) {
		t.Fatalf("Stream(0) = %+v", id)
	}
}

func TestManagerFollowsAnEligiblePodIntoTheIndex(t *testing.T) {
	ports := kvtest.NewPorts(t)
	pub := newPodPublisher(t, "127.0.0.1", ports, nil)
	kvtest.Publish(t, pub, 1, 0, 5)
	idx := newMemIndex()
	m, reg := newTestManager(t, idx, nil)
	m.OnPodAdd(makePod(podSpec{name: "vllm-0", ports: ports}))
	m.OnPodAdd(makePod(podSpec{name: "other", ports: kvtest.NewPorts(t), unlabelled: true}))

	s0 := kvevent.StreamID{PodKey: "default/vllm-0", Model: "llama"}
	testsupport.Eventually(t, "the batches published before the pod was followed", func() bool { return idx.holdsExactly(s0, 1, 0, 5) })
	kvtest.Publish(t, pub, 1, 5, 8)
	testsupport.Eventually(t, "live batches", func() bool { return idx.holdsExactly(s0, 1, 0, 8) })

	st := podState(m, "default/vllm-0")
	if st.State != PodStateFollowed || len(st.Streams) != 1 || st.Streams[0].Stats.LastSeq != 7 || !st.Streams[0].Stats.Connected {
		t.Fatalf("snapshot of followed pod: %+v", st)
	}
	if o := podState(m, "default/other"); o.State != PodStateIneligible || o.Reason != ReasonKVEventsDisabled {
		t.Fatalf("snapshot of unlabelled pod: %+v", o)
	}
	if g := testsupport.MetricValue(t, reg, "kvgate_kv_event_pods", map[string]string{"state": PodStateFollowed}); g != 1 {
		t.Fatalf("followed pods gauge = %v", g)
	}
	if g := testsupport.MetricValue(t, reg, "kvgate_kv_event_ineligible_pods", map[string]string{"reason": string(ReasonKVEventsDisabled)}); g != 1 {
		t.Fatalf("ineligible pods gauge = %v", g)
	}
	if g := testsupport.MetricValue(t, reg, "aibrix_kvcache_zmq_batches_received_total", map[string]string{"pod_key": "default/vllm-0"}); g != 8 {
		t.Fatalf("client metrics not registered: batches = %v", g)
	}
}

func TestManagerStopsAndPurgesOnEveryTransition(t *testing.T) {
	ports := kvtest.NewPorts(t)
	pubA := newPodPublisher(t, "127.0.0.1", ports, nil)
	pubB := newPodPublisher(t, "127.0.0.2", ports, nil)
	kvtest.Publish(t, pubA, 1, 0, 3)
	kvtest.Publish(t, pubB, 2, 0, 4)
	idx := newMemIndex()
	m, reg := newTestManager(t, idx, nil)
	key := "default/vllm-0"
	s0 := kvevent.StreamID{PodKey: key, Model: "llama"}
	pod := makePod(podSpec{name: "vllm-0", ports: ports})
	m.OnPodAdd(pod)
	testsupport.Eventually(t, "pod followed", func() bool { return idx.holdsExactly(s0, 1, 0, 3) })

	steps := []struct {
		name   string
		pod    *v1.Pod // nil: deleted
		state  string
		holds  func() bool
		reason IneligibleReason
		purged bool // the pod was followed before the step
	}{
		// A failed readiness probe leaves the engine's KV cache as it is.
		{"not ready", makePod(podSpec{name: "vllm-0", ports: ports, notReady: true}), PodStateFollowed, func() bool { return idx.holdsExactly(s0, 1, 0, 3) }, "", false},
		{"ready again", makePod(podSpec{name: "vllm-0", ports: ports}), PodStateFollowed, func() bool { return idx.holdsExactly(s0, 1, 0, 3) }, "", false},
		// An unready pod is not followed afresh.
		{"IP changed while not ready", makePod(podSpec{name: "vllm-0", ip: "127.0.0.2", ports: ports, notReady: true}), PodStateIneligible, nil, ReasonNotReady, true},
		{"ready at the new IP", makePod(podSpec{name: "vllm-0", ip: "127.0.0.2", ports: ports}), PodStateFollowed, func() bool { return idx.holdsExactly(s0, 2, 0, 4) }, "", false},
		{"label removed", makePod(podSpec{name: "vllm-0", ip: "127.0.0.2", ports: ports, unlabelled: true}), PodStateIneligible, nil, ReasonKVEventsDisabled, true},
		{"relabelled", makePod(podSpec{name: "vllm-0", ip: "127.0.0.2", ports: ports}), PodStateFollowed, func() bool { return idx.holdsExactly(s0, 2, 0, 4) }, "", false},
		{"deleted", nil, "", nil, "", true},
	}
	for _, step := range steps {
		purges := idx.purgeCount(key)
		if step.pod == nil {
			m.OnPodDelete(pod)
		} else {
			m.OnPodUpdate(pod, step.pod)
			pod = step.pod
		}
		want := purges + btoi(step.purged)
		testsupport.Eventually(t, step.name+": purge", func() bool { return idx.purgeCount(key) == want })
		testsupport.Eventually(t, step.name+": state", func() bool {
			st := podState(m, key)
			return st.State == step.state && st.Reason == step.reason
		})
		if idx.purgeCount(key) != want {
			t.Fatalf("%s: pod purged %d times, want %d", step.name, idx.purgeCount(key), want)
		}
		if step.holds != nil {
			testsupport.Eventually(t, step.name+": index rebuilt", step.holds)
		} else if got := idx.podStreams(key); len(got) != 0 {
			t.Fatalf("%s: index still holds %v", step.name, got)
		}
	}
	if g := testsupport.MetricValue(t, reg, "kvgate_kv_event_streams", nil); g != 0 {
		t.Fatalf("streams gauge after delete = %v", g)
	}
	if g := testsupport.MetricValue(t, reg, "kvgate_kv_event_stream_stops_total", nil); g != 3 {
		t.Fatalf("stream stops = %v, want 3", g)
	}
}

func TestManagerIgnoresUpdatesThatChangeNothingItFollows(t *testing.T) {
	ports := kvtest.NewPorts(t)
	pub := newPodPublisher(t, "127.0.0.1", ports, nil)
	kvtest.Publish(t, pub, 1, 0, 2)
	idx := newMemIndex()
	m, reg := newTestManager(t, idx, nil)
	pod := makePod(podSpec{name: "vllm-0", ports: ports})
	m.OnPodAdd(pod)
	s0 := kvevent.StreamID{PodKey: "default/vllm-0", Model: "llama"}
	testsupport.Eventually(t, "pod followed", func() bool { return idx.holdsExactly(s0, 1, 0, 2) })
	for i := range 20 {
		next := pod.DeepCopy()
		next.ResourceVersion = time.Now().String()
		next.Labels["unrelated"] = string(rune('a' + i))
		m.OnPodUpdate(pod, next)
		pod = next
	}
	testsupport.Eventually(t, "updates reconciled", func() bool {
		return testsupport.MetricValue(t, reg, "kvgate_kv_event_reconciles_total", map[string]string{"result": "ok"}) >= 2
	})
	m.OnPodUpdate(pod, pod)
	kvtest.Publish(t, pub, 1, 2, 3)
	testsupport.Eventually(t, "stream kept", func() bool { return idx.holdsExactly(s0, 1, 0, 3) })
	if n := idx.purgeCount("default/vllm-0"); n != 0 {
		t.Fatalf("unchanged pod purged %d times", n)
	}
	if g := testsupport.MetricValue(t, reg, "kvgate_kv_event_stream_starts_total", nil); g != 1 {
		t.Fatalf("stream starts = %v, want 1", g)
	}
}

func TestManagerFollowsEveryDataParallelRank(t *testing.T) {
	p := testsupport.ConsecutivePorts(t, 4)
	ports := kvtest.Ports{Pub: p[0], Router: p[2]}
	for rank := range 2 {
		pub := newPodPublisher(t, "127.0.0.1", ports, func(c *publisher.PublisherConfig) { c.DataParallelRank = rank })
		kvtest.Publish(t, pub, 10+rank, 0, 3+rank)
	}
	idx := newMemIndex()
	m, _ := newTestManager(t, idx, nil)
	m.OnPodAdd(makePod(podSpec{name: "dp", ports: ports, dpSize: 2}))
	for rank := range 2 {
		s := kvevent.StreamID{PodKey: "default/dp", DPRank: rank, Model: "llama"}
		testsupport.Eventually(t, "rank's batches", func() bool { return idx.holdsExactly(s, 10+rank, 0, 3+rank) })
	}
	if st := podState(m, "default/dp"); len(st.Streams) != 2 || st.Streams[1].Stats.DPRank != 1 {
		t.Fatalf("snapshot: %+v", st)
	}
}

func TestManagerResetsTheIndexWhenThePublisherRestarts(t *testing.T) {
	ports := kvtest.NewPorts(t)
	pub := newPodPublisher(t, "127.0.0.1", ports, nil)
	kvtest.Publish(t, pub, 1, 0, 4)
	idx := newMemIndex()
	m, _ := newTestManager(t, idx, nil)
	m.OnPodAdd(makePod(podSpec{name: "vllm-0", ports: ports}))
	s0 := kvevent.StreamID{PodKey: "default/vllm-0", Model: "llama"}
	testsupport.Eventually(t, "first publisher's batches", func() bool { return idx.holdsExactly(s0, 1, 0, 4) })

	pub.Close()
	restarted := newPodPublisher(t, "127.0.0.1", ports, nil)
	kvtest.Publish(t, restarted, 2, 0, 2)
	testsupport.Eventually(t, "only the restarted publisher's batches", func() bool { return idx.holdsExactly(s0, 2, 0, 2) })
	if idx.purgeCount("default/vllm-0") != 0 {
		t.Fatal("a publisher restart purged the pod instead of resetting its stream")
	}
}

func TestManagerReportsInvalidConfigWithoutFollowing(t *testing.T) {
	idx := newMemIndex()
	m, reg := newTestManager(t, idx, nil)
	m.OnPodAdd(makePod(podSpec{name: "bad", ports: kvtest.Ports{Pub: 5557, Router: 5558}, dpSize: 2}))
	testsupport.Eventually(t, "pod reconciled", func() bool { return podState(m, "default/bad").State != "" })
	st := podState(m, "default/bad")
	if st.State != PodStateIneligible || st.Reason != ReasonInvalidConfig || !strings.Contains(st.Error, "overlap") {
		t.Fatalf("snapshot: %+v", st)
	}
	if g := testsupport.MetricValue(t, reg, "kvgate_kv_event_ineligible_pods", map[string]string{"reason": string(ReasonInvalidConfig)}); g != 1 {
		t.Fatalf("invalid_config gauge = %v", g)
	}
}

func TestManagerStopPurgesEveryFollowedPod(t *testing.T) {
	idx := newMemIndex()
	reg := testRegistry()
	m, err := NewKVEventManager(ManagerConfig{Index: idx, Client: testManagerClient(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		m.OnPodAdd(makePod(podSpec{name: "p" + string(rune('0'+i)), ports: kvtest.NewPorts(t)}))
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "pods followed", func() bool {
		n := 0
		for _, st := range m.Snapshot() {
			if st.State == PodStateFollowed {
				n++
			}
		}
		return n == 3
	})
	m.Stop()
	m.Stop()
	for i := range 3 {
		if n := idx.purgeCount("default/p" + string(rune('0'+i))); n != 1 {
			t.Fatalf("pod %d purged %d times on Stop", i, n)
		}
	}
	if err := m.Start(); err == nil {
		t.Fatal("Start after Stop succeeded")
	}
	if fams, _ := reg.Gather(); len(fams) != 0 {
		t.Fatalf("metrics still registered after Stop: %d families", len(fams))
	}
	m.OnPodAdd(makePod(podSpec{name: "late"}))
}

func TestNewKVEventManagerRejectsBadConfig(t *testing.T) {
	badClient := testManagerClient()
	badClient.PollTimeout = 0
	for name, cfg := range map[string]ManagerConfig{
		"no index":        {},
		"bad defaults":    {Index: newMemIndex(), Streams: StreamDefaults{PubPort: 0, ReplayPort: 5558}},
		"bad template":    {Index: newMemIndex(), Client: badClient},
		"negative worker": {Index: newMemIndex(), Workers: -1},
		"bad bind":        {Index: newMemIndex(), Bind: &transport.BindConfig{Endpoint: "udp://x"}},
		"liveness shorter than the probes": {Index: newMemIndex(),
			Bind: &transport.BindConfig{Endpoint: "tcp://127.0.0.1:1", LivenessTimeout: 10 * time.Second}},
	} {
		if _, err := NewKVEventManager(cfg); err == nil {
			t.Errorf("%s: NewKVEventManager succeeded", name)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A pod update restarts the pod's streams only when it changes something
// the manager's mode reads: connect mode dials the PUB and replay ports and
// subscribes to the topic, but never uses the engine's HTTP port; bind mode
// names the engine by its HTTP port and dials its replay port, but neither
// dials the PUB port nor subscribes to the pod's topic.
func TestManagerRestartsStreamsOnlyForChangesItsModeUses(t *testing.T) {
	for _, mode := range []string{"connect", "bind"} {
		t.Run(mode, func(t *testing.T) {
			ports := kvtest.NewPorts(t)
			idx := newMemIndex()
			m, reg := newTestManager(t, idx, func(c *ManagerConfig) {
				c.DeadPodTimeout = time.Hour
				if mode == "bind" {
					c.Bind = &transport.BindConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", testsupport.ConsecutivePorts(t, 1)[0])}
				}
			})
			key := "default/vllm-0"
			pod := makePod(podSpec{name: "vllm-0", ports: ports})
			m.OnPodAdd(pod)
			testsupport.Eventually(t, "pod followed", func() bool { return podState(m, key).State == PodStateFollowed })

			set := func(k, v string) func(*v1.Pod) { return func(p *v1.Pod) { p.Annotations[k] = v } }
			steps := []struct {
				name    string
				change  func(*v1.Pod)
				restart map[string]bool // by mode
			}{
				{"engine HTTP port", set(endpoint.ModelPortLabel, "8011"), map[string]bool{"connect": false, "bind": true}},
				{"PUB port", set(endpoint.PubPortAnnotation, strconv.Itoa(ports.Pub+100)), map[string]bool{"connect": true, "bind": false}},
				{"topic", set(endpoint.TopicAnnotation, "kv"), map[string]bool{"connect": true, "bind": false}},
				{"replay port", set(endpoint.ReplayPortAnnotation, strconv.Itoa(ports.Router+100)), map[string]bool{"connect": true, "bind": true}},
				{"LoRA id", func(p *v1.Pod) { p.Labels[endpoint.LoraIDLabel] = "7" }, map[string]bool{"connect": true, "bind": true}},
				{"unrelated label", func(p *v1.Pod) { p.Labels["team"] = "infra" }, map[string]bool{"connect": false, "bind": false}},
			}
			for _, step := range steps {
				purges := idx.purgeCount(key)
				starts := testsupport.MetricValue(t, reg, "kvgate_kv_event_stream_starts_total", nil)
				reconciled := testsupport.MetricValue(t, reg, "kvgate_kv_event_reconciles_total", map[string]string{"result": "ok"})
				next := pod.DeepCopy()
				step.change(next)
				m.OnPodUpdate(pod, next)
				pod = next
				testsupport.Eventually(t, step.name+": reconciled", func() bool {
					return testsupport.MetricValue(t, reg, "kvgate_kv_event_reconciles_total", map[string]string{"result": "ok"}) > reconciled
				})
				restarted := idx.purgeCount(key) != purges ||
					testsupport.MetricValue(t, reg, "kvgate_kv_event_stream_starts_total", nil) != starts
				if want := step.restart[mode]; restarted != want {
					t.Errorf("%s changed: streams restarted = %v, want %v", step.name, restarted, want)
				}
				if st := podState(m, key); st.State != PodStateFollowed {
					t.Fatalf("%s changed: pod state %+v", step.name, st)
				}
			}
		})
	}
}
