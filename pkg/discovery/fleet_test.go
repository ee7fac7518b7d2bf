package discovery

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
)

// fleet is a Store fed by a KubernetesSource, with a KV event manager
// listening to it.
type fleet struct {
	client  kubernetes.Interface
	ns      string
	store   *cache.Store
	manager *manager.KVEventManager
	index   *testIndex
}

// newFleet starts a Store on the API server watching a fresh namespace.
func newFleet(t testing.TB, cfg *rest.Config) *fleet {
	t.Helper()
	return startFleet(t, cfg, "kv", func(ns string) cache.PodSource {
		return &KubernetesSource{Namespace: ns, LabelSelector: endpoint.ModelNameLabel, Logger: klog.Background().V(4)}
	})
}

// startFleet starts a Store on the API server fed by the source that
// source returns for a fresh namespace named after prefix, with a KV event
// manager listening to it.
func startFleet(t testing.TB, cfg *rest.Config, prefix string, source func(ns string) cache.PodSource) *fleet {
	t.Helper()
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{client: client, ns: createNamespace(t, client, prefix), index: newTestIndex(t)}
	f.manager = f.index.newManager(t)
	f.store, _ = startStore(t, cfg, source(f.ns), f.manager)
	return f
}

// createNamespace creates a namespace of its own for a test, named prefix-
// and a random number, and returns its name.
func createNamespace(t testing.TB, client kubernetes.Interface, prefix string) string {
	t.Helper()
	ns := fmt.Sprintf("%s-%d", prefix, rand.Uint32())
	if _, err := client.CoreV1().Namespaces().Create(context.Background(),
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// createPod creates a pod labelled for KV events (unless unlabelled) whose
// engine publishes on port, then makes it Running and Ready at ip.
func (f *fleet) createPod(t testing.TB, name, ip string, port int, unlabelled bool) *v1.Pod {
	t.Helper()
	labels := map[string]string{endpoint.ModelNameLabel: testModel}
	if !unlabelled {
		labels[endpoint.KVEventsEnabledLabel] = "true"
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: labels, Annotations: map[string]string{
			endpoint.PubPortAnnotation: strconv.Itoa(port), endpoint.ReplayPortAnnotation: strconv.Itoa(port + 1)}},
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
		pod.Labels[endpoint.KVEventsEnabledLabel] = "true"
	} else {
		delete(pod.Labels, endpoint.KVEventsEnabledLabel)
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
		if ps.State == manager.PodStateFollowed {
			out = append(out, ps.Pod+"@"+ps.Target.IP)
		}
	}
	return out
}

func (f *fleet) key(name string) string { return f.ns + "/" + name }
