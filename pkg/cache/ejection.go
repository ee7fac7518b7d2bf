package cache

import (
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// EjectionReason says why a pod was ejected from routing. It labels
// kvgate_cache_pod_ejections_total.
type EjectionReason string

// Reasons to eject a pod: a request could not connect to it, so nothing was
// sent and the request may go to another pod.
const (
	// EjectConnectionRefused: the pod refused the connection (its engine
	// is not listening: it exited, or has not started).
	EjectConnectionRefused EjectionReason = "connection_refused"
	// EjectDialFailed: no connection could be set up for another reason,
	// most often a dial timeout (the pod's address does not answer).
	EjectDialFailed EjectionReason = "dial"
)

// Ejection describes a pod taken out of routing.
type Ejection struct {
	// Reason is why the pod was last ejected.
	Reason EjectionReason
	// Until is when the ejection ends unless the pod answers earlier.
	Until time.Time
	// Backoff is the ejection's length and Count the ejections in a row
	// since the pod last answered, each doubling the backoff.
	Backoff time.Duration
	Count   int
}

// podHealth is what the Store knows of whether a pod can be reached.
type podHealth struct {
	// until is when the last ejection ends, in Unix nanoseconds; 0 when
	// the pod was readmitted or never ejected.
	until atomic.Int64

	mu      sync.Mutex
	count   int
	reason  EjectionReason
	backoff time.Duration
}

// ejected reports whether the pod is ejected at now.
func (h *podHealth) ejected(now time.Time) bool {
	u := h.until.Load()
	return u != 0 && now.UnixNano() < u
}

// eject ejects the pod from now on for the next backoff, from base doubling
// up to maxBackoff, unless it is ejected already. It returns the ejection
// and whether it started it.
func (h *podHealth) eject(now time.Time, reason EjectionReason, base, maxBackoff time.Duration) (Ejection, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ejected(now) {
		return h.snapshotLocked(), false
	}
	h.count++
	if h.count == 1 {
		h.backoff = min(base, maxBackoff)
	} else {
		h.backoff = min(2*h.backoff, maxBackoff)
	}
	h.reason = reason
	h.until.Store(now.Add(h.backoff).UnixNano())
	return h.snapshotLocked(), true
}

// reset readmits the pod and forgets its ejections, and reports whether it
// was ejected at now. It takes no lock for a pod not ejected since it last
// answered.
func (h *podHealth) reset(now time.Time) bool {
	if h.until.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	was := h.ejected(now)
	h.count, h.reason, h.backoff = 0, "", 0
	h.until.Store(0)
	return was
}

// snapshot returns the pod's ejection and whether it lasts at now.
func (h *podHealth) snapshot(now time.Time) (Ejection, bool) {
	if !h.ejected(now) {
		return Ejection{}, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.snapshotLocked(), h.ejected(now)
}

func (h *podHealth) snapshotLocked() Ejection {
	return Ejection{Reason: h.reason, Until: time.Unix(0, h.until.Load()), Backoff: h.backoff, Count: h.count}
}

// EjectPod takes pod out of routing after a request could not connect to
// it: PodEjection reports it ejected for Config.EjectionBackoff (1 s by
// default), doubled by each ejection that follows before the pod answers
// again, up to Config.MaxEjectionBackoff (30 s). A pod ejected already stays
// ejected as it is: requests sent before its ejection fail too, and say
// nothing new. PodReachable readmits the pod and resets its backoff, and so
// does a successful scrape of its /metrics when the pod serves them on the
// port requests go to. A pod that is not registered, or registered with
// another UID (replaced), is ignored. Each ejection is counted in
// kvgate_cache_pod_ejections_total and logged. Which pods routing then
// avoids is the caller's choice; the gateway keeps a model's ejected pods
// as candidates when all of its pods are ejected.
func (s *Store) EjectPod(pod *endpoint.Endpoint, reason EjectionReason) {
	e := s.entryOf(pod)
	if e == nil {
		return
	}
	ej, started := e.state.health.eject(s.now(), reason, s.cfg.EjectionBackoff, s.cfg.MaxEjectionBackoff)
	if !started {
		return
	}
	s.countEjection(e, reason)
	s.log.Info("Ejected pod from routing: a request could not connect to it", "pod", klog.KObj(e.ep.Pod),
		"model", e.ep.Model, "reason", reason, "for", ej.Backoff, "ejectionsInARow", ej.Count)
}

// countEjection counts an ejection of the pod of e unless the pod left the
// registry meanwhile. It holds notifyMu, under which DeletePod unregisters a
// pod and deletes its series, so that no series of a deleted pod is
// recreated.
func (s *Store) countEjection(e *podEntry, reason EjectionReason) {
	s.reg.notifyMu.Lock()
	defer s.reg.notifyMu.Unlock()
	if s.reg.entry(e.ep.Key) == nil {
		return
	}
	s.metrics.podEjections.WithLabelValues(e.ep.ID, string(reason)).Inc()
}

// PodReachable records that a request reached pod (it answered, whatever
// the status): an ejected pod is readmitted, and its next ejection starts
// from the first backoff again. For a pod not ejected since it last
// answered it costs one registry lookup and takes no lock.
func (s *Store) PodReachable(pod *endpoint.Endpoint) {
	if e := s.entryOf(pod); e != nil {
		s.readmit(e, "request")
	}
}

// PodEjection returns the ejection of pod and true while it lasts; false
// when the pod is not ejected, not registered or registered with another
// UID.
func (s *Store) PodEjection(pod *endpoint.Endpoint) (Ejection, bool) {
	e := s.entryOf(pod)
	if e == nil {
		return Ejection{}, false
	}
	return e.state.health.snapshot(s.now())
}

// readmit ends the ejection of the pod of e, logging it when one was under
// way; by says what showed the pod reachable: "request" or "scrape".
func (s *Store) readmit(e *podEntry, by string) {
	if e.state.health.reset(s.now()) {
		s.log.Info("Readmitted pod to routing", "pod", klog.KObj(e.ep.Pod), "model", e.ep.Model, "reachedBy", by)
	}
}

// entryOf returns the registered entry of pod, nil when the pod is not
// registered or was replaced by one of another UID.
func (s *Store) entryOf(pod *endpoint.Endpoint) *podEntry {
	e := s.reg.entry(pod.Key)
	if e == nil || e.ep.UID != pod.UID {
		return nil
	}
	return e
}

// ejectedPods counts the routable pods ejected now.
func (s *Store) ejectedPods() float64 {
	now := s.now()
	n := 0
	for _, e := range s.reg.entries() {
		if e.ep.Ready() && e.state.health.ejected(now) {
			n++
		}
	}
	return float64(n)
}
