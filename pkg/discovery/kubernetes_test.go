package discovery

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testapiserver"
	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
)

func TestKubernetesPodsDriveTheKVEventManagerThroughTheStore(t *testing.T) {
	cfg := testapiserver.Config(t)
	port := freePortPair(t)
	pubA := enginePublisher(t, "127.0.0.1", port)
	pubB := enginePublisher(t, "127.0.0.2", port)
	publishBatches(t, pubA, 1, 0, 5)
	publishBatches(t, pubB, 2, 0, 3)
	f := newFleet(t, cfg)
	a, off := f.key("vllm-a"), f.key("vllm-off")

	// check waits until the manager follows exactly pod a at ip (nothing
	// when ip is empty). The manager purges a pod from the index before it
	// stops reporting the pod's old streams, so at that moment the index
	// holds nothing of any pod but the followed one; it then waits until a
	// holds exactly the first n blocks of chain tag.
	check := func(step, ip string, tag, n int) {
		t.Helper()
		var want []string
		if ip != "" {
			want = []string{a + "@" + ip}
		}
		testsupport.Eventually(t, step+": followed pods", func() bool { return slices.Equal(f.followed(), want) })
		for pod, blocks := range f.index.blocks() {
			if blocks > 0 && (ip == "" || pod != a) {
				t.Fatalf("%s: the index holds %d blocks of %s, which is not followed", step, blocks, pod)
			}
		}
		if ip != "" {
			testsupport.Eventually(t, fmt.Sprintf("%s: %s to hold the %d blocks of chain %d", step, a, n, tag),
				func() bool { return f.index.holds(a, tag, n) })
		}
	}

	pod := f.createPod(t, "vllm-a", "127.0.0.1", port, false)
	f.createPod(t, "vllm-off", "127.0.0.2", port, true)
	check("created", "127.0.0.1", 1, 5)
	if st := podStatus(f, off); st.Reason != manager.ReasonKVEventsDisabled {
		t.Fatalf("unlabelled pod: %+v", st)
	}
	if _, err := f.store.GetPod(endpoint.Key{Namespace: f.ns, Name: "vllm-off"}); err != nil {
		t.Fatalf("the Store lost the unlabelled pod: %v", err)
	}

	// A failing readiness probe takes the pod out of routing, not its
	// engine's KV cache out of the index.
	pod = f.setStatus(t, pod, "127.0.0.1", false)
	testsupport.Eventually(t, "not ready: out of routing", func() bool {
		pods, _ := f.store.ListPodsByModel(testModel)
		return !slices.ContainsFunc(pods, func(p *endpoint.Endpoint) bool { return p.ID == a })
	})
	check("not ready", "127.0.0.1", 1, 5)

	pod = f.setStatus(t, pod, "127.0.0.1", true)
	check("ready again", "127.0.0.1", 1, 5)

	pod = f.relabel(t, pod, false)
	check("label removed", "", 0, 0)
	f.relabel(t, pod, true)
	check("relabelled", "127.0.0.1", 1, 5)

	f.deletePod(t, "vllm-a")
	check("deleted", "", 0, 0)

	// A pod of the same name comes back at another address: its engine's
	// batches replace nothing of the old one.
	pod = f.createPod(t, "vllm-a", "127.0.0.2", port, false)
	check("recreated elsewhere", "127.0.0.2", 2, 3)
	publishBatches(t, pubA, 1, 5, 7)
	publishBatches(t, pubB, 2, 3, 4)
	check("live batches", "127.0.0.2", 2, 4)

	// The same pod moves to another address: the blocks of its old engine
	// go, the new engine's chain comes.
	f.setStatus(t, pod, "127.0.0.1", true)
	check("address changed", "127.0.0.1", 1, 7)

	f.deletePod(t, "vllm-a")
	f.deletePod(t, "vllm-off")
	check("all deleted", "", 0, 0)
	if n := f.index.entries(); n != 0 {
		t.Fatalf("the index holds %d blocks once every pod is deleted", n)
	}
}

