package transport

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// Verbosities of a stream's logs. Errors are always logged, and connection
// changes, resets and topic mismatches at verbosity 0.
const (
	// logDebug is the verbosity of dialling, redials and replay requests.
	logDebug = 4
	// logTrace is the verbosity of every delivered batch.
	logTrace = 5
)

// observer records what happens to one stream: each method is one event,
// counted in the stream's metrics (when it has any) and its statistics
// (ClientStats) and logged, all from that one call. Statistics are updated
// after metrics, so that whoever sees an event counted in Stats finds it in
// the metrics too. The stream's owner calls the observer; other goroutines
// read the statistics and the connection state, so it is safe for
// concurrent use.
type observer struct {
	podKey      string
	model       string
	rank        int
	topic       string // subscribed topic
	pubEndpoint string
	maxDelay    time.Duration // the longest a quiet stream waits for a probe
	logger      klog.Logger   // with the stream's pod, model and rank
	m           *streamMetrics
	counters    clientCounters
	conn        connState
	limits      [numLogKinds]logLimiter // owner only
}

// logKind is a kind of line a stream may log once per message, replay or
// connection attempt, rate-limited separately (see logLimiter).
type logKind int

const (
	logDecodeError logKind = iota
	logHandlerError
	logMalformed
	logReplayFailed
	logSocketFailed
	logHandshakeFailed
	logLimitHit
	numLogKinds
)

// logKindNames name the log kinds in summaries.
var logKindNames = [numLogKinds]string{"decode_error", "handler_error", "malformed_message", "replay_failed",
	"socket_failed", "handshake_failed", "limit_hit"}

// limited reports whether a line of kind may be logged now, logging the
// summary of the lines of that kind suppressed in the interval that ended.
func (o *observer) limited(kind logKind) bool {
	ok, summary := o.limits[kind].allow(time.Now())
	if summary > 0 {
		o.logSuppressed(kind, summary)
	}
	if !ok {
		o.counters.suppressedLogs.Add(1)
	}
	return ok
}

// flushLogs logs the summaries of the intervals that are over at now.
func (o *observer) flushLogs(now time.Time) {
	for kind := range o.limits {
		if n := o.limits[kind].due(now); n > 0 {
			o.logSuppressed(logKind(kind), n)
		}
	}
}

func (o *observer) logSuppressed(kind logKind, n int) {
	o.logger.Info("Suppressed repeated log lines of this KV event stream", "kind", logKindNames[kind], "lines", n,
		"interval", logInterval, "burst", logBurst)
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
	if cfg.Metrics != nil {
		o.m = cfg.Metrics.forStream(cfg.PodKey, cfg.DPRank)
	}
	o.conn.init()
	return o
}

// close marks the stream gone for good: waiters on its connection give up
// and its metric series are removed.
func (o *observer) close() {
	o.conn.close()
	if o.m != nil {
		o.m.delete()
	}
}

// debug returns the logger of debug messages, enabled or not.
func (o *observer) debug() klog.Logger { return o.logger.V(logDebug) }

// error counts an error of kind, unless it is kindUncounted.
func (o *observer) error(kind errorKind) {
	if o.m != nil && kind != kindUncounted {
		o.m.errors[kind].Inc()
	}
}

// setConnected records a connection change; counted changes are ones the
// transport saw happen (closing the sockets is not a disconnection).
func (o *observer) setConnected(connected, counted bool) {
	if o.conn.isConnected() == connected {
		return // only the owner changes it
	}
	if o.m != nil {
		setFlag(o.m.status, connected)
	}
	switch {
	case counted && connected:
		if o.m != nil {
			o.m.connections.Inc()
		}
		o.counters.connections.Add(1)
		o.logger.Info("Connected to KV event publisher", "endpoint", o.pubEndpoint)
	case counted:
		if o.m != nil {
			o.m.disconnections.Inc()
		}
		o.counters.disconnections.Add(1)
		o.logger.Info("Disconnected from KV event publisher", "endpoint", o.pubEndpoint)
	}
	o.conn.set(connected)
}

// reconnectAttempt counts an attempt to reconnect: a redial of libzmq, or
// a reconnection asked for.
func (o *observer) reconnectAttempt() {
	if o.m != nil {
		o.m.reconnectAttempts.Inc()
	}
	o.counters.reconnectAttempts.Add(1)
}

// socketFailed counts and logs a socket that could not be set up or used.
func (o *observer) socketFailed(err error, msg string, keysAndValues ...any) {
	o.error(kindSocket)
	if o.limited(logSocketFailed) {
		o.logger.Error(err, msg, keysAndValues...)
	}
}

