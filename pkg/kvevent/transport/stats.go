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
	// Connected reports whether the SUB socket is connected to the engine.
	Connected bool
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
	// LastEventTime is when the last batch was delivered; zero before the
	// first.
	LastEventTime time.Time
	// PublisherTopic is the topic frame of the publisher's replay replies
	// (vLLM v0.26 and later send one); PublisherTopicKnown is false until a
	// reply carried one.
	PublisherTopic      string
	PublisherTopicKnown bool
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
	lastSeq                                                      atomic.Uint64
	lastEventNanos                                               atomic.Int64
	publisherTopic                                               atomic.Pointer[string]
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
		Connected:         o.conn.isConnected(),
		LastSeq:           k.lastSeq.Load(),
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
	}
	if n := k.lastEventNanos.Load(); n != 0 {
		s.LastEventTime = time.Unix(0, n)
	}
	if t := k.publisherTopic.Load(); t != nil {
		s.PublisherTopic, s.PublisherTopicKnown = *t, true
	}
	return s
}
