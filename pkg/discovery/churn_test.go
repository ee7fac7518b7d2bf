package discovery

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
)

// churnPod is a pod of the churn test, eligible unless a flag says not.
func churnPod(name string, gen, port int, ready, labelled bool) *v1.Pod {
	labels := map[string]string{endpoint.ModelNameLabel: testModel}
	if labelled {
		labels[endpoint.KVEventsEnabledLabel] = "true"
	}
	cond := v1.ConditionFalse
	if ready {
		cond = v1.ConditionTrue
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "churn", Name: name, UID: types.UID(fmt.Sprintf("%s-%d", name, gen)),
			Labels: labels, Annotations: map[string]string{
				endpoint.PubPortAnnotation: strconv.Itoa(port), endpoint.ReplayPortAnnotation: strconv.Itoa(port + 1)}},
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
	// The churn must make every kind of change many times over while streams
	// deliver: 400 pod events in 40 names reach each kind dozens of times
	// and each name about ten times. The publishers keep the streams busy
	// without making the race-detected test a throughput benchmark.
	const (
		pods       = 40
		publishers = 12
		events     = 400
	)
	// Publisher j publishes chain j+1 on ports[j], a batch every 20 ms.
	var ports []int
	var pubs []*publisher.Publisher
	for j := range publishers {
		port := freePortPair(t)
		ports = append(ports, port)
		p := enginePublisher(t, "127.0.0.1", port)
		publishBatches(t, p, j+1, 0, 3)
		pubs = append(pubs, p)
	}
	stop := make(chan struct{})
	var published atomic.Int64
	published.Store(3)
	var publishing sync.WaitGroup
	publishing.Go(func() {
		for i := 3; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			for j, p := range pubs {
				if err := p.Publish(chainBatch(j+1, i, "")); err != nil {
					t.Errorf("publish batch %d of chain %d: %v", i, j+1, err)
					return
				}
			}
			published.Store(int64(i + 1))
		}
	})
	stopPublishing := sync.OnceFunc(func() {
		close(stop)
		publishing.Wait()
	})
	t.Cleanup(stopPublishing)
	baselineFDs := openFDs(t)
	leakCheck := goleak.IgnoreCurrent()

	index := newTestIndex(t)
	manager := index.newManager(t)
	store, stopStore := startStore(t, nil, nil, manager)

	rng := rand.New(rand.NewPCG(1, 2))
	live := map[string]*churnEngine{}
	gen := 0
	start := time.Now()
	for i := range events {
		if i%50 == 0 {
			checkpoint(t, manager, index, live)
		}
		name := fmt.Sprintf("pod-%d", rng.IntN(pods))
		gen++
		old := live[name]
		switch op, j := rng.IntN(10), rng.IntN(publishers); {
		case old == nil || op < 3:
			// Created, or replaced by a new pod of the same name.
			p := churnPod(name, gen, ports[j], true, true)
			store.AddOrUpdatePod(p)
			live[name] = &churnEngine{pod: p, tag: j + 1}
		case op < 7:
			// Status or label change, or the engine moved to other ports.
			p := churnPod(name, 0, ports[j], rng.IntN(3) > 0, rng.IntN(4) > 0)
			p.UID = old.pod.UID
			store.AddOrUpdatePod(p)
			live[name] = &churnEngine{pod: p, tag: j + 1}
		default:
			store.DeletePod(endpoint.Key{Namespace: "churn", Name: name})
			delete(live, name)
		}
	}
	checkpoint(t, manager, index, live)
	t.Logf("%d pod events in %v", events, time.Since(start))

	// Once the engines stop publishing, every followed pod holds exactly
	// the whole chain of the engine it follows now.
	stopPublishing()
	n := int(published.Load())
	for name, e := range live {
		if followed(e.pod) {
			key := "churn/" + name
			testsupport.Eventually(t, fmt.Sprintf("%s to hold the %d blocks of chain %d", key, n, e.tag),
				func() bool { return index.holds(key, e.tag, n) })
		}
	}

	for name := range live {
		store.DeletePod(endpoint.Key{Namespace: "churn", Name: name})
	}
	testsupport.Eventually(t, "no pod followed or known", func() bool { return len(manager.Snapshot()) == 0 })
	if got := index.pods(); len(got) != 0 {
		t.Fatalf("index holds deleted pods: %v", got)
	}
	if n := index.entries(); n != 0 {
		t.Fatalf("the index holds %d blocks once every pod is deleted", n)
	}
	stopStore()
	testsupport.Eventually(t, "goroutines of the manager and its clients gone", func() bool {
		return goleak.Find(leakCheck) == nil
	})
	testsupport.Eventually(t, "sockets closed", func() bool { return openFDs(t) <= baselineFDs })
	t.Logf("churn took %v", time.Since(start))
}

// churnEngine is a live pod of the churn test and the chain its engine
// publishes.
type churnEngine struct {
	pod *v1.Pod
	tag int
}

func followed(p *v1.Pod) bool {
	_, reason, _ := manager.TargetForPod(p, manager.DefaultStreamDefaults())
	return reason == ""
}

// checkpoint waits until the manager follows exactly the eligible pods of
// live, and checks that the index holds blocks of no other pod: the manager
// purges a pod before it stops reporting it followed.
func checkpoint(t *testing.T, m *manager.KVEventManager, index *testIndex, live map[string]*churnEngine) {
	t.Helper()
	var want []string
	for name, e := range live {
		if followed(e.pod) {
			want = append(want, "churn/"+name)
		}
	}
	slices.Sort(want)
	testsupport.Eventually(t, "manager caught up", func() bool { return slices.Equal(followedKeys(m), want) })
	for _, pod := range index.pods() {
		if !slices.Contains(want, pod) {
			t.Fatalf("index holds %s, which is not followed", pod)
		}
	}
}

func followedKeys(m *manager.KVEventManager) []string {
	var out []string
	for _, ps := range m.Snapshot() {
		if ps.State == manager.PodStateFollowed {
			out = append(out, ps.Pod)
		}
	}
	return out
}
