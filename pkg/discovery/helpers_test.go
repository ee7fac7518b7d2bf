package discovery

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/endpoint"
	v1 "k8s.io/api/core/v1"
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
