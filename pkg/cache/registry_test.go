package cache

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/endpoint"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func podNames(pods []*endpoint.Endpoint) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.ID
	}
	return out
}

func TestListPodsByModelReturnsOnlyRoutablePods(t *testing.T) {
	s := newTestStore(t, noScrape())
	deleting := metav1.NewTime(time.Now())
	for _, p := range []*v1.Pod{
		testPod("ns", "ready-b", "m", "10.0.0.2"),
		testPod("ns", "ready-a", "m", "10.0.0.1"),
		testPod("ns", "unready", "m", "10.0.0.3", notReady),
		testPod("ns", "no-ip", "m", ""),
		testPod("ns", "pending", "m", "10.0.0.4", func(p *v1.Pod) { p.Status.Phase = v1.PodPending }),
		testPod("ns", "terminating", "m", "10.0.0.5", func(p *v1.Pod) { p.DeletionTimestamp = &deleting }),
		testPod("ns", "no-conditions", "m", "10.0.0.6", func(p *v1.Pod) { p.Status.Conditions = nil }),
		testPod("ns", "other-model", "other", "10.0.0.7"),
	} {
		s.AddOrUpdatePod(p)
	}
	pods, err := s.ListPodsByModel("m")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := podNames(pods), []string{"ns/ready-a", "ns/ready-b"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("ListPodsByModel = %v, want %v", got, want)
	}
	if got := len(s.ListPods()); got != 8 {
		t.Fatalf("ListPods has %d pods, want all 8 whatever their state", got)
	}
	if _, err := s.GetPod(pkey("ns", "unready")); err != nil {
		t.Fatalf("GetPod of an unready pod: %v", err)
	}
}

func TestListPodsByModelOfUnreadyModelIsEmptyNotAnError(t *testing.T) {
	s := newTestStore(t, noScrape())
	s.AddOrUpdatePod(testPod("ns", "p", "m", "10.0.0.1", notReady))
	pods, err := s.ListPodsByModel("m")
	if err != nil || len(pods) != 0 {
		t.Fatalf("ListPodsByModel = %v, %v; want no pods and no error", podNames(pods), err)
	}
	if !s.HasModel("m") {
		t.Fatal("HasModel is false for a model served by an unready pod")
	}
	_, err = s.ListPodsByModel("unknown")
	var mnf *ModelNotFoundError
	if !errors.As(err, &mnf) || !errors.Is(err, ErrModelNotFound) || mnf.Model != "unknown" {
		t.Fatalf("ListPodsByModel(unknown) error = %v, want a ModelNotFoundError", err)
	}
}

func TestModelNameFromLabelThenAnnotation(t *testing.T) {
	s := newTestStore(t, noScrape())
	s.AddOrUpdatePod(testPod("ns", "labelled", "from-label", "10.0.0.1"))
	s.AddOrUpdatePod(testPod("ns", "annotated", "", "10.0.0.2", func(p *v1.Pod) {
		p.Annotations = map[string]string{endpoint.ModelNameLabel: "from-annotation"}
	}))
	s.AddOrUpdatePod(testPod("ns", "both", "label-wins", "10.0.0.3", func(p *v1.Pod) {
		p.Annotations = map[string]string{endpoint.ModelNameLabel: "annotation-loses"}
	}))
	s.AddOrUpdatePod(testPod("ns", "none", "", "10.0.0.4"))
	if got, want := s.ListModels(), []string{"from-annotation", "from-label", "label-wins"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("ListModels = %v, want %v", got, want)
	}
	if models, err := s.ListModelsByPod(pkey("ns", "none")); err != nil || len(models) != 0 {
		t.Fatalf("ListModelsByPod(none) = %v, %v; want no models", models, err)
	}
}

