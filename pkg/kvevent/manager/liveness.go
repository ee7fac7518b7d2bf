package manager

import "time"

// DefaultDeadPodTimeout is how long a followed pod may go with none of its
// streams connected and no successful metrics scrape before it counts as
// dead (ManagerConfig.DeadPodTimeout). Twice the ZMTP heartbeat timeout
// (15 s), after which a dialled stream has already noticed a peer that
// vanished, and some thirty failed scrapes at the Store's 1 s timeout: a
// network hiccup or a slow /metrics does not reach it, while a dead
// engine's blocks leave the index within half a minute of the moment both
// signals stopped.
const DefaultDeadPodTimeout = 30 * time.Second

// Liveness states of a followed pod (PodLiveness.State).
const (
	// LivenessLive: one of the pod's streams is connected, or its metrics
	// were scraped successfully within the dead-pod timeout.
	LivenessLive = "live"
	// LivenessDead: none of the pod's streams has been connected and no
	// scrape has succeeded for the dead-pod timeout. The pod was purged
	// from the index when it died and is followed afresh; it is live again
	// as soon as a stream connects or a scrape succeeds.
	LivenessDead = "dead"
)

// PodLiveness is how a followed pod stands, as the manager's liveness check
// last judged it.
type PodLiveness struct {
	// State is LivenessLive or LivenessDead.
	State string `json:"state"`
	// EventsDownSince is when the last of the pod's streams lost its
	// engine; zero while one is connected.
	EventsDownSince time.Time `json:"eventsDownSince,omitzero"`
	// LastScraped is when the pod's metrics were last scraped
	// successfully; zero if never, or when the manager has no scrape
	// signal (ManagerConfig.LastScraped).
	LastScraped time.Time `json:"lastScraped,omitzero"`
	// DeadSince is when the pod was judged dead; zero while it is live.
	DeadSince time.Time `json:"deadSince,omitzero"`
}

// podLiveness is the liveness of one followed pod as last judged. It is
// replaced, never modified, once published in KVEventManager.liveness.
type podLiveness struct {
	// target is the pod's target when judged: a pod that changed is
	// judged afresh.
	target PodTarget
	// since is when the check first saw the pod with target: the start of
	// the scrape signal's silence when no scrape ever succeeded.
	since           time.Time
	eventsDownSince time.Time
	lastScraped     time.Time
	deadSince       time.Time // zero while live
}

func (l *podLiveness) dead() bool { return !l.deadSince.IsZero() }

func (l *podLiveness) public() *PodLiveness {
	p := &PodLiveness{State: LivenessLive, EventsDownSince: l.eventsDownSince, LastScraped: l.lastScraped,
		DeadSince: l.deadSince}
	if l.dead() {
		p.State = LivenessDead
	}
	return p
}

// livenessInterval is how often the liveness check runs for a dead-pod
// timeout d: a tenth of it, at most a second, so that a dead pod is purged
// within d and one interval.
func livenessInterval(d time.Duration) time.Duration {
	return max(min(d/10, time.Second), 10*time.Millisecond)
}

// runLiveness checks the followed pods' liveness every interval until stop
// is closed.
func (m *KVEventManager) runLiveness(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(livenessInterval(m.cfg.DeadPodTimeout))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			m.checkLiveness(now)
		}
	}
}

// followedPod is a followed pod the liveness check judges.
type followedPod struct {
	key string
	st  *podStatus
}

