package manager

import "github.com/kvgate/kvgate/pkg/endpoint"

// Values of a pod's state in the manager's metrics and snapshot.
const (
	PodStateFollowed   = "followed"
	PodStateIneligible = "ineligible"
	PodStateFailed     = "failed"
)

// Reasons a pod was purged from the index, the reason label of
// kvgate_kv_event_pod_purges_total.
const (
	// PurgeDead: the pod's streams and scrapes stopped for DeadPodTimeout.
	PurgeDead = "dead"
	// PurgeChanged: something the pod's streams use changed (its
	// address, UID, model, LoRA id, ranks, or a port or topic the
	// manager's mode reads), and it is followed anew.
	PurgeChanged = "changed"
	// PurgeStopped: the pod was deleted or is no longer eligible.
	PurgeStopped = "stopped"
)

// purgeReasons lists every purge reason, for the metric's series.
var purgeReasons = []string{PurgeDead, PurgeChanged, PurgeStopped}

// podStatus is the reconciled state of one pod. It is replaced, never
// modified, once published in KVEventManager.states.
type podStatus struct {
	key     endpoint.Key
	model   string
	reason  IneligibleReason // "" when followed or failed
	err     error            // why the pod's config is invalid or its streams failed to start
	target  PodTarget        // valid when streams is not empty
	streams []*followedStream
}

func (s *podStatus) state() string {
	switch {
	case len(s.streams) > 0:
		return PodStateFollowed
	case s.reason != "":
		return PodStateIneligible
	}
	return PodStateFailed
}

// reconcile makes the streams of pod key match the pod's latest version:
// nothing to do when they already do and the pod is not dead, otherwise
// stop the current streams, purge the pod from the index, and start the
// streams the pod should have.
func (m *KVEventManager) reconcile(key string) error {
	restart := m.takeRestart(key)
	m.mu.Lock()
	pod := m.pods[key]
	prev := m.states[key]
	m.mu.Unlock()

	var next *podStatus
	var target PodTarget
	if pod != nil {
		var reason IneligibleReason
		var err error
		target, reason, err = TargetForPod(pod, m.cfg.Streams)
		target = m.followedTarget(target)
		if reason == ReasonNotReady && prev != nil && len(prev.streams) > 0 && prev.target == target {
			reason = "" // followed already: keep following it
		}
		model, _ := endpoint.Value(pod, endpoint.ModelNameLabel)
		next = &podStatus{key: endpoint.KeyOf(pod), model: model, reason: reason, err: err}
		if prev != nil && len(prev.streams) > 0 && reason == "" && prev.target == target && !restart {
			return nil
		}
	}
	if prev != nil && len(prev.streams) > 0 {
		m.follower.unfollow(prev.streams)
		m.index.PurgePod(key)
		m.metrics.streamStops.Add(float64(len(prev.streams)))
		m.metrics.purges.WithLabelValues(purgeReason(prev, next, target)).Inc()
	}
	if next == nil {
		m.mu.Lock()
		delete(m.states, key)
		m.mu.Unlock()
		m.logTransition(key, prev, nil)
		return nil
	}
	var startErr error
	if next.reason == "" {
		next.streams, startErr = m.follower.follow(target)
		if startErr != nil {
			next.err = startErr
		} else {
			next.target = target
			m.metrics.streamStarts.Add(float64(len(next.streams)))
		}
	}
	m.mu.Lock()
	m.states[key] = next
	m.mu.Unlock()
	m.logTransition(key, prev, next)
	return startErr
}

// followedTarget returns t without the fields the manager's mode does not
// read, so that a pod update changing only those keeps the pod's streams:
// connect mode dials the PUB and replay ports and subscribes to the topic
// but never uses the engine's HTTP port (EnginePort 0); bind mode names the
// engine by its HTTP port and dials its replay port but neither dials a PUB
// port nor subscribes to a topic (PubPort 0, Topic "").
func (m *KVEventManager) followedTarget(t PodTarget) PodTarget {
	if m.cfg.Bind != nil {
		t.PubPort, t.Topic = 0, ""
	} else {
		t.EnginePort = 0
	}
	return t
}

// purgeReason says why the followed pod prev is purged on its way to next
// (nil: deleted) with target: the reconcile of a pod that is still eligible
// with the same target was asked for by the liveness check.
func purgeReason(prev, next *podStatus, target PodTarget) string {
	switch {
	case next == nil || next.reason != "":
		return PurgeStopped
	case prev.target != target:
		return PurgeChanged
	}
	return PurgeDead
}

// logTransition logs a change of a pod's state, not every reconcile.
func (m *KVEventManager) logTransition(key string, prev, next *podStatus) {
	log := m.logger.WithValues("pod", key)
	switch {
	case next == nil:
		if prev != nil && len(prev.streams) > 0 {
			log.Info("Stopped following KV events: pod deleted", "model", prev.model)
		}
		return
	case next.state() == PodStateFollowed:
		t, s := next.target, next.streams[0]
		verb := "Following KV events"
		switch {
		case prev != nil && len(prev.streams) > 0 && prev.target == t:
			verb = "Following KV events afresh after the pod died"
		case prev != nil && len(prev.streams) > 0:
			verb = "Following KV events again after a change of the pod"
		}
		log.Info(verb, "model", t.Model, "mode", m.mode(), "pubEndpoint", s.pubEndpoint,
			"replayEndpoint", s.replayEndpoint, "topic", s.topic, "dpSize", t.DPSize, "loraID", t.LoraID)
		return
	case next.state() == PodStateFailed:
		log.Error(next.err, "Cannot follow KV events", "model", next.model)
		return
	}
	if prev != nil && len(prev.streams) > 0 {
		log.Info("Stopped following KV events", "model", next.model, "reason", next.reason)
	}
	if prev != nil && prev.reason == next.reason {
		return
	}
	switch next.reason {
	case ReasonInvalidConfig:
		log.Error(next.err, "Not following KV events: invalid configuration", "model", next.model)
	case ReasonKVEventsDisabled:
		log.V(2).Info("Not following KV events", "model", next.model, "reason", next.reason)
	default:
		log.V(1).Info("Not following KV events", "model", next.model, "reason", next.reason)
	}
}
