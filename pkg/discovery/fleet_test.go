package discovery

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

// recordingIndex is a kvevent.KVIndex that keeps, per stream, the first
// block hash of every batch applied since the stream was last reset or
// its pod purged.
type recordingIndex struct {
	mu      sync.Mutex
	streams map[kvevent.StreamID][]kvevent.BlockHash
}

func newRecordingIndex() *recordingIndex {
	return &recordingIndex{streams: map[kvevent.StreamID][]kvevent.BlockHash{}}
}

func (x *recordingIndex) ApplyBatch(s kvevent.StreamID, b *kvevent.EventBatch) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, ev := range b.Events {
		if st, ok := ev.(*kvevent.BlockStoredEvent); ok {
			x.streams[s] = append(x.streams[s], st.BlockHashes[0])
		}
	}
	return nil
}

func (x *recordingIndex) ResetStream(s kvevent.StreamID) {
	x.mu.Lock()
	delete(x.streams, s)
	x.mu.Unlock()
}

func (x *recordingIndex) PurgePod(pod string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for s := range x.streams {
		if s.PodKey == pod {
			delete(x.streams, s)
		}
	}
}

// pods lists the pods the index holds blocks of.
func (x *recordingIndex) pods() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []string
	for s, hs := range x.streams {
		if len(hs) > 0 && !slices.Contains(out, s.PodKey) {
			out = append(out, s.PodKey)
		}
	}
	slices.Sort(out)
	return out
}

// holds reports whether the pod's rank-0 stream holds exactly the batches
// 0..n-1 of publisher tag.
func (x *recordingIndex) holds(pod string, tag, n int) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	hs := x.streams[kvevent.StreamID{PodKey: pod, Model: "llama"}]
	if len(hs) != n {
		return false
	}
	for i, h := range hs {
		if h != batchHash(tag, i) {
			return false
		}
	}
	return true
}

func batchHash(tag, i int) kvevent.BlockHash { return kvevent.BlockHash(tag*1_000_000 + i) }