// checkLiveness judges every followed pod at now. A pod that just died is
// queued for its worker to purge it and restart its streams; the check
// itself only reads the streams' counters and the scrape signal, and never
// waits for a reconcile.
func (m *KVEventManager) checkLiveness(now time.Time) {
	m.mu.Lock()
	pods := make([]followedPod, 0, len(m.states))
	for key, st := range m.states {
		if len(st.streams) > 0 {
			pods = append(pods, followedPod{key, st})
		}
	}
	prev := m.liveness
	m.mu.Unlock()

	next := make(map[string]*podLiveness, len(pods))
	var died []followedPod
	for _, p := range pods {
		old := prev[p.key]
		l := m.judge(old, p.st, now)
		next[p.key] = l
		switch wasDead := old != nil && old.target == l.target && old.dead(); {
		case l.dead() && !wasDead:
			died = append(died, p)
			m.logDeath(p, l, now)
		case !l.dead() && wasDead:
			m.logger.Info("Pod is alive again: a KV event stream connected or a metrics scrape succeeded", "pod", p.key,
				"model", p.st.model, "deadFor", now.Sub(old.deadSince).Round(time.Millisecond),
				"eventsConnected", l.eventsDownSince.IsZero())
		}
	}

	m.mu.Lock()
	m.liveness = next
	for _, p := range died {
		m.restarts[p.key] = struct{}{}
	}
	m.mu.Unlock()
	for _, p := range died {
		m.queue.Add(p.key)
	}
}

// judge returns the liveness of pod st at now, given its previous one. A
// live pod dies when none of its streams is connected and the later of the
// moment its last stream lost its engine and its last successful scrape
// (or the check's first sight of it, if none succeeded) is DeadPodTimeout
// ago. A dead pod stays dead, however its restarted streams fare, until a
// stream connects or a scrape succeeds.
func (m *KVEventManager) judge(prev *podLiveness, st *podStatus, now time.Time) *podLiveness {
	l := &podLiveness{target: st.target, since: now}
	if prev != nil && prev.target == st.target {
		l.since, l.deadSince = prev.since, prev.deadSince
	}
	connected := false
	for _, s := range st.streams {
		stats := s.stats.Stats()
		if stats.Connected {
			connected = true
			l.eventsDownSince = time.Time{}
			break
		}
		l.eventsDownSince = later(l.eventsDownSince, stats.DisconnectedSince)
	}
	if !connected && prev != nil && prev.target == st.target && prev.dead() && !prev.eventsDownSince.IsZero() {
		// The streams restarted at the death are younger than the
		// silence.
		l.eventsDownSince = prev.eventsDownSince
	}
	var scrapesDownSince time.Time // zero: no scrape signal, the streams decide
	if m.cfg.LastScraped != nil {
		l.lastScraped = m.cfg.LastScraped(st.key)
		scrapesDownSince = l.lastScraped
		if scrapesDownSince.IsZero() {
			scrapesDownSince = l.since
		}
	}
	switch {
	case l.dead():
		if connected || l.lastScraped.After(l.deadSince) {
			l.deadSince = time.Time{}
		}
	case !connected && now.Sub(later(l.eventsDownSince, scrapesDownSince)) >= m.cfg.DeadPodTimeout:
		l.deadSince = now
	}
	return l
}

// logDeath says that pod p died and what follows.
func (m *KVEventManager) logDeath(p followedPod, l *podLiveness, now time.Time) {
	lastScraped := "never"
	if !l.lastScraped.IsZero() {
		lastScraped = now.Sub(l.lastScraped).Round(time.Millisecond).String() + " ago"
	} else if m.cfg.LastScraped == nil {
		lastScraped = "not known"
	}
	const msg = "Pod is dead: its KV event streams are disconnected and its metrics scrapes fail; purging its blocks from the index and following it afresh"
	m.logger.Info(msg, "pod", p.key, "model", p.st.model, "eventsDownFor", now.Sub(l.eventsDownSince).Round(time.Millisecond),
		"lastScraped", lastScraped, "deadPodTimeout", m.cfg.DeadPodTimeout)
}

// takeRestart reports whether the liveness check asked for pod key's
// streams to be restarted, and forgets the request.
func (m *KVEventManager) takeRestart(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.restarts[key]
	delete(m.restarts, key)
	return ok
}

// podLivenessOf returns the published liveness of pod key with target, nil
// when the check has not judged it yet; m.mu is held.
func (m *KVEventManager) podLivenessOf(key string, target PodTarget) *PodLiveness {
	if l := m.liveness[key]; l != nil && l.target == target {
		return l.public()
	}
	return nil
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
