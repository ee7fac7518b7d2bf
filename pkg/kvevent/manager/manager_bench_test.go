package manager

import (
	"testing"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
)

// BenchmarkTargetForPod measures the eligibility check a reconcile runs for
// every pod update.
func BenchmarkTargetForPod(b *testing.B) {
	pod := makePod(podSpec{name: "vllm-0", ports: kvtest.Ports{Pub: 5557, Router: 5600}, dpSize: 4})
	d := DefaultStreamDefaults()
	b.ReportAllocs()
	for b.Loop() {
		if _, reason, _ := TargetForPod(pod, d); reason != "" {
			b.Fatal(reason)
		}
	}
}

// BenchmarkOnPodUpdate measures what a pod callback costs the Store's
// notifying goroutine: recording the pod and queueing its key.
func BenchmarkOnPodUpdate(b *testing.B) {
	m, err := NewKVEventManager(ManagerConfig{Index: newMemIndex(), Logger: klog.Background().V(4)})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Stop()
	pod := makePod(podSpec{name: "vllm-0", ports: kvtest.Ports{Pub: 5557, Router: 5558}})
	b.ReportAllocs()
	for b.Loop() {
		m.OnPodUpdate(pod, pod)
	}
}
