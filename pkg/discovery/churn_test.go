package discovery

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

// churnPod is a pod of the churn test, eligible unless a flag says not.
func churnPod(name string, gen, port int, ready, labelled bool) *v1.Pod {
	labels := map[string]string{kvevent.ModelNameLabel: "llama"}
	if labelled {
		labels[kvevent.KVEventsEnabledLabel] = "true"
	}
	cond := v1.ConditionFalse
	if ready {
		cond = v1.ConditionTrue
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "churn", Name: name, UID: types.UID(fmt.Sprintf("%s-%d", name, gen)),
			Labels: labels, Annotations: map[string]string{
				kvevent.PubPortAnnotation: strconv.Itoa(port), kvevent.ReplayPortAnnotation: strconv.Itoa(port + 1)}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1",
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: cond}}},
	}
}

func openFDs(t testing.TB) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

func TestChurnLeavesNoClientsSocketsOrIndexEntries(t *testing.T) {
	const (
		pods       = 40
		publishers = 12
		events     = 1000
	)
	var ports []int
	var pubs []*kvevent.Publisher
	for i := range publishers {
		port := freePortPair(t)
		ports = append(ports, port)
		p := enginePublisher(t, "127.0.0.1", port)
		publishBatches(t, p, i+1, 0, 3)
		pubs = append(pubs, p)
	}
	stopPublishing := make(chan struct{})
	var publishing sync.WaitGroup
	publishing.Go(func() {
		for i := 3; ; i++ {
			select {
			case <-stopPublishing:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for j, p := range pubs {
				publishBatches(t, p, j+1, i, i+1)
			}
		}
	})
	baselineFDs := openFDs(t)
	leakCheck := goleak.IgnoreCurrent()

	index := newRecordingIndex()
	manager, err := kvevent.NewKVEventManager(kvevent.ManagerConfig{Index: index, Client: testClientTemplate(),
		Registerer: prometheus.NewRegistry(), Logger: klog.Background().V(4)})
	if err != nil {
		t.Fatal(err)
	}
	store, err := cache.InitWithOptions(nil, nil, cache.InitOptions{
		Config:       cache.Config{PodMetricRefreshInterval: -1, Logger: klog.Background().V(4)},
		EnableKVSync: true, KVEventManager: manager,
	})
	if err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	live := map[string]*v1.Pod{}
	gen := 0
	start := time.Now()
	for i := range events {
		if i%50 == 0 {
			checkpoint(t, manager, index, live)
		}
		name := fmt.Sprintf("pod-%d", rng.IntN(pods))
		gen++
		old := live[name]
		switch op := rng.IntN(10); {
		case old == nil || op < 3:
			// Created, or replaced by a new pod of the same name.
			p := churnPod(name, gen, ports[rng.IntN(publishers)], true, true)
			store.AddOrUpdatePod(p)
			live[name] = p
		case op < 7:
			// Status or label change, or the engine moved to other ports.
			p := churnPod(name, 0, ports[rng.IntN(publishers)], rng.IntN(3) > 0, rng.IntN(4) > 0)
			p.UID = old.UID
			store.AddOrUpdatePod(p)
			live[name] = p
		default:
			store.DeletePod("churn", name)
			delete(live, name)
		}
	}
	checkpoint(t, manager, index, live)
	eventually(t, "every followed pod indexed", func() bool { return len(index.pods()) == len(followedKeys(manager)) })
	t.Logf("%d pod events in %v", events, time.Since(start))
	for name := range live {
		store.DeletePod("churn", name)
	}
	eventually(t, "no pod followed or known", func() bool { return len(manager.Snapshot()) == 0 })
	if got := index.pods(); len(got) != 0 {
		t.Fatalf("index holds deleted pods: %v", got)
	}
	store.Close()
	close(stopPublishing)
	publishing.Wait()
	eventually(t, "goroutines of the manager and its clients gone", func() bool {
		return goleak.Find(leakCheck) == nil
	})
	eventually(t, "sockets closed", func() bool { return openFDs(t) <= baselineFDs })
	t.Logf("churn took %v", time.Since(start))
}

// checkpoint waits until the manager follows exactly the eligible pods of
// live, and checks that the index holds no pod it does not follow.
func checkpoint(t *testing.T, m *kvevent.KVEventManager, index *recordingIndex, live map[string]*v1.Pod) {
	t.Helper()
	var want []string
	for name, p := range live {
		if _, reason, _ := kvevent.TargetForPod(p, kvevent.DefaultStreamDefaults()); reason == "" {
			want = append(want, "churn/"+name)
		}
	}
	slices.Sort(want)
	eventually(t, "manager caught up", func() bool { return slices.Equal(followedKeys(m), want) })
	for _, pod := range index.pods() {
		if !slices.Contains(want, pod) {
			t.Fatalf("index holds %s, which is not followed", pod)
		}
	}
}

func followedKeys(m *kvevent.KVEventManager) []string {
	var out []string
	for _, ps := range m.Snapshot() {
		if ps.State == kvevent.PodStateFollowed {
			out = append(out, ps.Pod)
		}
	}
	return out
}
