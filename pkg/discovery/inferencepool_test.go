package discovery

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testapiserver"
	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// poolFleet is a Store fed by an InferencePoolSource in a fresh namespace,
// with a KV event manager listening to it.
type poolFleet struct {
	*fleet
	dyn   dynamic.Interface
	pools dynamic.ResourceInterface
}

// newPoolFleet starts the Store on the API server; pubPort is the KV event
// PUB port of rank 0 of pods that name none (the replay port follows it).
func newPoolFleet(t testing.TB, cfg *rest.Config, pubPort int, pools ...string) *poolFleet {
	t.Helper()
	return startPoolFleet(t, cfg, "pool", &InferencePoolSource{Pools: pools, PubPort: pubPort, ReplayPort: pubPort + 1,
		Logger: klog.Background().V(4)})
}

// startPoolFleet starts the Store on the API server fed by src, whose
// Namespace it sets to a fresh one named after prefix.
func startPoolFleet(t testing.TB, cfg *rest.Config, prefix string, src *InferencePoolSource) *poolFleet {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := startFleet(t, cfg, prefix, func(ns string) cache.PodSource {
		src.Namespace = ns
		return src
	})
	return &poolFleet{fleet: f, dyn: dyn, pools: dyn.Resource(InferencePoolResource).Namespace(f.ns)}
}

// applyPool creates or replaces pool name selecting the pods labelled
// app=app, on ports, with annotations.
func (f *poolFleet) applyPool(t testing.TB, name, app string, ports []int, annotations map[string]string) {
	t.Helper()
	testapiserver.Apply(t, f.pools, poolObject(name, app, ports, annotations))
}