// handshakeFailed counts and logs a connection whose ZMTP handshake failed.
func (o *observer) handshakeFailed(endpoint, event string, errno int) {
	o.error(kindSocket)
	if o.limited(logHandshakeFailed) {
		o.logger.Info("Handshake with KV event publisher failed", "endpoint", endpoint, "event", event, "errno", errno)
	}
}

// malformed counts and logs a dropped live message that is not [topic,
// seq, payload]: n frames, the first of which are frames.
func (o *observer) malformed(frames [][]byte, n int) {
	o.error(kindMalformed)
	o.counters.malformed.Add(1)
	if o.limited(logMalformed) {
		o.logger.Error(errMalformed(frames, n), "Dropping malformed KV event message")
	}
}

// replayRequested counts a replay request sent to endpoint.
func (o *observer) replayRequested(from uint64, endpoint string) {
	if o.m != nil {
		o.m.replayRequests.Inc()
	}
	o.counters.replayRequests.Add(1)
	if l := o.debug(); l.Enabled() {
		l.Info("Requested replay", "fromSeq", from, "endpoint", endpoint)
	}
}

// replaySucceeded counts a replay answered through its end marker.
func (o *observer) replaySucceeded() {
	if o.m != nil {
		o.m.replaySuccess.Inc()
	}
	o.counters.replaySuccesses.Add(1)
}

// replayFailed counts and logs a replay that failed with err; kind is the
// error it counts as besides.
func (o *observer) replayFailed(kind errorKind, err error, endpoint string, retryIn time.Duration) {
	if o.m != nil {
		o.m.replayFailures.Inc()
	}
	o.error(kind)
	o.counters.replayFailures.Add(1)
	if o.limited(logReplayFailed) {
		o.logger.Error(err, "Replay failed", "endpoint", endpoint, "retryIn", retryIn)
	}
}

// replayStalled counts and logs a replay that stopped answering before its
// end marker, after replies of its own: a failed replay, whose replies
// still count, and after which the stream replays what is missing at once.
func (o *observer) replayStalled(replies int, timeout time.Duration, endpoint string) {
	if o.m != nil {
		o.m.replayFailures.Inc()
	}
	o.counters.replayFailures.Add(1)
	o.counters.replaysCut.Add(1)
	if o.limited(logReplayFailed) {
		o.logger.Error(fmt.Errorf("no end marker after %d replies and %v of silence", replies, timeout),
			"Replay stopped before its end", "endpoint", endpoint)
	}
}

// replayCut counts and logs a replay cut short at limit after replies
// replies.
func (o *observer) replayCut(limit string, replies int, endpoint string) {
	o.limitHit(limit)
	o.counters.replaysCut.Add(1)
	if o.limited(logLimitHit) {
		o.logger.Info("Replay cut short: the rest is replayed again", "limit", limit, "replies", replies, "endpoint", endpoint)
	}
}

// limitHit counts one hit of a bound (a Limit* label value).
func (o *observer) limitHit(limit string) {
	if o.m != nil {
		o.m.limit(limit).Inc()
	}
	if limit == LimitPendingBuffer {
		o.counters.pendingOverflows.Add(1)
	}
}

// droppedLive counts and logs a live message dropped because the stream's
// receive buffer of limit bytes was full.
func (o *observer) droppedLive(seq uint64, size, limit int) {
	o.limitHit(LimitReceiveBuffer)
	o.counters.dropped.Add(1)
	if o.limited(logLimitHit) {
		o.logger.Info("Dropping a live KV event batch: the stream's receive buffer is full; it will be replayed",
			"seq", seq, "bytes", size, "bufferBytes", limit)
	}
}

// flooded counts and logs a disconnection from an engine that sent more
// than a second receive buffer of bufferBytes while the first was full.
func (o *observer) flooded(redialIn time.Duration, bufferBytes int) {
	o.limitHit(LimitFlood)
	o.logger.Info("The engine sends faster than the stream applies its batches: disconnecting for a while",
		"redialIn", redialIn, "bufferBytes", bufferBytes)
}

// droppedSuspended counts a live message dropped while the stream is
// suspended.
func (o *observer) droppedSuspended() { o.counters.dropped.Add(1) }