func TestAdaptersAddModelsToTheirPod(t *testing.T) {
	s := newTestStore(t, noScrape())
	s.AddOrUpdatePod(testPod("ns", "a", "base", "10.0.0.1"))
	s.AddOrUpdatePod(testPod("ns", "b", "base", "10.0.0.2"))
	if err := s.SetPodAdapters(pkey("ns", "a"), []string{"lora-1", "lora-2", "base", "lora-1"}); err != nil {
		t.Fatal(err)
	}
	models, _ := s.ListModelsByPod(pkey("ns", "a"))
	if want := []string{"base", "lora-1", "lora-2"}; !reflect.DeepEqual(models, want) {
		t.Fatalf("ListModelsByPod = %v, want %v", models, want)
	}
	pods, _ := s.ListPodsByModel("lora-1")
	if got := podNames(pods); !reflect.DeepEqual(got, []string{"ns/a"}) {
		t.Fatalf("pods of lora-1 = %v, want [ns/a]", got)
	}

	// An update of the same pod keeps its adapters.
	s.AddOrUpdatePod(testPod("ns", "a", "base", "10.0.0.1", withLabel("x", "y")))
	if !s.HasModel("lora-2") {
		t.Fatal("adapters lost on update")
	}
	// Removing an adapter removes the model once no pod serves it.
	if err := s.SetPodAdapters(pkey("ns", "a"), []string{"lora-1"}); err != nil {
		t.Fatal(err)
	}
	if s.HasModel("lora-2") {
		t.Fatal("lora-2 still listed after its only pod dropped it")
	}
	// A new pod under the same name (another UID) starts without adapters.
	s.AddOrUpdatePod(testPod("ns", "a", "base", "10.0.0.9", withUID("new-uid")))
	if s.HasModel("lora-1") {
		t.Fatal("adapters survived the pod's replacement")
	}
	err := s.SetPodAdapters(pkey("ns", "missing"), []string{"x"})
	var pnf *PodNotFoundError
	if !errors.As(err, &pnf) || pnf.Key.Name != "missing" {
		t.Fatalf("SetPodAdapters on an unknown pod: %v", err)
	}
}

func TestDeletePodRemovesItsModels(t *testing.T) {
	s := newTestStore(t, noScrape())
	s.AddOrUpdatePod(testPod("ns", "a", "m1", "10.0.0.1"))
	s.AddOrUpdatePod(testPod("ns", "b", "m2", "10.0.0.2"))
	s.DeletePod(pkey("ns", "a"))
	s.DeletePod(pkey("ns", "never-added"))
	if got := s.ListModels(); !reflect.DeepEqual(got, []string{"m2"}) {
		t.Fatalf("ListModels = %v, want [m2]", got)
	}
	if _, err := s.GetPod(pkey("ns", "a")); !errors.Is(err, ErrPodNotFound) {
		t.Fatalf("GetPod of a deleted pod: %v", err)
	}
	if _, err := s.ListModelsByPod(pkey("ns", "a")); !errors.Is(err, ErrPodNotFound) {
		t.Fatalf("ListModelsByPod of a deleted pod: %v", err)
	}
}

// recorder is a PodListener that records what it is told.
type recorder struct {
	mu     sync.Mutex
	events []string
	onCall func()
}

func (r *recorder) add(e string) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
	if r.onCall != nil {
		r.onCall()
	}
}

func (r *recorder) OnPodAdd(p *v1.Pod) { r.add("add " + p.Name + " " + p.Status.PodIP) }
func (r *recorder) OnPodUpdate(o, n *v1.Pod) {
	r.add("update " + n.Name + " " + o.Status.PodIP + "->" + n.Status.PodIP)
}
func (r *recorder) OnPodDelete(p *v1.Pod) { r.add("delete " + p.Name + " " + p.Status.PodIP) }

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func TestPodListenersSeeEveryChangeInOrder(t *testing.T) {
	s := newTestStore(t, noScrape())
	s.AddOrUpdatePod(testPod("ns", "existing", "m", "10.0.0.1"))
	r := &recorder{}
	s.AddPodListener(r)
	s.AddOrUpdatePod(testPod("ns", "p", "m", "10.0.0.2"))
	s.AddOrUpdatePod(testPod("ns", "p", "m", "10.0.0.2", notReady))
	s.AddOrUpdatePod(testPod("ns", "p", "m", "10.0.0.3", withUID("restarted")))
	s.DeletePod(pkey("ns", "p"))
	s.DeletePod(pkey("ns", "p"))
	want := []string{
		"add existing 10.0.0.1", // replayed on subscription
		"add p 10.0.0.2",
		"update p 10.0.0.2->10.0.0.2",
		"delete p 10.0.0.2", // another UID: the old pod goes, the new one comes
		"add p 10.0.0.3",
		"delete p 10.0.0.3",
	}
	if got := r.got(); !reflect.DeepEqual(got, want) {
		t.Fatalf("listener saw\n%v\nwant\n%v", got, want)
	}
}

// modelsRecorder is a recorder that is also a ModelsListener.
type modelsRecorder struct{ recorder }

func (r *modelsRecorder) OnPodModelsChange(p *v1.Pod) { r.add("models " + p.Name) }

