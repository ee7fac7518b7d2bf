package discovery

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/internal/testapiserver"
	"github.com/kvgate/kvgate/pkg/kvevent"
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

	type want struct {
		followed []string
		indexed  []string
		holds    func() bool
	}
	check := func(step string, w want) {
		t.Helper()
		eventually(t, step+": followed pods", func() bool { return slices.Equal(f.followed(), w.followed) })
		if w.holds != nil {
			eventually(t, step+": index contents", w.holds)
		}
		eventually(t, step+": indexed pods", func() bool { return slices.Equal(f.index.pods(), w.indexed) })
	}
	holdsA := func() bool { return f.index.holds(a, 1, 5) }
	holdsB := func() bool { return f.index.holds(a, 2, 3) }

	pod := f.createPod(t, "vllm-a", "127.0.0.1", port, false)
	f.createPod(t, "vllm-off", "127.0.0.2", port, true)
	check("created", want{[]string{a + "@127.0.0.1"}, []string{a}, holdsA})
	if st := podStatus(f, off); st.Reason != kvevent.ReasonKVEventsDisabled {
		t.Fatalf("unlabelled pod: %+v", st)
	}
	if _, err := f.store.GetPod("vllm-off", f.ns); err != nil {
		t.Fatalf("the Store lost the unlabelled pod: %v", err)
	}

	pod = f.setStatus(t, pod, "127.0.0.1", false)
	check("not ready", want{nil, nil, nil})
	if st := podStatus(f, a); st.Reason != kvevent.ReasonNotReady {
		t.Fatalf("unready pod: %+v", st)
	}

	pod = f.setStatus(t, pod, "127.0.0.1", true)
	check("ready again", want{[]string{a + "@127.0.0.1"}, []string{a}, holdsA})

	pod = f.relabel(t, pod, false)
	check("label removed", want{nil, nil, nil})
	pod = f.relabel(t, pod, true)
	check("relabelled", want{[]string{a + "@127.0.0.1"}, []string{a}, holdsA})

	f.deletePod(t, "vllm-a")
	check("deleted", want{nil, nil, nil})

	// A pod of the same name comes back at another address: its engine's
	// batches replace nothing of the old one.
	f.createPod(t, "vllm-a", "127.0.0.2", port, false)
	check("recreated elsewhere", want{[]string{a + "@127.0.0.2"}, []string{a}, holdsB})
	publishBatches(t, pubA, 1, 5, 7)
	publishBatches(t, pubB, 2, 3, 4)
	check("live batches", want{[]string{a + "@127.0.0.2"}, []string{a}, func() bool { return f.index.holds(a, 2, 4) }})
}

func podStatus(f *fleet, key string) kvevent.PodStatus {
	for _, ps := range f.manager.Snapshot() {
		if ps.Pod == key {
			return ps
		}
	}
	return kvevent.PodStatus{}
}
