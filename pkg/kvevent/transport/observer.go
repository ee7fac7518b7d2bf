package transport

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// observer is the part of a stream that other goroutines read: its
// counters, metrics and connection state, and its logger. The stream's
// owner writes it; it is safe for concurrent use.
type observer struct {
	podKey      string
	model       string
	rank        int
	topic       string // subscribed topic
	pubEndpoint string
	maxDelay    time.Duration // the longest a quiet stream waits for a probe
	logger      klog.Logger
	level       atomic.Int32
	metrics     *ZMQClientMetrics
	counters    clientCounters
	conn        connState
}

// newObserver returns the observer of the stream cfg describes, whose live
// messages arrive on pubEndpoint.
func newObserver(cfg *ZMQClientConfig, pubEndpoint string) *observer {
	o := &observer{podKey: cfg.PodKey, model: cfg.ModelName, rank: cfg.DPRank, topic: cfg.Topic,
		pubEndpoint: pubEndpoint, maxDelay: cfg.MaxReconnectDelay, logger: cfg.Logger}
	if o.logger.GetSink() == nil {
		o.logger = klog.Background()
	}
	o.logger = o.logger.WithValues("pod", cfg.PodKey, "model", cfg.ModelName, "dpRank", cfg.DPRank)
	level, _ := parseLogLevel(cfg.LogLevel)
	o.level.Store(int32(level))
	if cfg.Metrics != nil {
		o.metrics = cfg.Metrics.NewZMQClientMetrics(cfg.PodKey, cfg.DPRank)
	}
	o.conn.init()
	return o
}

// close marks the stream gone for good: waiters on its connection give up
// and its metric series are removed.
func (o *observer) close() {
	o.conn.close()
	o.metrics.Delete()
}

func (o *observer) logs(l logLevel) bool { return logLevel(o.level.Load()) >= l }

// logInfo logs msg when the stream's level is info or more verbose.
func (o *observer) logInfo(msg string, keysAndValues ...any) {
	if o.logs(levelInfo) {
		o.logger.Info(msg, keysAndValues...)
	}
}

// logDebug logs msg when the stream's level is debug or more verbose.
func (o *observer) logDebug(msg string, keysAndValues ...any) {
	if o.logs(levelDebug) {
		o.logger.Info(msg, keysAndValues...)
	}
}

// setConnected records a connection change; counted changes are ones the
// transport saw happen (closing the sockets is not a disconnection).
func (o *observer) setConnected(connected, counted bool) {
	if !o.conn.set(connected) {
		return
	}
	o.metrics.SetConnected(connected)
	if !counted {
		return
	}
	if connected {
		o.counters.connections.Add(1)
		o.metrics.IncrementConnectionCount()
		o.logInfo("Connected to KV event publisher", "endpoint", o.pubEndpoint)
		return
	}
	o.counters.disconnections.Add(1)
	o.metrics.IncrementDisconnectionCount()
	o.logInfo("Disconnected from KV event publisher", "endpoint", o.pubEndpoint)
}

// topicExplainsSilence reports whether the subscription's topic may be why
// no live message arrives: the publisher's topic is unknown (its replay
// replies carry none before vLLM v0.26) or does not start with the
// subscribed one, as ZeroMQ's prefix filter requires.
func (o *observer) topicExplainsSilence() bool {
	pt := o.counters.publisherTopic.Load()
	return pt == nil || !strings.HasPrefix(*pt, o.topic)
}

// notePublisherTopic records the topic frame of a replay reply.
func (o *observer) notePublisherTopic(topic []byte) {
	if cur := o.counters.publisherTopic.Load(); cur != nil && *cur == string(topic) {
		return
	}
	s := string(topic)
	o.counters.publisherTopic.Store(&s)
}

// setTopicMismatch records whether the stream's live messages are filtered
// out, and logs the change: the start always, as an error, since every
// batch then reaches the handler only through a quiet-stream replay, up to
// MaxReconnectDelay late.
func (o *observer) setTopicMismatch(on bool) {
	o.counters.topicMismatch.Store(on)
	o.metrics.SetTopicMismatch(on)
	if !on {
		o.logInfo("Live KV events arrive again", "topic", o.topic)
		return
	}
	const msg = "KV events arrive only through replay: the subscription filters out every live message"
	if pt := o.counters.publisherTopic.Load(); pt != nil {
		o.logger.Error(fmt.Errorf("subscribed to topic %q, but the publisher's replay replies carry topic %q", o.topic, *pt),
			msg, "topic", o.topic, "publisherTopic", *pt, "maxDelay", o.maxDelay)
		return
	}
	o.logger.Error(fmt.Errorf("no live message arrived while %d replays delivered new batches; the publisher's replay "+
		"replies do not name its topic (vLLM before v0.26): check that topic %q is a prefix of the engine's", topicMismatchReplays, o.topic),
		msg, "topic", o.topic, "maxDelay", o.maxDelay)
}

// connState tracks whether the stream is connected and lets callers wait
// for it.
type connState struct {
	mu        sync.Mutex
	connected bool
	up        chan struct{} // closed while connected
	closed    chan struct{} // closed by close
}

func (s *connState) init() {
	s.up = make(chan struct{})
	s.closed = make(chan struct{})
}

// set records the state and reports whether it changed.
func (s *connState) set(connected bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.connected == connected {
		return false
	}
	s.connected = connected
	if connected {
		close(s.up)
	} else {
		s.up = make(chan struct{})
	}
	return true
}

func (s *connState) isConnected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connected
}

func (s *connState) close() { close(s.closed) }

func (s *connState) wait(timeout time.Duration, endpoint string) error {
	s.mu.Lock()
	up := s.up
	s.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-up:
		return nil
	case <-s.closed:
		return ErrClientClosed
	case <-t.C:
		return fmt.Errorf("kvevent: not connected to %s after %v", endpoint, timeout)
	}
}
