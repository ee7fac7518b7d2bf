package discovery

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

const millisecond = time.Millisecond

// podListener is told about pod changes, as a Store's listeners are.
type podListener interface {
	OnPodAdd(*v1.Pod)
	OnPodUpdate(old, new *v1.Pod)
	OnPodDelete(*v1.Pod)
}

// recordingSink is a PodSink that keeps the pods and tells a listener, the
// way the cache Store does.
type recordingSink struct {
	mu       sync.Mutex
	pods     map[string]*v1.Pod
	calls    int
	listener podListener
}

func newRecordingSink() *recordingSink { return &recordingSink{pods: map[string]*v1.Pod{}} }

func (s *recordingSink) AddOrUpdatePod(pod *v1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := endpoint.KeyOf(pod).String()
	old := s.pods[key]
	s.pods[key] = pod
	s.calls++
	if s.listener == nil {
		return
	}
	switch {
	case old == nil:
		s.listener.OnPodAdd(pod)
	case old.UID != pod.UID:
		s.listener.OnPodDelete(old)
		s.listener.OnPodAdd(pod)
	default:
		s.listener.OnPodUpdate(old, pod)
	}
}

func (s *recordingSink) DeletePod(k endpoint.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := k.String()
	old := s.pods[key]
	delete(s.pods, key)
	s.calls++
	if old != nil && s.listener != nil {
		s.listener.OnPodDelete(old)
	}
}

func (s *recordingSink) SetPodAdapters(endpoint.Key, []string) error { return nil }

// summary lists "key=ip" of every pod, sorted.
func (s *recordingSink) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, p := range s.pods {
		out = append(out, fmt.Sprintf("%s=%s", k, p.Status.PodIP))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func (s *recordingSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// storeOpts is the Store configuration of the tests: nothing read from the
// pods, logs at verbosity 4.
var storeOpts = cache.Config{PodMetricRefreshInterval: -1, AdapterRefreshInterval: -1, Logger: klog.Background().V(4)}

// startStore runs, as the gateway does, a Store followed by manager and fed
// by source (none when nil) with the Kubernetes configuration config, and
// returns once the source delivered the pods. stop stops the source, the
// manager and the Store in that order, returning once all have stopped; it
// is also called when the test ends.
func startStore(t testing.TB, config *rest.Config, source cache.PodSource, mgr *manager.KVEventManager) (*cache.Store, func()) {
	t.Helper()
	store, err := cache.New(storeOpts)
	if err != nil {
		t.Fatal(err)
	}
	storeCtx, stopStore := context.WithCancel(context.Background())
	storeDone := make(chan error, 1)
	go func() { storeDone <- store.Run(storeCtx) }()
	if err := mgr.Start(); err != nil {
		stopStore()
		t.Fatal(err)
	}
	store.AddPodListener(mgr)
	sourceCtx, stopSource := context.WithCancel(context.Background())
	sourceDone := make(chan error, 1)
	if source != nil {
		done, err := cache.RunPodSource(sourceCtx, source, config, store)
		if err != nil {
			stopSource()
			mgr.Stop()
			stopStore()
			t.Fatal(err)
		}
		go func() { sourceDone <- <-done }()
	} else {
		sourceDone <- nil
	}
	stop := sync.OnceFunc(func() {
		stopSource()
		if err := <-sourceDone; err != nil {
			t.Errorf("pod source: %v", err)
		}
		mgr.Stop()
		stopStore()
		<-storeDone
	})
	t.Cleanup(stop)
	return store, stop
}
