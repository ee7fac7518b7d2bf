package discovery

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testapiserver"
	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// objectiveObject is an InferenceObjective as the informer delivers it;
// priority nil leaves it unset, group and kind "" leave them to their
// defaults.
func objectiveObject(ns, name string, priority *int64, group, kind, pool string) *unstructured.Unstructured {
	ref := map[string]any{"name": pool}
	if group != "" {
		ref["group"] = group
	}
	if kind != "" {
		ref["kind"] = kind
	}
	spec := map[string]any{"poolRef": ref}
	if priority != nil {
		spec["priority"] = *priority
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective", "spec": spec,
	}}
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

func prio(p int64) *int64 { return &p }

func TestObjectivePriorityLookup(t *testing.T) {
	served := []types.NamespacedName{{Namespace: "a", Name: "llama"}, {Namespace: "b", Name: "llama"}}
	tests := []struct {
		name       string
		objectives []*unstructured.Unstructured
		lookup     string
		want       int
		found      bool
	}{
		{"a served pool's objective", []*unstructured.Unstructured{objectiveObject("a", "batch", prio(-2), "", "", "llama")},
			"batch", -2, true},
		{"unset priority is 0", []*unstructured.Unstructured{objectiveObject("a", "chat", nil, "", "", "llama")}, "chat", 0, true},
		{"explicit defaults", []*unstructured.Unstructured{
			objectiveObject("a", "chat", prio(3), "inference.networking.k8s.io", "InferencePool", "llama")}, "chat", 3, true},
		{"unknown name", []*unstructured.Unstructured{objectiveObject("a", "batch", prio(-2), "", "", "llama")}, "other", 0, false},
		{"a pool kvgate does not serve", []*unstructured.Unstructured{objectiveObject("a", "batch", prio(-2), "", "", "mistral")},
			"batch", 0, false},
		{"the pool's name in another namespace", []*unstructured.Unstructured{objectiveObject("c", "batch", prio(-2), "", "", "llama")},
			"batch", 0, false},
		{"another kind of pool", []*unstructured.Unstructured{objectiveObject("a", "batch", prio(-2), "", "Service", "llama")},
			"batch", 0, false},
		{"another group", []*unstructured.Unstructured{objectiveObject("a", "batch", prio(-2), "example.com", "", "llama")},
			"batch", 0, false},
		{"the lowest of several namespaces", []*unstructured.Unstructured{
			objectiveObject("a", "batch", prio(4), "", "", "llama"), objectiveObject("b", "batch", prio(-1), "", "", "llama")},
			"batch", -1, true},
		{"the lowest among the served only", []*unstructured.Unstructured{
			objectiveObject("a", "batch", prio(4), "", "", "llama"), objectiveObject("c", "batch", prio(-1), "", "", "llama")},
			"batch", 4, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewObjectives()
			for _, p := range served {
				o.setServed(p, true)
			}
			for _, u := range tt.objectives {
				o.set(u)
			}
			if got, found := o.Priority(tt.lookup); got != tt.want || found != tt.found {
				t.Errorf("Priority(%q) = %d, %v; want %d, %v", tt.lookup, got, found, tt.want, tt.found)
			}
		})
	}
}

func TestObjectivesFollowTheirPoolAndTheirDeletion(t *testing.T) {
	o := NewObjectives()
	pool := types.NamespacedName{Namespace: "a", Name: "llama"}
	o.set(objectiveObject("a", "batch", prio(-1), "", "", "llama"))
	if _, found := o.Priority("batch"); found {
		t.Fatal("an objective counts before its pool is served")
	}
	o.setServed(pool, true)
	if p, found := o.Priority("batch"); p != -1 || !found {
		t.Fatalf("once the pool is served: %d, %v; want -1, true", p, found)
	}
	o.setServed(pool, false)
	if _, found := o.Priority("batch"); found {
		t.Fatal("an objective counts after its pool left")
	}
	o.setServed(pool, true)
	o.remove("a", "batch")
	if _, found := o.Priority("batch"); found || o.Len() != 0 {
		t.Fatalf("after deletion: found %v, %d kept", found, o.Len())
	}
}

func TestObjectivesBeyondTheBoundAreDroppedAndCounted(t *testing.T) {
	o := NewObjectives()
	o.setServed(types.NamespacedName{Namespace: "a", Name: "llama"}, true)
	for i := range MaxInferenceObjectives {
		if !o.set(objectiveObject("a", fmt.Sprint("o-", i), prio(1), "", "", "llama")) {
			t.Fatalf("objective %d dropped below the bound", i)
		}
	}
	if o.set(objectiveObject("a", "one-too-many", prio(-1), "", "", "llama")) {
		t.Fatal("an objective beyond the bound was kept")
	}
	if _, found := o.Priority("one-too-many"); found || o.Dropped() != 1 || o.Len() != MaxInferenceObjectives {
		t.Fatalf("found %v, dropped %d, kept %d; want not found, 1 dropped, %d kept", found, o.Dropped(), o.Len(),
			MaxInferenceObjectives)
	}
	// An update of a kept one still applies at the bound; room made by a
	// deletion takes the next.
	if !o.set(objectiveObject("a", "o-0", prio(-3), "", "", "llama")) {
		t.Fatal("an update of a kept objective was dropped at the bound")
	}
	if p, _ := o.Priority("o-0"); p != -3 {
		t.Errorf("updated priority %d; want -3", p)
	}
	o.remove("a", "o-1")
	if !o.set(objectiveObject("a", "one-too-many", prio(-1), "", "", "llama")) {
		t.Fatal("no room after a deletion")
	}
}

