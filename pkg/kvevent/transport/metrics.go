package transport

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// Metric label names.
const (
	LabelPodKey    = "pod_key"
	LabelDPRank    = "dp_rank"
	LabelEventType = "event_type"
	LabelErrorType = "error_type"
	LabelReason    = "reason"
	LabelKind      = "kind"
	LabelLimit     = "limit"
)

// Values of the error_type label.
const (
	ErrorTypeDecode         = "decode"
	ErrorTypeHandler        = "handler"
	ErrorTypeMalformed      = "malformed_message"
	ErrorTypeReplayProtocol = "replay_protocol"
	ErrorTypeSocket         = "socket"
)

// Values of the limit label of aibrix_kvcache_zmq_limit_hits_total: the
// bounds a stream holds its engine to (see ZMQClientConfig).
const (
	// LimitReceiveBuffer counts live messages dropped because the
	// stream's receive buffer (ReceiveBufferBytes) was full.
	LimitReceiveBuffer = "receive_buffer"
	// LimitReplayBuffer counts replays cut short because their replies
	// filled the receive buffer.
	LimitReplayBuffer = "replay_buffer"
	// LimitReplayBatches counts replays cut short after MaxReplayBatches
	// replies.
	LimitReplayBatches = "replay_batches"
	// LimitReplayDuration counts replays cut short after
	// MaxReplayDuration.
	LimitReplayDuration = "replay_duration"
	// LimitPendingBuffer counts overflows of the live batches buffered
	// while a gap is replayed (MaxPendingBatches, MaxPendingBytes).
	LimitPendingBuffer = "pending_buffer"
	// LimitResetRate counts suspensions of a stream that reset more than
	// MaxResets times within ResetWindow.
	LimitResetRate = "reset_rate"
	// LimitFlood counts disconnections from a dialled engine that sent
	// more than twice ReceiveBufferBytes faster than the stream read it.
	LimitFlood = "flood"
	// LimitDecodedBatch counts batches dropped because they would decode
	// to more memory than their size allows (kvevent.ErrBatchTooLarge);
	// each is also a decode error.
	LimitDecodedBatch = "decoded_batch"
)

// limits are the limit label values, in streamMetrics.limits order.
var limits = [...]string{LimitReceiveBuffer, LimitReplayBuffer, LimitReplayBatches, LimitReplayDuration,
	LimitPendingBuffer, LimitResetRate, LimitFlood, LimitDecodedBatch}

// Values of the kind label of aibrix_kvcache_zmq_decode_skips_total.
const (
	SkipKindUnknownEvent = "unknown_event"
	SkipKindUnknownKey   = "unknown_key"
	SkipKindUnknownField = "unknown_field"
)

var eventTypes = [...]kvevent.EventType{kvevent.EventTypeBlockStored, kvevent.EventTypeBlockRemoved, kvevent.EventTypeAllCleared}

var resetReasons = [...]kvevent.ResetReason{kvevent.ResetPublisherRestart, kvevent.ResetUnrecoverableGap, kvevent.ResetRewind}

// eventTypeIndex returns the position of t in eventTypes, or -1.
func eventTypeIndex(t kvevent.EventType) int {
	switch t {
	case kvevent.EventTypeBlockStored:
		return 0
	case kvevent.EventTypeBlockRemoved:
		return 1
	case kvevent.EventTypeAllCleared:
		return 2
	}
	return -1
}

// KVCacheMetrics holds the Prometheus collectors of every stream of a
// process, all named aibrix_kvcache_zmq_* and labelled with the stream's
// pod_key and dp_rank. Create it once per registry with NewKVCacheMetrics
// and hand it to every stream's ZMQClientConfig.Metrics.
type KVCacheMetrics struct {
	connections        *prometheus.CounterVec
	disconnections     *prometheus.CounterVec
	reconnectAttempts  *prometheus.CounterVec
	eventsReceived     *prometheus.CounterVec
	eventsProcessed    *prometheus.CounterVec
	processingDuration *prometheus.HistogramVec
	missedEvents       *prometheus.CounterVec
	replayRequests     *prometheus.CounterVec
	replaySuccess      *prometheus.CounterVec
	replayFailures     *prometheus.CounterVec
	replayedBatches    *prometheus.CounterVec
	batchesReceived    *prometheus.CounterVec
	streamResets       *prometheus.CounterVec
	decodeSkips        *prometheus.CounterVec
	errors             *prometheus.CounterVec
	limitHits          *prometheus.CounterVec
	connectionStatus   *prometheus.GaugeVec
	lastSequenceID     *prometheus.GaugeVec
	topicMismatch      *prometheus.GaugeVec
	suspended          *prometheus.GaugeVec
}

