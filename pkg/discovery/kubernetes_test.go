package discovery

import (
	"context"
	"fmt"
	"math/rand/v2"
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

	pod = f.setStatus(t, pod, "127.0.0.1", false)
	check("not ready", "", 0, 0)
	if st := podStatus(f, a); st.Reason != manager.ReasonNotReady {
		t.Fatalf("unready pod: %+v", st)
	}

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
	ns := fmt.Sprintf("sync-%d", rand.Uint32())
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
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