func BenchmarkObjectivePriority(b *testing.B) {
	o := NewObjectives()
	o.setServed(types.NamespacedName{Namespace: "a", Name: "llama"}, true)
	o.set(objectiveObject("a", "batch", prio(-1), "", "", "llama"))
	b.ReportAllocs()
	for b.Loop() {
		o.Priority("batch")
	}
}

// objectiveFleet is an InferencePoolSource filling Objectives, in a fresh
// namespace of the test API server.
type objectiveFleet struct {
	*poolFleet
	objectives dynamic.ResourceInterface
	lookup     *Objectives
}

// newObjectiveFleet starts an objectiveFleet on the test API server fed by
// src, setting its Namespace, and its Objectives and Logger when unset.
func newObjectiveFleet(t *testing.T, src *InferencePoolSource) *objectiveFleet {
	t.Helper()
	if src.Objectives == nil {
		src.Objectives = NewObjectives()
	}
	if src.Logger.GetSink() == nil {
		src.Logger = klog.Background().V(4)
	}
	f := startPoolFleet(t, testapiserver.Config(t), "objectives", src)
	return &objectiveFleet{poolFleet: f, objectives: f.dyn.Resource(InferenceObjectiveResource).Namespace(f.ns), lookup: src.Objectives}
}

// applyObjective creates or replaces the objective name.
func (f *objectiveFleet) applyObjective(t *testing.T, name string, priority *int64, pool string) {
	t.Helper()
	u := objectiveObject(f.ns, name, priority, "", "", pool)
	testapiserver.Apply(t, f.objectives, u)
}

// waitPriority waits until name looks up as want, found.
func (f *objectiveFleet) waitPriority(t *testing.T, step, name string, want int, found bool) {
	t.Helper()
	testsupport.EventuallyWhy(t, step, func() (string, bool) {
		p, ok := f.lookup.Priority(name)
		return fmt.Sprintf("Priority(%q) = %d, %v; want %d, %v", name, p, ok, want, found), p == want && ok == found
	})
}

func TestInferenceObjectivesChangeTheLookedUpPriority(t *testing.T) {
	f := newObjectiveFleet(t, &InferencePoolSource{})
	f.applyPool(t, "llama", "llama", []int{8000}, map[string]string{endpoint.ModelNameLabel: testModel})
	f.applyObjective(t, "batch", prio(-1), "llama")
	f.waitPriority(t, "created", "batch", -1, true)
	f.applyObjective(t, "batch", prio(7), "llama")
	f.waitPriority(t, "updated", "batch", 7, true)
	f.applyObjective(t, "batch", nil, "llama")
	f.waitPriority(t, "priority unset", "batch", 0, true)
	if err := f.objectives.Delete(context.Background(), "batch", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPriority(t, "deleted", "batch", 0, false)

	// An objective of a pool kvgate does not serve counts once the pool
	// exists, and no longer once it is gone.
	f.applyObjective(t, "later", prio(-5), "mistral")
	f.applyObjective(t, "marker", prio(1), "llama")
	f.waitPriority(t, "the objectives seen", "marker", 1, true)
	if p, found := f.lookup.Priority("later"); found {
		t.Fatalf("an objective of a pool that does not exist looks up as %d", p)
	}
	f.applyPool(t, "mistral", "mistral", []int{8000}, map[string]string{endpoint.ModelNameLabel: testModel})
	f.waitPriority(t, "its pool created", "later", -5, true)
	f.deletePool(t, "mistral")
	f.waitPriority(t, "its pool deleted", "later", 0, false)
}

func TestInferencePoolSourceWithoutTheObjectiveCRDServesThePools(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(_, args string) { mu.Lock(); lines = append(lines, args); mu.Unlock() }, funcr.Options{})
	// A version the API server does not serve stands for a cluster
	// without the CRD.
	missing := InferenceObjectiveResource
	missing.Version = "v9"
	f := newObjectiveFleet(t, &InferencePoolSource{Logger: logger, objectiveResource: missing})
	f.applyPool(t, "llama", "llama", []int{8000}, map[string]string{endpoint.ModelNameLabel: testModel})
	f.createAppPod(t, "vllm-a", "llama", "127.0.0.1")
	f.waitFor(t, "the pool's pod", []string{"vllm-a@127.0.0.1:8000"}, nil)
	if p, found := f.lookup.Priority("batch"); found {
		t.Errorf("Priority found %d without objectives", p)
	}
	mu.Lock()
	defer mu.Unlock()
	said := 0
	for _, l := range lines {
		if strings.Contains(l, "InferenceObjectives are not read") {
			said++
		}
	}
	if said != 1 {
		t.Errorf("logged %d times that InferenceObjectives are not read; want once. Logs: %q", said, lines)
	}
}

func TestInferenceObjectivesOfACRDInstalledAfterStartAreRead(t *testing.T) {
	shortRecheck(t)
	cfg := testapiserver.Config(t)
	late, install := lateCRD(t, cfg, "inferenceobjectives.yaml", "inferenceobjectives")
	var logs logLines
	f := newObjectiveFleet(t, &InferencePoolSource{Logger: logs.logger(), objectiveResource: late})
	f.applyPool(t, "llama", "llama", []int{8000}, map[string]string{endpoint.ModelNameLabel: testModel})

	install()
	u := objectiveObject(f.ns, "batch", prio(-1), "", "", "llama")
	u.SetAPIVersion(late.GroupVersion().String())
	testapiserver.Apply(t, f.dyn.Resource(late).Namespace(f.ns), u)
	f.waitPriority(t, "the objective of the CRD installed late", "batch", -1, true)
	logs.wantLoggedOnce(t, "InferenceObjectives are not read", "InferenceObjectives are now read")
}