// enginePublisher is a vLLM-style publisher at ip: PUB bound on pub,
// replay ROUTER on pub+1.
func enginePublisher(t testing.TB, ip string, pub int) *kvevent.Publisher {
	t.Helper()
	cfg := kvevent.DefaultPublisherConfig()
	cfg.Endpoint = fmt.Sprintf("tcp://[::ffff:%s]:%d", ip, pub)
	cfg.ReplayEndpoint = fmt.Sprintf("tcp://%s:%d", ip, pub+1)
	cfg.ReplayPollInterval = 5 * time.Millisecond
	cfg.Logger = klog.Background().V(4)
	p, err := kvevent.NewPublisher(cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// publishBatches publishes batches from..to-1 of tag, one BlockStored each.
func publishBatches(t testing.TB, p *kvevent.Publisher, tag, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		h := batchHash(tag, i)
		err := p.Publish(&kvevent.EventBatch{TS: float64(i), DataParallelRank: kvevent.NoRank,
			Events: []kvevent.KVEvent{&kvevent.BlockStoredEvent{BlockHashes: []kvevent.BlockHash{h}, TokenIDs: make([]uint32, 16), BlockSize: 16}}})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// freePortPair returns a port p such that p and p+1 were free on both
// loopback addresses the tests use.
func freePortPair(t testing.TB) int {
	t.Helper()
	for range 200 {
		p := 20000 + rand.IntN(40000)
		ok := true
		for _, addr := range []string{"127.0.0.1", "127.0.0.2"} {
			for _, port := range []int{p, p + 1} {
				l, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
				if err != nil {
					ok = false
					continue
				}
				l.Close()
			}
		}
		if ok {
			return p
		}
	}
	t.Fatal("no free port pair")
	return 0
}

// fleet is a Store fed by a KubernetesSource, with a KV event manager
// listening to it.
type fleet struct {
	client  kubernetes.Interface
	ns      string
	store   *cache.Store
	manager *kvevent.KVEventManager
	index   *recordingIndex
}

// newFleet starts a Store on the API server watching a fresh namespace.
func newFleet(t testing.TB, cfg *rest.Config) *fleet {
	t.Helper()
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{client: client, ns: fmt.Sprintf("kv-%d", rand.Uint32()), index: newRecordingIndex()}
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tmpl := testClientTemplate()
	f.manager, err = kvevent.NewKVEventManager(kvevent.ManagerConfig{Index: f.index, Client: tmpl,
		Registerer: prometheus.NewRegistry(), Logger: klog.Background().V(4)})
	if err != nil {
		t.Fatal(err)
	}
	f.store, err = cache.InitWithOptions(cfg, nil, cache.InitOptions{
		Config:       cache.Config{PodMetricRefreshInterval: -1, Logger: klog.Background().V(4)},
		PodSource:    &KubernetesSource{Namespace: f.ns, LabelSelector: kvevent.ModelNameLabel, Logger: klog.Background().V(4)},
		EnableKVSync: true, KVEventManager: f.manager,
	})
	if err != nil {
		t.Fatalf("InitWithOptions: %v", err)
	}
	t.Cleanup(f.store.Close)
	return f
}

func testClientTemplate() *kvevent.ZMQClientConfig {
	c := kvevent.DefaultZMQClientConfig("", "", "")
	c.PollTimeout = 20 * time.Millisecond
	c.ReplayTimeout = 2 * time.Second
	c.ReconnectDelay = 50 * time.Millisecond
	c.MaxReconnectDelay = 200 * time.Millisecond
	c.Logger = klog.Background().V(4)
	return c
}

// createPod creates a pod labelled for KV events (unless unlabelled) whose
// engine publishes on port, then makes it Running and Ready at ip.
func (f *fleet) createPod(t testing.TB, name, ip string, port int, unlabelled bool) *v1.Pod {
	t.Helper()
	labels := map[string]string{kvevent.ModelNameLabel: "llama"}
	if !unlabelled {
		labels[kvevent.KVEventsEnabledLabel] = "true"
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: labels, Annotations: map[string]string{
			kvevent.PubPortAnnotation: strconv.Itoa(port), kvevent.ReplayPortAnnotation: strconv.Itoa(port + 1)}},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	ctx := context.Background()
	created, err := f.client.CoreV1().Pods(f.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return f.setStatus(t, created, ip, true)
}

// setStatus sets the pod Running at ip with its Ready condition.
func (f *fleet) setStatus(t testing.TB, pod *v1.Pod, ip string, ready bool) *v1.Pod {
	t.Helper()
	cond := v1.ConditionFalse
	if ready {
		cond = v1.ConditionTrue
	}
	pod = pod.DeepCopy()
	pod.Status.Phase = v1.PodRunning
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []v1.PodIP{{IP: ip}}
	pod.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: cond}}
	updated, err := f.client.CoreV1().Pods(f.ns).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("UpdateStatus %s: %v", pod.Name, err)
	}
	return updated
}

// relabel sets or removes the KV events label.
func (f *fleet) relabel(t testing.TB, pod *v1.Pod, enabled bool) *v1.Pod {
	t.Helper()
	pod = pod.DeepCopy()
	if enabled {
		pod.Labels[kvevent.KVEventsEnabledLabel] = "true"
	} else {
		delete(pod.Labels, kvevent.KVEventsEnabledLabel)
	}
	updated, err := f.client.CoreV1().Pods(f.ns).Update(context.Background(), pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("Update %s: %v", pod.Name, err)
	}
	return updated
}

func (f *fleet) deletePod(t testing.TB, name string) {
	t.Helper()
	zero := int64(0)
	if err := f.client.CoreV1().Pods(f.ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
}

// followed lists "pod@ip" of every followed pod, sorted.
func (f *fleet) followed() []string {
	var out []string
	for _, ps := range f.manager.Snapshot() {
		if ps.State == kvevent.PodStateFollowed {
			out = append(out, ps.Pod+"@"+ps.Target.IP)
		}
	}
	return out
}

func (f *fleet) key(name string) string { return f.ns + "/" + name }
