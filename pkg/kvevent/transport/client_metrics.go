package transport

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// errorKind is the error_type of an error a stream counts.
type errorKind int

const (
	kindDecode errorKind = iota
	kindHandler
	kindMalformed
	kindReplayProtocol
	kindSocket
	numErrorKinds
	// kindUncounted is a failure counted only as what it is (a replay
	// timing out), not as an error.
	kindUncounted errorKind = -1
)

// errorTypes are the error_type label values of the error kinds.
var errorTypes = [numErrorKinds]string{ErrorTypeDecode, ErrorTypeHandler, ErrorTypeMalformed, ErrorTypeReplayProtocol, ErrorTypeSocket}

// streamMetrics are the series of one stream (one pod, one data-parallel
// rank) in a KVCacheMetrics, resolved once so that recording costs no label
// lookups. Its observer records them; a stream without metrics has none.
type streamMetrics struct {
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
	errors            [numErrorKinds]prometheus.Counter
	limits            [len(limits)]prometheus.Counter
	status            prometheus.Gauge
	lastSeq           prometheus.Gauge
	topicMismatch     prometheus.Gauge
	suspended         prometheus.Gauge
}

// forStream returns the series of the stream of pod podKey, rank dpRank,
// with its gauges at 0.
func (m *KVCacheMetrics) forStream(podKey string, dpRank int) *streamMetrics {
	rank := strconv.Itoa(dpRank)
	c := &streamMetrics{
		parent:            m,
		labels:            prometheus.Labels{LabelPodKey: podKey, LabelDPRank: rank},
		connections:       m.connections.WithLabelValues(podKey, rank),
		disconnections:    m.disconnections.WithLabelValues(podKey, rank),
		reconnectAttempts: m.reconnectAttempts.WithLabelValues(podKey, rank),
		duration:          m.processingDuration.WithLabelValues(podKey, rank),
		missed:            m.missedEvents.WithLabelValues(podKey, rank),
		replayRequests:    m.replayRequests.WithLabelValues(podKey, rank),
		replaySuccess:     m.replaySuccess.WithLabelValues(podKey, rank),
		replayFailures:    m.replayFailures.WithLabelValues(podKey, rank),
		replayed:          m.replayedBatches.WithLabelValues(podKey, rank),
		batches:           m.batchesReceived.WithLabelValues(podKey, rank),
		skipUnknownEvent:  m.decodeSkips.WithLabelValues(podKey, rank, SkipKindUnknownEvent),
		skipUnknownKey:    m.decodeSkips.WithLabelValues(podKey, rank, SkipKindUnknownKey),
		skipUnknownField:  m.decodeSkips.WithLabelValues(podKey, rank, SkipKindUnknownField),
		status:            m.connectionStatus.WithLabelValues(podKey, rank),
		lastSeq:           m.lastSequenceID.WithLabelValues(podKey, rank),
		topicMismatch:     m.topicMismatch.WithLabelValues(podKey, rank),
		suspended:         m.suspended.WithLabelValues(podKey, rank),
	}
	for i, t := range eventTypes {
		c.received[i] = m.eventsReceived.WithLabelValues(podKey, rank, string(t))
		c.processed[i] = m.eventsProcessed.WithLabelValues(podKey, rank, string(t))
	}
	for i, r := range resetReasons {
		c.resets[i] = m.streamResets.WithLabelValues(podKey, rank, string(r))
	}
	for i, t := range errorTypes {
		c.errors[i] = m.errors.WithLabelValues(podKey, rank, t)
	}
	for i, l := range limits {
		c.limits[i] = m.limitHits.WithLabelValues(podKey, rank, l)
	}
	c.status.Set(0)
	c.topicMismatch.Set(0)
	c.suspended.Set(0)
	return c
}

// limit returns the counter of limit (a Limit* value).
func (m *streamMetrics) limit(limit string) prometheus.Counter {
	for i, l := range limits {
		if l == limit {
			return m.limits[i]
		}
	}
	panic("kvevent: unknown limit " + limit)
}

// delete removes every series of the stream from the registry, for a
// stream that is gone.
func (m *streamMetrics) delete() {
	p := m.parent
	for _, v := range []*prometheus.MetricVec{p.connections.MetricVec, p.disconnections.MetricVec,
		p.reconnectAttempts.MetricVec, p.eventsReceived.MetricVec, p.eventsProcessed.MetricVec,
		p.processingDuration.MetricVec, p.missedEvents.MetricVec, p.replayRequests.MetricVec,
		p.replaySuccess.MetricVec, p.replayFailures.MetricVec, p.replayedBatches.MetricVec,
		p.batchesReceived.MetricVec, p.streamResets.MetricVec, p.decodeSkips.MetricVec,
		p.errors.MetricVec, p.connectionStatus.MetricVec, p.lastSequenceID.MetricVec, p.topicMismatch.MetricVec,
		p.limitHits.MetricVec, p.suspended.MetricVec} {
		v.DeletePartialMatch(m.labels)
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