func TestModelsListenersAreToldWhenAPodsAdaptersChangeItsModels(t *testing.T) {
	s := newTestStore(t, noScrape())
	s.AddOrUpdatePod(testPod("ns", "a", "base", "10.0.0.1"))
	r, plain := &modelsRecorder{}, &recorder{}
	s.AddPodListener(r)
	s.AddPodListener(plain)
	for _, adapters := range [][]string{
		{"lora-1"},
		{"lora-1"},         // the same models: nothing to tell
		{"lora-1", "base"}, // the base model again: the same models
		{},
	} {
		if err := s.SetPodAdapters(pkey("ns", "a"), adapters); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := r.got(), []string{"add a 10.0.0.1", "models a", "models a"}; !reflect.DeepEqual(got, want) {
		t.Errorf("models listener saw %v, want %v", got, want)
	}
	if got, want := plain.got(), []string{"add a 10.0.0.1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("pod listener saw %v, want %v", got, want)
	}
}

func TestPodListenerMayReadTheStore(t *testing.T) {
	s := newTestStore(t, noScrape())
	r := &recorder{}
	r.onCall = func() {
		_ = s.ListPods()
		_, _ = s.ListPodsByModel("m")
		_, _ = s.GetMetricValueByPod(pkey("ns", "p"), RealtimeNumRequestsRunning)
	}
	s.AddPodListener(r)
	done := make(chan struct{})
	go func() {
		s.AddOrUpdatePod(testPod("ns", "p", "m", "10.0.0.1"))
		s.DeletePod(pkey("ns", "p"))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("registry change deadlocked on a listener reading the Store")
	}
}

func TestRegistryStaysConsistentUnderConcurrentChanges(t *testing.T) {
	s := newTestStore(t, noScrape())
	r := &recorder{}
	s.AddPodListener(r)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				name := fmt.Sprintf("p%d", (w*7+i)%10)
				switch i % 3 {
				case 0, 1:
					s.AddOrUpdatePod(testPod("ns", name, fmt.Sprintf("m%d", i%2), "10.0.0.1"))
				default:
					s.DeletePod(pkey("ns", name))
				}
				_, _ = s.ListPodsByModel("m0")
				_ = s.ListModels()
			}
		}()
	}
	wg.Wait()
	// Replaying the listener's events must give the registry's final state.
	live := map[string]bool{}
	for _, e := range r.got() {
		var op, name, rest string
		fmt.Sscan(e, &op, &name, &rest)
		live[name] = op != "delete"
	}
	var want []string
	for name, ok := range live {
		if ok {
			want = append(want, "ns/"+name)
		}
	}
	sort.Strings(want)
	if got := podNames(s.ListPods()); !reflect.DeepEqual(got, want) {
		t.Fatalf("registry has %v, listener events leave %v", got, want)
	}
	for _, model := range s.ListModels() {
		pods, _ := s.ListPodsByModel(model)
		for _, p := range pods {
			if p.Model != model {
				t.Fatalf("pod %s listed under %s but serves %s", p.ID, model, p.Model)
			}
		}
	}
}

func BenchmarkListPodsByModel(b *testing.B) {
	s := newTestStore(b, noScrape())
	for i := range 64 {
		s.AddOrUpdatePod(testPod("ns", fmt.Sprint("p", i), fmt.Sprint("m", i%4), "10.0.0.1"))
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if pods, err := s.ListPodsByModel("m1"); err != nil || len(pods) != 16 {
				b.Fatal(len(pods), err)
			}
		}
	})
}

func TestAModelLabelIsTrimmedLikeTheKVEventManagerTrimsIt(t *testing.T) {
	s := newTestStore(t, noScrape())
	s.AddOrUpdatePod(testPod("ns", "spaced", "llama ", "10.0.0.1"))
	s.AddOrUpdatePod(testPod("ns", "plain", "llama", "10.0.0.2"))
	pods, err := s.ListPodsByModel("llama")
	if err != nil || !reflect.DeepEqual(podNames(pods), []string{"ns/plain", "ns/spaced"}) {
		t.Fatalf("ListPodsByModel(llama) = %v, %v; want both pods", podNames(pods), err)
	}
	if models := s.ListModels(); !reflect.DeepEqual(models, []string{"llama"}) || s.HasModel("llama ") {
		t.Fatalf("models %q; want llama alone", models)
	}
	if models, _ := s.ListModelsByPod(pkey("ns", "spaced")); !reflect.DeepEqual(models, []string{"llama"}) {
		t.Fatalf("the spaced pod serves %q, want llama", models)
	}
}
