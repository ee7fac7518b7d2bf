package manager

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

// memIndex is a KVIndex that remembers, per stream, the first hash of
// every batch applied since the stream was last reset or purged.
type memIndex struct {
	mu      sync.Mutex
	streams map[kvevent.StreamID][]kvevent.BlockHash
	resets  map[kvevent.StreamID]int
	purges  map[string]int
}

func newMemIndex() *memIndex {
	return &memIndex{streams: map[kvevent.StreamID][]kvevent.BlockHash{}, resets: map[kvevent.StreamID]int{}, purges: map[string]int{}}
}

func (x *memIndex) ApplyBatch(s kvevent.StreamID, b *kvevent.EventBatch) error {
	d := kvtest.Summarize(0, b)
	x.mu.Lock()
	x.streams[s] = append(x.streams[s], d.First)
	x.mu.Unlock()
	return nil
}

func (x *memIndex) ResetStream(s kvevent.StreamID) {
	x.mu.Lock()
	delete(x.streams, s)
	x.resets[s]++
	x.mu.Unlock()
}

func (x *memIndex) PurgePod(pod string) {
	x.mu.Lock()
	for s := range x.streams {
		if s.PodKey == pod {
			delete(x.streams, s)
		}
	}
	x.purges[pod]++
	x.mu.Unlock()
}

// held returns the first hashes held for s.
func (x *memIndex) held(s kvevent.StreamID) []kvevent.BlockHash {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.streams[s])
}

// holdsExactly reports whether s holds the batches tag, from..to-1, in order.
func (x *memIndex) holdsExactly(s kvevent.StreamID, tag, from, to int) bool {
	got := x.held(s)
	if len(got) != to-from {
		return false
	}
	for i, h := range got {
		if h != kvevent.BlockHash(tag*1_000_000+from+i) {
			return false
		}
	}
	return true
}

// podStreams returns the streams the index holds anything for.
func (x *memIndex) podStreams(pod string) []kvevent.StreamID {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []kvevent.StreamID
	for s, hs := range x.streams {
		if s.PodKey == pod && len(hs) > 0 {
			out = append(out, s)
		}
	}
	return out
}

func (x *memIndex) purgeCount(pod string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.purges[pod]
}

// testManagerClient is the client template of manager tests: short timers.
func testManagerClient() *transport.ZMQClientConfig {
	cfg := transport.DefaultZMQClientConfig("", "", "")
	cfg.PollTimeout = 20 * time.Millisecond
	cfg.ReplayTimeout = 2 * time.Second
	cfg.ReconnectDelay = 50 * time.Millisecond
	cfg.MaxReconnectDelay = 200 * time.Millisecond
	cfg.Logger = klog.Background().V(4)
	return cfg
}

// newTestManager starts a manager delivering to idx, with its metrics on a
// registry of its own.
func newTestManager(t testing.TB, idx kvevent.KVIndex, adjust func(*ManagerConfig)) (*KVEventManager, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := ManagerConfig{Index: idx, Client: testManagerClient(), Registerer: reg, Logger: klog.Background().V(4)}
	if adjust != nil {
		adjust(&cfg)
	}
	m, err := NewKVEventManager(cfg)
	if err != nil {
		t.Fatalf("NewKVEventManager: %v", err)
	}
	if err := m.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(m.Stop)
	return m, reg
}

// podSpec describes a test pod.
type podSpec struct {
	name       string
	ip         string
	model      string
	ports      kvtest.Ports
	dpSize     int
	unlabelled bool
	notReady   bool
	extra      map[string]string // more annotations
}

// makePod returns an eligible pod unless spec says otherwise.
func makePod(spec podSpec) *v1.Pod {
	if spec.model == "" {
		spec.model = "llama"
	}
	if spec.ip == "" {
		spec.ip = "127.0.0.1"
	}
	labels := map[string]string{endpoint.ModelNameLabel: spec.model}
	if !spec.unlabelled {
		labels[endpoint.KVEventsEnabledLabel] = "true"
	}
	ann := map[string]string{
		endpoint.PubPortAnnotation:    strconv.Itoa(spec.ports.Pub),
		endpoint.ReplayPortAnnotation: strconv.Itoa(spec.ports.Router),
	}
	if spec.dpSize > 0 {
		ann[endpoint.DPSizeAnnotation] = strconv.Itoa(spec.dpSize)
	}
	for k, v := range spec.extra {
		ann[k] = v
	}
	ready := v1.ConditionTrue
	if spec.notReady {
		ready = v1.ConditionFalse
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: spec.name, UID: types.UID("uid-" + spec.name),
			Labels: labels, Annotations: ann},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: spec.ip,
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: ready}}},
	}
}

// podState returns the snapshot of one pod, or a zero PodStatus.
func podState(m *KVEventManager, key string) PodStatus {
	for _, ps := range m.Snapshot() {
		if ps.Pod == key {
			return ps
		}
	}
	return PodStatus{}
}

// loopbackEndpoint binds a publisher on ip only.
func loopbackEndpoint(ip string, port int) string {
	return fmt.Sprintf("tcp://[::ffff:%s]:%d", ip, port)
}

// newPodPublisher starts a publisher for a pod at ip on ports.
func newPodPublisher(t testing.TB, ip string, ports kvtest.Ports, adjust func(*publisher.PublisherConfig)) *publisher.Publisher {
	return kvtest.NewPublisher(t, ports, func(c *publisher.PublisherConfig) {
		c.Endpoint = loopbackEndpoint(ip, ports.Pub)
		c.ReplayEndpoint = fmt.Sprintf("tcp://%s:%d", ip, ports.Router)
		if adjust != nil {
			adjust(c)
		}
	})
}

func testRegistry() *prometheus.Registry { return prometheus.NewRegistry() }