// poolObject is the InferencePool name selecting the pods labelled
// app=app, on ports, with annotations.
func poolObject(name, app string, ports []int, annotations map[string]string) *unstructured.Unstructured {
	var targetPorts []any
	for _, p := range ports {
		targetPorts = append(targetPorts, map[string]any{"number": int64(p)})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1",
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": app}},
			"targetPorts":       targetPorts,
			"endpointPickerRef": map[string]any{"name": "kvgate", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	u.SetAnnotations(annotations)
	return u
}

func (f *poolFleet) deletePool(t testing.TB, name string) {
	t.Helper()
	if err := f.pools.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createAppPod creates a pod labelled app=app and nothing else kvgate
// reads, Running and Ready at ip.
func (f *poolFleet) createAppPod(t testing.TB, name, app, ip string) *v1.Pod {
	t.Helper()
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{"app": app}},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	created, err := f.client.CoreV1().Pods(f.ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return f.setStatus(t, created, ip, true)
}

// setApp relabels a pod's app.
func (f *poolFleet) setApp(t testing.TB, name, app string) {
	t.Helper()
	pod, err := f.client.CoreV1().Pods(f.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Labels["app"] = app
	if _, err := f.client.CoreV1().Pods(f.ns).Update(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// candidates lists "name@address" of the pods the Store routes testModel
// to, sorted.
func (f *poolFleet) candidates() []string {
	pods, err := f.store.ListPodsByModel(testModel)
	if err != nil {
		return nil
	}
	var out []string
	for _, p := range pods {
		out = append(out, p.Key.Name+"@"+p.Address)
	}
	slices.Sort(out)
	return out
}

// waitFor waits until the Store's candidates and the followed pods are
// want and followed.
func (f *poolFleet) waitFor(t testing.TB, step string, want, followed []string) {
	t.Helper()
	testsupport.EventuallyWhy(t, step+": candidates and followed pods", func() (string, bool) {
		c, fo := f.candidates(), f.followed()
		return fmt.Sprintf("candidates %v, followed %v", c, fo), slices.Equal(c, want) && slices.Equal(fo, followed)
	})
}

func TestInferencePoolPodsAreCandidatesAndTheirKVEventsFollowed(t *testing.T) {
	cfg := testapiserver.Config(t)
	port := freePortPair(t)
	pubA := enginePublisher(t, "127.0.0.1", port)
	pubB := enginePublisher(t, "127.0.0.2", port)
	publishBatches(t, pubA, 1, 0, 5)
	publishBatches(t, pubB, 2, 0, 3)
	f := newPoolFleet(t, cfg, port)
	// The pool names what its pods serve and where they publish KV events.
	serving := map[string]string{endpoint.ModelNameLabel: testModel, endpoint.KVEventsEnabledLabel: "true",
		endpoint.PubPortAnnotation: strconv.Itoa(port), endpoint.ReplayPortAnnotation: strconv.Itoa(port + 1)}

	// Pods before the pool: nothing is a candidate.
	f.createAppPod(t, "vllm-a", "llama", "127.0.0.1")
	f.createAppPod(t, "other", "bert", "127.0.0.2")
	f.waitFor(t, "no pool", nil, nil)

	f.applyPool(t, "llama", "llama", []int{8000}, serving)
	f.waitFor(t, "pool created", []string{"vllm-a@127.0.0.1:8000"}, []string{f.key("vllm-a") + "@127.0.0.1"})
	testsupport.Eventually(t, "vllm-a's chain to be indexed", func() bool { return f.index.holds(f.key("vllm-a"), 1, 5) })

	// Scale up: a second member at the other address.
	f.createAppPod(t, "vllm-b", "llama", "127.0.0.2")
	f.waitFor(t, "scaled up", []string{"vllm-a@127.0.0.1:8000", "vllm-b@127.0.0.2:8000"},
		[]string{f.key("vllm-a") + "@127.0.0.1", f.key("vllm-b") + "@127.0.0.2"})
	testsupport.Eventually(t, "vllm-b's chain to be indexed", func() bool { return f.index.holds(f.key("vllm-b"), 2, 3) })

	// Relabel: vllm-a leaves the pool, its blocks leave the index.
	f.setApp(t, "vllm-a", "bert")
	f.waitFor(t, "relabelled", []string{"vllm-b@127.0.0.2:8000"}, []string{f.key("vllm-b") + "@127.0.0.2"})
	testsupport.Eventually(t, "vllm-a's blocks to be purged", func() bool { return !f.index.holds(f.key("vllm-a"), 1, 1) })

	// The pool's target port changes: the member is replaced on it.
	f.applyPool(t, "llama", "llama", []int{8100}, serving)
	f.waitFor(t, "port changed", []string{"vllm-b@127.0.0.2:8100"}, []string{f.key("vllm-b") + "@127.0.0.2"})

	// A pod's own label wins over the pool's default.
	f.setApp(t, "vllm-a", "llama")
	pod, err := f.client.CoreV1().Pods(f.ns).Get(context.Background(), "vllm-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Labels[endpoint.ModelNameLabel] = "mistral"
	if _, err := f.client.CoreV1().Pods(f.ns).Update(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testsupport.EventuallyWhy(t, "vllm-a to serve its own model", func() (string, bool) {
		pods, err := f.store.ListPodsByModel("mistral")
		return fmt.Sprint(pods, err), err == nil && len(pods) == 1 && pods[0].Key.Name == "vllm-a"
	})

	// Scale down, then the pool goes: nothing is left.
	f.deletePod(t, "vllm-a")
	f.deletePool(t, "llama")
	f.waitFor(t, "pool deleted", nil, nil)
	testsupport.Eventually(t, "the index to be empty", func() bool { return f.index.entries() == 0 })
}

func TestAPoolWithSeveralTargetPortsHasAnEndpointPerPort(t *testing.T) {
	cfg := testapiserver.Config(t)
	ports := testsupport.ConsecutivePorts(t, 4, "127.0.0.1")
	// Rank r of the engine publishes on ports[0]+r and replays on
	// ports[2]+r, as vLLM offsets its data-parallel ranks.
	pub0 := rankPublisher(t, "127.0.0.1", ports[0], ports[2])
	pub1 := rankPublisher(t, "127.0.0.1", ports[1], ports[3])
	publishBatches(t, pub0, 3, 0, 2)
	publishBatches(t, pub1, 4, 0, 4)
	f := newPoolFleet(t, cfg, ports[0])
	f.applyPool(t, "dp", "dp", []int{8000, 8001}, map[string]string{
		endpoint.ModelNameLabel: testModel, endpoint.KVEventsEnabledLabel: "true",
		endpoint.ReplayPortAnnotation: strconv.Itoa(ports[2]),
	})
	f.createAppPod(t, "engine", "dp", "127.0.0.1")
	f.waitFor(t, "two ranks", []string{"engine-rank-0@127.0.0.1:8000", "engine-rank-1@127.0.0.1:8001"},
		[]string{f.key("engine-rank-0") + "@127.0.0.1", f.key("engine-rank-1") + "@127.0.0.1"})
	testsupport.Eventually(t, "each rank's chain to be indexed under its endpoint", func() bool {
		return f.index.holds(f.key("engine-rank-0"), 3, 2) && f.index.holds(f.key("engine-rank-1"), 4, 4)
	})
}

func TestOnlyTheNamedPoolsAreFollowedAndAPodBelongsToOne(t *testing.T) {
	cfg := testapiserver.Config(t)
	f := newPoolFleet(t, cfg, freePortPair(t), "b-pool", "c-pool")
	model := map[string]string{endpoint.ModelNameLabel: testModel}
	f.applyPool(t, "a-pool", "shared", []int{7000}, model)
	f.applyPool(t, "c-pool", "shared", []int{9000}, model)
	f.applyPool(t, "b-pool", "shared", []int{8000}, model)
	f.createAppPod(t, "p", "shared", "127.0.0.1")
	// a-pool is not followed; of the other two, b-pool comes first.
	f.waitFor(t, "first of the followed pools", []string{"p@127.0.0.1:8000"}, nil)
	f.deletePool(t, "b-pool")
	f.waitFor(t, "the next pool", []string{"p@127.0.0.1:9000"}, nil)
}

func TestInferencePoolSourceNamesTheMissingCRD(t *testing.T) {
	cfg := testapiserver.Config(t)
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := serves(kube, InferencePoolResource); err != nil {
		t.Fatalf("with the CRD installed: %v", err)
	}
	// A version the server does not serve stands for a cluster without
	// the CRD.
	missing := InferencePoolResource
	missing.Version = "v9"
	if err := serves(kube, missing); err == nil || !strings.Contains(err.Error(), "install the InferencePool CRD") {
		t.Fatalf("serves = %v; want an error saying to install the CRD", err)
	}
}
