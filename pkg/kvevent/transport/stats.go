package transport

import (
	"sync/atomic"
	"time"
)

// ClientStats is a snapshot of a ZMQClient's counters since it was created.
type ClientStats struct {
	PodKey    string
	ModelName string
	DPRank    int
	// Connected reports whether the stream's engine is connected: for a
	// dialled stream, whether its SUB socket's connection is up; for a
	// bound stream, whether the engine was heard from (LastHeardTime)
	// within BindConfig.LivenessTimeout since its first message.
	Connected bool
	// DisconnectedSince is when the stream last lost its engine (its
	// connection went down, or a bound stream's engine went unheard for
	// the liveness timeout), or was created if it never had one; zero
	// while Connected. A client redialling after a deliberate
	// disconnection counts from that disconnection.
	DisconnectedSince time.Time
	// LastSeq is the seq of the last batch delivered; it is meaningful when
	// BatchesReceived is above zero.
	LastSeq uint64
	// BatchesReceived counts batches delivered in seq order, including
	// DecodeErrors; ReplayedBatches counts those that came from a replay.
	BatchesReceived uint64
	ReplayedBatches uint64
	// EventsReceived counts the events of the decoded batches.
	EventsReceived uint64
	// DecodeErrors counts batches dropped because they did not decode;
	// HandlerErrors counts errors the handler returned; MalformedMessages
	// counts live messages without vLLM's three frames.
	DecodeErrors      uint64
	HandlerErrors     uint64
	MalformedMessages uint64
	// Connections, Disconnections and ReconnectAttempts count connection
	// changes of the SUB socket.
	Connections       uint64
	Disconnections    uint64
	ReconnectAttempts uint64
	// ReplayRequests, ReplaySuccesses and ReplayFailures count replays.
	ReplayRequests  uint64
	ReplaySuccesses uint64
	ReplayFailures  uint64
	// UnrecoverableGaps counts gaps reported to the handler and
	// MissedBatches the batches they lost; PublisherRestarts and Rewinds
	// count the other resets.
	UnrecoverableGaps uint64
	MissedBatches     uint64
	PublisherRestarts uint64
	Rewinds           uint64
	// JoinedAtSeq is the seq the stream began with, on first contact or
	// after its engine restarted, when the engine no longer had (or never
	// sent) the batches before it: a gateway that starts after its engines
	// joins each stream at the oldest batch the engine still buffers. It
	// is 0 for a stream followed from its first batch. Joining is not a
	// loss: nothing derived from the stream predates it.
	JoinedAtSeq uint64
	// LastEventTime is when the last batch was delivered; zero before the
	// first.
	LastEventTime time.Time
	// LastHeardTime is when the engine was last heard from: a live message
	// or a replay reply, including the quiet-stream probes' replies that
	// show an idle engine alive. Zero before the first.
	LastHeardTime time.Time
	// PublisherTopic is the topic frame of the publisher's replay replies
	// (vLLM v0.26 and later send one), its first 256 bytes and "..." when
	// it is longer; PublisherTopicKnown is false until a reply carried one.
	PublisherTopic      string
	PublisherTopicKnown bool
	// DroppedMessages counts live messages dropped unapplied, because the
	// stream's receive buffer (ReceiveBufferBytes) was full or the stream
	// was suspended; the stream replays them like batches its engine's PUB
	// dropped. ReplaysCut counts replays ended before their end marker,
	// because they went silent or exceeded MaxReplayDuration,
	// MaxReplayBatches or the receive buffer; what they delivered stands
	// and the rest is replayed again. PendingOverflows counts overflows of
	// the live batches buffered while a gap is replayed
	// (MaxPendingBatches, MaxPendingBytes), each an unrecoverable gap.
	DroppedMessages  uint64
	ReplaysCut       uint64
	PendingOverflows uint64
	// Suspensions counts the times the stream was suspended for resetting
	// more than MaxResets times within ResetWindow; Suspended is set while
	// it is.
	Suspensions uint64
	Suspended   bool
	// SuppressedLogs counts error log lines left out because the stream
	// logged more than 10 of their kind within a minute; each interval
	// that left lines out ends with one line saying how many.
	SuppressedLogs uint64
	// TopicMismatch is set while batches arrive only through replay: three
	// replays in a row delivered batches that no live message brought, and
	// the publisher's topic is unknown or does not start with the
	// subscribed one, so the subscription most likely filters every live
	// message out. Such batches reach the handler when the quiet stream is
	// probed, up to MaxReconnectDelay late. A live message clears it.
	TopicMismatch bool
}

// clientCounters are a stream's statistics, written by its owner and read
// by Stats from any goroutine.
type clientCounters struct {
	batches, replayed, events                                    atomic.Uint64
	decodeErrors, handlerErrors, malformed                       atomic.Uint64
	connections, disconnections, reconnectAttempts               atomic.Uint64
	replayRequests, replaySuccesses, replayFailures              atomic.Uint64
	unrecoverableGaps, missedBatches, publisherRestarts, rewinds atomic.Uint64
	lastSeq, joinedAt, suppressedLogs                            atomic.Uint64
	dropped, replaysCut, pendingOverflows, suspensions           atomic.Uint64
	suspended                                                    atomic.Bool
	lastEventNanos, lastHeardNanos                               atomic.Int64
	publisherTopic                                               atomic.Pointer[seenTopic]
	topicMismatch                                                atomic.Bool
}

// Stats returns a snapshot of the client's counters.
func (c *ZMQClient) Stats() ClientStats { return c.obs.stats() }

// stats returns a snapshot of the stream's counters.
func (o *observer) stats() ClientStats {
	k := &o.counters
	s := ClientStats{
		PodKey:            o.podKey,
		ModelName:         o.model,
		DPRank:            o.rank,
		LastSeq:           k.lastSeq.Load(),
		JoinedAtSeq:       k.joinedAt.Load(),
		BatchesReceived:   k.batches.Load(),
		ReplayedBatches:   k.replayed.Load(),
		EventsReceived:    k.events.Load(),
		DecodeErrors:      k.decodeErrors.Load(),
		HandlerErrors:     k.handlerErrors.Load(),
		MalformedMessages: k.malformed.Load(),
		Connections:       k.connections.Load(),
		Disconnections:    k.disconnections.Load(),
		ReconnectAttempts: k.reconnectAttempts.Load(),
		ReplayRequests:    k.replayRequests.Load(),
		ReplaySuccesses:   k.replaySuccesses.Load(),
		ReplayFailures:    k.replayFailures.Load(),
		UnrecoverableGaps: k.unrecoverableGaps.Load(),
		MissedBatches:     k.missedBatches.Load(),
		PublisherRestarts: k.publisherRestarts.Load(),
		Rewinds:           k.rewinds.Load(),
		TopicMismatch:     k.topicMismatch.Load(),
		SuppressedLogs:    k.suppressedLogs.Load(),
		DroppedMessages:   k.dropped.Load(),
		ReplaysCut:        k.replaysCut.Load(),
		PendingOverflows:  k.pendingOverflows.Load(),
		Suspensions:       k.suspensions.Load(),
		Suspended:         k.suspended.Load(),
	}
	s.Connected, s.DisconnectedSince = o.conn.state()
	if n := k.lastEventNanos.Load(); n != 0 {
		s.LastEventTime = time.Unix(0, n)
	}
	if n := k.lastHeardNanos.Load(); n != 0 {
		s.LastHeardTime = time.Unix(0, n)
	}
	if t := k.publisherTopic.Load(); t != nil {
		s.PublisherTopic, s.PublisherTopicKnown = t.shown, true
	}
	return s
}
