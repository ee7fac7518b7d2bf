package transport

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// ZMQClientMetrics records the metrics of one stream (one pod, one
// data-parallel rank). It is safe for concurrent use. A nil
// *ZMQClientMetrics records nothing: that is what a client configured
// without KVCacheMetrics uses.
type ZMQClientMetrics struct {
	parent *KVCacheMetrics
	labels prometheus.Labels

	connections       prometheus.Counter
	disconnections    prometheus.Counter
	reconnectAttempts prometheus.Counter
	received          [len(eventTypes)]prometheus.Counter
	processed         [len(eventTypes)]prometheus.Counter
	duration          prometheus.Observer
	missed            prometheus.Counter
	replayRequests    prometheus.Counter
	replaySuccess     prometheus.Counter
	replayFailures    prometheus.Counter
	replayed          prometheus.Counter
	batches           prometheus.Counter
	resets            [len(resetReasons)]prometheus.Counter
	skipUnknownEvent  prometheus.Counter
	skipUnknownKey    prometheus.Counter
	skipUnknownField  prometheus.Counter
	errors            map[string]prometheus.Counter // read-only after construction
	status            prometheus.Gauge
	lastSeq           prometheus.Gauge
	topicMismatch     prometheus.Gauge
}

// Delete removes every series of the stream from the registry, for a stream
// that is gone. Recording after Delete creates the series again.
func (m *ZMQClientMetrics) Delete() {
	if m == nil {
		return
	}
	p := m.parent
	for _, v := range []*prometheus.MetricVec{p.connections.MetricVec, p.disconnections.MetricVec,
		p.reconnectAttempts.MetricVec, p.eventsReceived.MetricVec, p.eventsProcessed.MetricVec,
		p.processingDuration.MetricVec, p.missedEvents.MetricVec, p.replayRequests.MetricVec,
		p.replaySuccess.MetricVec, p.replayFailures.MetricVec, p.replayedBatches.MetricVec,
		p.batchesReceived.MetricVec, p.streamResets.MetricVec, p.decodeSkips.MetricVec,
		p.errors.MetricVec, p.connectionStatus.MetricVec, p.lastSequenceID.MetricVec, p.topicMismatch.MetricVec} {
		v.DeletePartialMatch(m.labels)
	}
}

// IncrementConnectionCount counts a connection established to the publisher.
func (m *ZMQClientMetrics) IncrementConnectionCount() {
	if m != nil {
		m.connections.Inc()
	}
}

// IncrementDisconnectionCount counts a lost connection.
func (m *ZMQClientMetrics) IncrementDisconnectionCount() {
	if m != nil {
		m.disconnections.Inc()
	}
}

// IncrementReconnectAttempts counts an attempt to reconnect.
func (m *ZMQClientMetrics) IncrementReconnectAttempts() {
	if m != nil {
		m.reconnectAttempts.Inc()
	}
}

// SetConnected sets connection_status to 1 or 0.
func (m *ZMQClientMetrics) SetConnected(connected bool) {
	if m != nil {
		setFlag(m.status, connected)
	}
}

// SetTopicMismatch sets topic_mismatch to 1 or 0 (see
// ClientStats.TopicMismatch).
func (m *ZMQClientMetrics) SetTopicMismatch(mismatch bool) {
	if m != nil {
		setFlag(m.topicMismatch, mismatch)
	}
}

// setFlag sets a 0-or-1 gauge.
func setFlag(g prometheus.Gauge, on bool) {
	if on {
		g.Set(1)
	} else {
		g.Set(0)
	}
}

// IncrementErrorCount counts an error of the given type (one of the
// ErrorType constants, or another short name).
func (m *ZMQClientMetrics) IncrementErrorCount(errorType string) {
	if m == nil {
		return
	}
	if c, ok := m.errors[errorType]; ok {
		c.Inc()
		return
	}
	m.parent.errors.WithLabelValues(m.labels[LabelPodKey], m.labels[LabelDPRank], errorType).Inc()
}

// IncrementEventCount counts one received event of the given type.
func (m *ZMQClientMetrics) IncrementEventCount(eventType string) {
	if m == nil {
		return
	}
	if i := eventTypeIndex(kvevent.EventType(eventType)); i >= 0 {
		m.received[i].Inc()
		return
	}
	m.parent.eventsReceived.WithLabelValues(m.labels[LabelPodKey], m.labels[LabelDPRank], eventType).Inc()
}

// IncrementMissedEvents counts batches lost for good.
func (m *ZMQClientMetrics) IncrementMissedEvents(count int64) {
	if m != nil && count > 0 {
		m.missed.Add(float64(count))
	}
}

// IncrementReplayCount counts a replay request sent.
func (m *ZMQClientMetrics) IncrementReplayCount() {
	if m != nil {
		m.replayRequests.Inc()
	}
}

// IncrementReplaySuccess counts a replay answered through its end marker.
func (m *ZMQClientMetrics) IncrementReplaySuccess() {
	if m != nil {
		m.replaySuccess.Inc()
	}
}

// IncrementReplayFailure counts a replay that timed out or broke the
// protocol.
func (m *ZMQClientMetrics) IncrementReplayFailure() {
	if m != nil {
		m.replayFailures.Inc()
	}
}

// RecordEventProcessingLatency records how long the handler took for one
// batch.
func (m *ZMQClientMetrics) RecordEventProcessingLatency(duration time.Duration) {
	if m != nil {
		m.duration.Observe(duration.Seconds())
	}
}

// UpdateLastSequenceID sets last_sequence_id to the seq of the last batch
// delivered.
func (m *ZMQClientMetrics) UpdateLastSequenceID(seq uint64) {
	if m != nil {
		m.lastSeq.Set(float64(seq))
	}
}

// recordReset counts a stream reset and, for a gap, the batches it lost.
func (m *ZMQClientMetrics) recordReset(r kvevent.StreamReset) {
	if m == nil {
		return
	}
	for i, reason := range resetReasons {
		if reason == r.Reason {
			m.resets[i].Inc()
		}
	}
	if n := r.Missing(); n > 0 {
		m.missed.Add(float64(n))
	}
}

// recordBatch records one delivered batch: its seq, whether it came from a
// replay, and the events received and processed per type.
func (m *ZMQClientMetrics) recordBatch(seq uint64, replayed bool, received, processed *[len(eventTypes)]int) {
	if m == nil {
		return
	}
	m.batches.Inc()
	m.lastSeq.Set(float64(seq))
	if replayed {
		m.replayed.Inc()
	}
	for i := range received {
		if received[i] > 0 {
			m.received[i].Add(float64(received[i]))
		}
		if processed[i] > 0 {
			m.processed[i].Add(float64(processed[i]))
		}
	}
}

// recordSkips counts what the decoder skipped.
func (m *ZMQClientMetrics) recordSkips(st kvevent.DecodeStats) {
	if m == nil {
		return
	}
	if st.UnknownEvents > 0 {
		m.skipUnknownEvent.Add(float64(st.UnknownEvents))
	}
	if st.UnknownKeys > 0 {
		m.skipUnknownKey.Add(float64(st.UnknownKeys))
	}
	if st.UnknownFields > 0 {
		m.skipUnknownField.Add(float64(st.UnknownFields))
	}
}
