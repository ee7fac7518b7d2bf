package kvevent

import "fmt"

// EventHandler receives the events of one engine's stream, one at a time, in
// the order the engine applied them. A client calls it from a single
// goroutine, never concurrently, and waits for it to return: a slow handler
// slows the stream down (ZeroMQ then drops messages at its high-water mark,
// which the client recovers through replay).
//
// An error from HandleEvent is counted and logged; the stream goes on with
// the next event.
type EventHandler interface {
	HandleEvent(event KVEvent) error
}

// BatchHandler is implemented by handlers that apply a whole batch in one
// step. When a client's handler implements it, the client calls HandleBatch
// once per batch instead of HandleEvent once per event.
//
// Batches arrive exactly once each and in seq order, except across a
// StreamReset. The handler owns batch and may keep it. An error is counted
// and logged; the stream goes on with the next batch.
type BatchHandler interface {
	HandleBatch(seq uint64, batch *EventBatch) error
}

// ResetHandler is implemented by handlers that need to know when their view
// of a stream stops being exact. A client calls HandleReset, from the same
// goroutine as the other methods, before it delivers the first batch that
// follows the reset.
type ResetHandler interface {
	HandleReset(reset StreamReset)
}

// ResetReason tells why a stream was reset.
type ResetReason string

const (
	// ResetPublisherRestart means the engine's publisher started over (its
	// seq went back): everything known about the stream is void, and the
	// batches that follow rebuild it from seq 0.
	ResetPublisherRestart ResetReason = "publisher_restart"
	// ResetUnrecoverableGap means the batches FirstMissing..LastMissing are
	// lost for good (the publisher no longer buffers them, its replay is
	// unavailable, or the client's pending buffer overflowed): state derived
	// from the stream is incomplete.
	ResetUnrecoverableGap ResetReason = "unrecoverable_gap"
	// ResetRewind means the transport was asked (ZMQClient.ReplayFrom in
	// package transport) to deliver the stream again from NextSeq: drop
	// what is known of it; the batches that follow rebuild it.
	ResetRewind ResetReason = "rewind"
)

// StreamReset tells a handler that its view of a stream is no longer exact.
type StreamReset struct {
	// Reason tells what happened.
	Reason ResetReason
	// PodKey and DPRank identify the stream.
	PodKey string
	DPRank int
	// NextSeq is the seq of the next batch the handler will receive.
	NextSeq uint64
	// FirstMissing and LastMissing bound the lost batches of an
	// unrecoverable gap; both are zero for other reasons.
	FirstMissing, LastMissing uint64
}

// Missing returns how many batches an unrecoverable gap lost, 0 for other
// reasons.
func (r StreamReset) Missing() uint64 {
	if r.Reason != ResetUnrecoverableGap {
		return 0
	}
	return r.LastMissing - r.FirstMissing + 1
}

// String describes the reset for logs and errors.
func (r StreamReset) String() string {
	if r.Reason == ResetUnrecoverableGap {
		return fmt.Sprintf("%s of %s rank %d: batches %d..%d lost", r.Reason, r.PodKey, r.DPRank, r.FirstMissing, r.LastMissing)
	}
	return fmt.Sprintf("%s of %s rank %d: next seq %d", r.Reason, r.PodKey, r.DPRank, r.NextSeq)
}