// suspended counts and logs a suspension of delay for more than resets
// resets within window.
func (o *observer) suspended(delay time.Duration, resets int, window time.Duration) {
	o.limitHit(LimitResetRate)
	if o.m != nil {
		o.m.suspended.Set(1)
	}
	o.counters.suspensions.Add(1)
	o.counters.suspended.Store(true)
	o.logger.Info("KV event stream resets too often: ignoring its engine for a while", "suspendedFor", delay,
		"maxResets", resets, "window", window)
}

// resumed records the end of a suspension.
func (o *observer) resumed() {
	if o.m != nil {
		o.m.suspended.Set(0)
	}
	o.counters.suspended.Store(false)
	o.logger.Info("KV event stream resumes after its suspension")
}

// reset counts and logs a reset the handler is about to get.
func (o *observer) reset(r kvevent.StreamReset) {
	if o.m != nil {
		for i, reason := range resetReasons {
			if reason == r.Reason {
				o.m.resets[i].Inc()
			}
		}
		if n := r.Missing(); n > 0 {
			o.m.missed.Add(float64(n))
		}
	}
	switch r.Reason {
	case kvevent.ResetPublisherRestart:
		o.counters.publisherRestarts.Add(1)
		o.counters.joinedAt.Store(0)
	case kvevent.ResetUnrecoverableGap:
		o.counters.missedBatches.Add(r.Missing())
		o.counters.unrecoverableGaps.Add(1)
	case kvevent.ResetRewind:
		o.counters.rewinds.Add(1)
	}
	if r.Reason == kvevent.ResetRewind {
		o.logger.Info("Rewinding KV event stream", "nextSeq", r.NextSeq)
		return
	}
	o.logger.Info("KV event stream reset: state derived from it is incomplete",
		"reason", r.Reason, "nextSeq", r.NextSeq, "firstMissing", r.FirstMissing, "lastMissing", r.LastMissing)
}

// heard records when the engine was last heard from.
func (o *observer) heard(now time.Time) { o.counters.lastHeardNanos.Store(now.UnixNano()) }

// joined records and logs that the stream begins at seq at, having found
// nothing from seq from on before it.
func (o *observer) joined(from, at uint64) {
	o.counters.joinedAt.Store(at)
	o.logger.Info("Joined KV event stream after its first batches: the engine no longer buffers them, or never sent them",
		"fromSeq", from, "firstSeq", at)
}

// eventCounts are a batch's events per type, in eventTypes order.
type eventCounts [len(eventTypes)]int

// batchDelivered records batch seq, which arrived at start and came from a
// replay or not: events decoded, received and processed (applied without a
// handler error) per type, and what the decoder skipped.
func (o *observer) batchDelivered(seq uint64, replayed bool, start time.Time, events int, received, processed *eventCounts, skips kvevent.DecodeStats) {
	if m := o.m; m != nil {
		m.duration.Observe(time.Since(start).Seconds())
		m.recordBatch(seq, replayed, received, processed)
		if skips.UnknownEvents > 0 {
			m.skipUnknownEvent.Add(float64(skips.UnknownEvents))
		}
		if skips.UnknownKeys > 0 {
			m.skipUnknownKey.Add(float64(skips.UnknownKeys))
		}
		if skips.UnknownFields > 0 {
			m.skipUnknownField.Add(float64(skips.UnknownFields))
		}
	}
	o.counters.events.Add(uint64(events))
	o.countBatch(seq, replayed, start)
	if l := o.logger.V(logTrace); l.Enabled() {
		l.Info("Delivered KV event batch", "seq", seq, "events", events, "replayed", replayed)
	}
}

// batchUndecodable records batch seq, which arrived at start, as delivered
// and dropped: its payload of size bytes did not decode.
func (o *observer) batchUndecodable(seq uint64, replayed bool, start time.Time, size int, err error) {
	o.error(kindDecode)
	if errors.Is(err, kvevent.ErrBatchTooLarge) {
		o.limitHit(LimitDecodedBatch)
	}
	if o.m != nil {
		o.m.recordBatch(seq, replayed, &eventCounts{}, &eventCounts{})
	}
	o.counters.decodeErrors.Add(1)
	o.countBatch(seq, replayed, start)
	if o.limited(logDecodeError) {
		o.logger.Error(fmt.Errorf("decode batch seq %d from %s: %w", seq, o.pubEndpoint, err),
			"Dropping undecodable KV event batch", "seq", seq, "bytes", size)
	}
}

