package kvevent

import (
	"fmt"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Values of a pod's state in the manager's metrics and snapshot.
const (
	PodStateFollowed   = "followed"
	PodStateIneligible = "ineligible"
	PodStateFailed     = "failed"
)

// podStatus is the reconciled state of one pod. It is replaced, never
// modified, once published in KVEventManager.states.
type podStatus struct {
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

// followedStream is one stream the manager follows.
type followedStream struct {
	id             StreamID
	pubEndpoint    string
	replayEndpoint string
	// topic is the SUB filter of a dialled stream, or the topic a bound
	// stream expects its engine to publish with.
	topic string
	since time.Time
	// client follows the stream; in bind mode it is never started and the
	// bound receiver drives its sequencer and replay socket.
	client *ZMQClient
}

// reconcile makes the streams of pod key match the pod's latest version:
// nothing to do when they already do, otherwise stop the current streams,
// purge the pod from the index, and start the streams the pod should have.
func (m *KVEventManager) reconcile(key string) error {
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
		model, _ := podValue(pod, ModelNameLabel)
		next = &podStatus{model: model, reason: reason, err: err}
		if prev != nil && len(prev.streams) > 0 && reason == "" && prev.target == target {
			return nil
		}
	}
	if prev != nil && len(prev.streams) > 0 {
		m.follower.unfollow(prev.streams)
		m.index.PurgePod(key)
		m.metrics.streamStops.Add(float64(len(prev.streams)))
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
		if prev != nil && len(prev.streams) > 0 {
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

// clientFollower follows each stream with a ZMQClient dialling the pod.
type clientFollower struct {
	m    *KVEventManager
	zctx *zmq.Context
}

func (f *clientFollower) follow(t PodTarget) ([]*followedStream, error) {
	streams := make([]*followedStream, 0, t.DPSize)
	for rank := range t.DPSize {
		s, err := f.start(t, rank)
		if err != nil {
			f.unfollow(streams)
			return nil, err
		}
		streams = append(streams, s)
	}
	return streams, nil
}

func (f *clientFollower) start(t PodTarget, rank int) (*followedStream, error) {
	id := t.Stream(rank)
	cfg := *f.m.cfg.Client
	cfg.PodKey, cfg.PodIP, cfg.ModelName = t.PodKey, t.IP, t.Model
	cfg.PubPort, cfg.RouterPort, cfg.DPRank, cfg.Topic = t.PubPort, t.ReplayPort, rank, t.Topic
	cfg.PubEndpoint, cfg.ReplayEndpoint = "", ""
	cfg.Context = f.zctx
	cfg.Logger = f.m.logger
	h := &indexHandler{index: f.m.index, stream: id,
		logger: f.m.logger.WithValues("pod", t.PodKey, "model", t.Model, "dpRank", rank)}
	c, err := NewZMQClient(&cfg, h)
	if err != nil {
		return nil, fmt.Errorf("follow %s rank %d: %w", t.PodKey, rank, err)
	}
	if err := c.Start(); err != nil {
		c.Close()
		return nil, fmt.Errorf("follow %s rank %d: %w", t.PodKey, rank, err)
	}
	return &followedStream{id: id, pubEndpoint: c.pubEndpoint, replayEndpoint: c.replayEndpoint, topic: cfg.Topic,
		since: time.Now(), client: c}, nil
}

// unfollow closes the clients all at once: each takes up to a poll
// timeout to notice.
func (f *clientFollower) unfollow(streams []*followedStream) {
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Go(s.client.Close)
	}
	wg.Wait()
}