// NewKVCacheMetrics creates the collectors and registers them on reg. When
// reg already holds collectors of the same names and labels (a second call
// with the same registry) those are reused, so every KVCacheMetrics of one
// registry feeds the same series. It fails when reg is nil or holds
// conflicting collectors.
func NewKVCacheMetrics(reg prometheus.Registerer) (*KVCacheMetrics, error) {
	if reg == nil {
		return nil, errors.New("kvevent: NewKVCacheMetrics needs a prometheus.Registerer")
	}
	stream := []string{LabelPodKey, LabelDPRank}
	with := func(extra string) []string { return []string{LabelPodKey, LabelDPRank, extra} }
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "aibrix", Subsystem: "kvcache_zmq", Name: name, Help: help}, labels)
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "aibrix", Subsystem: "kvcache_zmq", Name: name, Help: help}, stream)
	}
	m := &KVCacheMetrics{
		connections:       counter("connections_total", "Connections established to an engine's KV-event publisher.", stream),
		disconnections:    counter("disconnections_total", "Connections to an engine's KV-event publisher that were lost.", stream),
		reconnectAttempts: counter("reconnect_attempts_total", "Attempts to reconnect to an engine's KV-event publisher.", stream),
		eventsReceived:    counter("events_received_total", "KV events decoded from the stream, by type.", with(LabelEventType)),
		eventsProcessed:   counter("events_processed_total", "KV events applied without error (in the gateway: to the prefix index), by type.", with(LabelEventType)),
		processingDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "aibrix", Subsystem: "kvcache_zmq", Name: "event_processing_duration_seconds",
			Help:    "Time to apply one delivered batch (in the gateway: to the prefix index).",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 9),
		}, stream),
		missedEvents:     counter("missed_events_total", "Batches lost for good in unrecoverable gaps (vLLM's seq counts batches).", stream),
		replayRequests:   counter("replay_requests_total", "Replay requests sent to an engine's replay ROUTER.", stream),
		replaySuccess:    counter("replay_success_total", "Replays answered through their end marker.", stream),
		replayFailures:   counter("replay_failures_total", "Replays that timed out or broke the protocol.", stream),
		replayedBatches:  counter("replayed_batches_total", "Batches delivered from replay replies rather than the live stream.", stream),
		batchesReceived:  counter("batches_received_total", "Batches delivered in seq order, including ones that failed to decode.", stream),
		streamResets:     counter("stream_resets_total", "Times the state built from a stream (in the gateway: the pod's prefix index entries) stopped being exact, by reason: publisher_restart, unrecoverable_gap, rewind.", with(LabelReason)),
		decodeSkips:      counter("decode_skips_total", "Unknown events, map keys and trailing positional fields the decoder skipped, by kind.", with(LabelKind)),
		errors:           counter("errors_total", "Errors while following a stream, by type: decode, handler (applying a batch failed), malformed_message, replay_protocol, socket.", with(LabelErrorType)),
		connectionStatus: gauge("connection_status", "1 while the client is connected to the engine's publisher, else 0."),
		lastSequenceID:   gauge("last_sequence_id", "Seq of the last batch delivered."),
		topicMismatch: gauge("topic_mismatch", "1 while the stream's batches arrive only through replay, seconds late, because the "+
			"subscribed topic most likely filters out the engine's live messages (the client's log names both topics), else 0."),
		limitHits: counter("limit_hits_total", "Times a stream held its engine to a bound, by limit: receive_buffer (a live "+
			"message dropped, then replayed), replay_buffer, replay_batches and replay_duration (a replay cut short, the rest "+
			"replayed again), pending_buffer (an unrecoverable gap), reset_rate (the stream suspended), flood (a dialled "+
			"engine disconnected for a while), decoded_batch (a batch dropped that would decode to more than 16 bytes "+
			"per payload byte).", with(LabelLimit)),
		suspended: gauge("suspended", "1 while the stream ignores its engine because it reset too often, else 0."),
	}
	var err error
	for _, p := range []**prometheus.CounterVec{&m.connections, &m.disconnections, &m.reconnectAttempts,
		&m.eventsReceived, &m.eventsProcessed, &m.missedEvents, &m.replayRequests, &m.replaySuccess,
		&m.replayFailures, &m.replayedBatches, &m.batchesReceived, &m.streamResets, &m.decodeSkips, &m.errors, &m.limitHits} {
		if *p, err = registerOrReuse(reg, *p); err != nil {
			return nil, err
		}
	}
	for _, p := range []**prometheus.GaugeVec{&m.connectionStatus, &m.lastSequenceID, &m.topicMismatch, &m.suspended} {
		if *p, err = registerOrReuse(reg, *p); err != nil {
			return nil, err
		}
	}
	if m.processingDuration, err = registerOrReuse(reg, m.processingDuration); err != nil {
		return nil, err
	}
	return m, nil
}

// registerOrReuse registers c, or returns the identical collector already
// registered.
func registerOrReuse[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("kvevent: register metrics: %w", err)
}