// countBatch counts a delivered batch in the statistics, the batch count
// last.
func (o *observer) countBatch(seq uint64, replayed bool, start time.Time) {
	k := &o.counters
	k.lastSeq.Store(seq)
	k.lastEventNanos.Store(start.UnixNano())
	if replayed {
		k.replayed.Add(1)
	}
	k.batches.Add(1)
}

// recordBatch records one delivered batch: its seq, whether it came from a
// replay, and the events received and processed per type.
func (m *streamMetrics) recordBatch(seq uint64, replayed bool, received, processed *eventCounts) {
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

// handlerFailed counts and logs an error the handler returned for batch
// seq.
func (o *observer) handlerFailed(seq uint64, err error) {
	o.error(kindHandler)
	o.counters.handlerErrors.Add(1)
	if o.limited(logHandlerError) {
		o.logger.Error(err, "KV event handler failed", "seq", seq)
	}
}

// topicMismatch reports whether the stream counts as having its live
// messages filtered out.
func (o *observer) topicMismatch() bool { return o.counters.topicMismatch.Load() }

// topicExplainsSilence reports whether the subscription's topic may be why
// no live message arrives: the publisher's topic is unknown (its replay
// replies carry none before vLLM v0.26) or does not start with the
// subscribed one, as ZeroMQ's prefix filter requires.
func (o *observer) topicExplainsSilence() bool {
	pt := o.counters.publisherTopic.Load()
	return pt == nil || !pt.prefixed
}

// seenTopic is the topic frame of a publisher's replay replies as a stream
// keeps it: as logs and statistics show it (see shown), and whether the
// subscribed topic is a prefix of the whole of it.
type seenTopic struct {
	shown    string
	prefixed bool
}

// publisherTopic records the topic frame of a replay reply.
func (o *observer) publisherTopic(topic []byte) {
	prefixed := len(topic) >= len(o.topic) && string(topic[:len(o.topic)]) == o.topic
	if cur := o.counters.publisherTopic.Load(); cur != nil && cur.prefixed == prefixed && shownAs(cur.shown, topic) {
		return
	}
	o.counters.publisherTopic.Store(&seenTopic{shown: shown(topic), prefixed: prefixed})
}

// shownAs reports whether s is how topic is shown, without copying topic.
func shownAs(s string, topic []byte) bool {
	if len(topic) <= maxShown {
		return s == string(topic)
	}
	return len(s) == maxShown+len("...") && s[:maxShown] == string(topic[:maxShown]) && s[maxShown:] == "..."
}

// setTopicMismatch records whether the stream's live messages are filtered
// out, and logs the change: the start always, as an error, since every
// batch then reaches the handler only through a quiet-stream replay, up to
// MaxReconnectDelay late.
func (o *observer) setTopicMismatch(on bool) {
	if o.m != nil {
		setFlag(o.m.topicMismatch, on)
	}
	o.counters.topicMismatch.Store(on)
	if !on {
		o.logger.Info("Live KV events arrive again", "topic", o.topic)
		return
	}
	const msg = "KV events arrive only through replay: the subscription filters out every live message"
	if pt := o.counters.publisherTopic.Load(); pt != nil {
		o.logger.Error(fmt.Errorf("subscribed to topic %q, but the publisher's replay replies carry topic %q", o.topic, pt.shown),
			msg, "topic", o.topic, "publisherTopic", pt.shown, "maxDelay", o.maxDelay)
		return
	}
	o.logger.Error(fmt.Errorf("no live message arrived while %d replays delivered new batches; the publisher's replay "+
		"replies do not name its topic (vLLM before v0.26): check that topic %q is a prefix of the engine's", topicMismatchReplays, o.topic),
		msg, "topic", o.topic, "maxDelay", o.maxDelay)
}

// connState tracks whether the stream is connected, since when, and lets
// callers wait for it.
type connState struct {
	mu        sync.Mutex
	connected bool
	changed   time.Time     // when connected last changed, or the stream was created
	up        chan struct{} // closed while connected
	closed    chan struct{} // closed by close
}

func (s *connState) init() {
	s.up = make(chan struct{})
	s.closed = make(chan struct{})
	s.changed = time.Now()
}

// set records a changed state.
func (s *connState) set(connected bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connected = connected
	s.changed = time.Now()
	if connected {
		close(s.up)
	} else {
		s.up = make(chan struct{})
	}
}

func (s *connState) isConnected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connected
}

// state returns whether the stream is connected and, when it is not, since
// when: the time it last lost its engine, or was created if it never had
// one.
func (s *connState) state() (connected bool, disconnectedSince time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.connected {
		return true, time.Time{}
	}
	return false, s.changed
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
