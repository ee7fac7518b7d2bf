package routing

import (
	"sync"

	v1 "k8s.io/api/core/v1"
)

// maxPodKeys bounds the pod keys kept; beyond it the cache starts afresh, so
// that the keys of pods long gone do not accumulate.
const maxPodKeys = 4096

// podKeys caches the "namespace/name" keys of pods, so that a decision does
// not build a string per candidate.
type podKeys struct {
	mu   sync.RWMutex
	keys map[podName]string
}

type podName struct{ namespace, name string }

// key returns the pod's "namespace/name".
func (k *podKeys) key(p *v1.Pod) string {
	n := podName{p.Namespace, p.Name}
	k.mu.RLock()
	s, ok := k.keys[n]
	k.mu.RUnlock()
	if ok {
		return s
	}
	s = p.Namespace + "/" + p.Name
	k.mu.Lock()
	if k.keys == nil || len(k.keys) >= maxPodKeys {
		k.keys = make(map[podName]string)
	}
	k.keys[n] = s
	k.mu.Unlock()
	return s
}