// A readiness probe that fails for a while (vLLM's /health timing out under
// load) takes the pod out of routing but leaves its engine's KV cache as it
// is. The pod's streams go on meanwhile, so that once the pod is ready again
// the index holds the blocks stored before and during the failure, although
// the engine's replay buffer no longer reaches back to them.
func TestUnreadyPodKeepsItsStreamsAndItsIndex(t *testing.T) {
	cfg := testapiserver.Config(t)
	port := freePortPair(t)
	const bufferSteps = 4
	pub := bufferedPublisher(t, "127.0.0.1", port, bufferSteps)
	f := newFleet(t, cfg)
	a := f.key("vllm-a")

	pod := f.createPod(t, "vllm-a", "127.0.0.1", port, false)
	testsupport.Eventually(t, "followed", func() bool { return slices.Equal(f.followed(), []string{a + "@127.0.0.1"}) })
	// The first batches are within the replay buffer: the stream's first
	// contact replays those it missed while connecting.
	publishBatches(t, pub, 1, 0, bufferSteps)
	testsupport.Eventually(t, "the first blocks indexed", func() bool { return f.index.holds(a, 1, bufferSteps) })
	publishBatches(t, pub, 1, bufferSteps, 10)
	testsupport.Eventually(t, "the 10 blocks stored while ready indexed", func() bool { return f.index.holds(a, 1, 10) })
	since := podStatus(f, a).Streams[0].Since

	pod = f.setStatus(t, pod, "127.0.0.1", false)
	testsupport.Eventually(t, "not ready: out of routing", func() bool {
		pods, _ := f.store.ListPodsByModel(testModel)
		return len(pods) == 0
	})
	publishBatches(t, pub, 1, 10, 20)
	testsupport.Eventually(t, "the 10 blocks stored while not ready indexed", func() bool { return f.index.holds(a, 1, 20) })

	f.setStatus(t, pod, "127.0.0.1", true)
	testsupport.Eventually(t, "ready again: routed", func() bool {
		pods, _ := f.store.ListPodsByModel(testModel)
		return len(pods) == 1
	})
	publishBatches(t, pub, 1, 20, 20+bufferSteps)
	testsupport.EventuallyWhy(t, "every block the engine stored indexed", func() (string, bool) {
		st := podStatus(f, a)
		return fmt.Sprintf("state %s, reason %s; a prompt of the chain matches %d blocks",
			st.State, st.Reason, f.index.matched(a, "", 1, 20+bufferSteps)), f.index.holds(a, 1, 20+bufferSteps)
	})
	if st := podStatus(f, a); st.State != manager.PodStateFollowed || len(st.Streams) != 1 || !st.Streams[0].Since.Equal(since) {
		t.Fatalf("the pod's stream changed across the readiness failure: %+v, want the stream since %v", st, since)
	}
}

// slowSink is a recordingSink whose additions take a moment, as a Store's
// do under load while its listeners and model index are updated.
type slowSink struct{ *recordingSink }

func (s slowSink) AddOrUpdatePod(pod *v1.Pod) {
	time.Sleep(20 * millisecond) // the cost of the addition, not a wait for anything
	s.recordingSink.AddOrUpdatePod(pod)
}

// The gateway starts serving once RunPodSource returns: by then every pod
// that existed when the source started has reached the sink, however slow
// the sink is.
func TestKubernetesSourceReportsSyncedOnceEveryExistingPodIsDelivered(t *testing.T) {
	cfg := testapiserver.Config(t)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := createNamespace(t, client, "sync")
	const pods = 20
	for i := range pods {
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("vllm-%d", i),
				Labels: map[string]string{endpoint.ModelNameLabel: testModel}},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
		}
		if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sink := slowSink{newRecordingSink()}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done, err := cache.RunPodSource(runCtx, &KubernetesSource{Namespace: ns, LabelSelector: endpoint.ModelNameLabel,
		Logger: klog.Background().V(4)}, cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	delivered := sink.count()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("pod source: %v", err)
	}
	if delivered != pods {
		t.Fatalf("the source reported synced with %d of the %d existing pods delivered", delivered, pods)
	}
}

func podStatus(f *fleet, key string) manager.PodStatus {
	for _, ps := range f.manager.Snapshot() {
		if ps.Pod == key {
			return ps
		}
	}
	return manager.PodStatus{}
}
