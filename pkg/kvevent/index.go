package kvevent

import (
	"k8s.io/klog/v2"
)

// StreamID names one KV-event stream: one pod's engine for one
// data-parallel rank.
type StreamID struct {
	// PodKey is the pod's "namespace/name".
	PodKey string `json:"pod"`
	// DPRank is the engine's data-parallel rank.
	DPRank int `json:"dpRank"`
	// Model is the base model the pod serves (ModelNameLabel).
	Model string `json:"model"`
	// LoraID is the pod's LoraIDLabel, "" when it has none.
	LoraID string `json:"loraID,omitempty"`
}

// KVIndex is what a KVEventManager keeps up to date: an index of the blocks
// each stream's engine holds. pkg/indexer's SyncPrefixHashTable, through a
// small adapter, is the index the gateway uses.
//
// The manager calls ApplyBatch and ResetStream for one stream from one
// goroutine at a time, batches in seq order; different streams are
// delivered concurrently. It calls PurgePod and ResetStream for a stream only
// after the stream's client has stopped, so no batch of a purged stream
// arrives afterwards unless the stream is started again.
type KVIndex interface {
	// ApplyBatch applies one batch of stream's events in order. An error
	// is logged and counted; the stream goes on.
	ApplyBatch(stream StreamID, batch *EventBatch) error
	// ResetStream forgets what the index holds for stream: its engine
	// restarted, lost batches for good, or is being followed again from
	// scratch. The batches that follow rebuild it.
	ResetStream(stream StreamID)
	// PurgePod forgets everything the index holds for the pod, all ranks.
	PurgePod(podKey string)
}

// indexHandler delivers one stream's batches and resets to a KVIndex.
type indexHandler struct {
	index  KVIndex
	stream StreamID
	logger klog.Logger
}

var (
	_ BatchHandler = (*indexHandler)(nil)
	_ ResetHandler = (*indexHandler)(nil)
)

// HandleEvent applies one event as a batch of its own. A client calls
// HandleBatch instead; HandleEvent serves callers that deliver events one
// by one.
func (h *indexHandler) HandleEvent(event KVEvent) error {
	return h.index.ApplyBatch(h.stream, &EventBatch{Events: []KVEvent{event}, DataParallelRank: h.stream.DPRank})
}

// HandleBatch applies a batch to the index.
func (h *indexHandler) HandleBatch(_ uint64, batch *EventBatch) error {
	return h.index.ApplyBatch(h.stream, batch)
}

// HandleReset drops the stream from the index: what follows rebuilds it
// (from seq 0 after a publisher restart, from the next available batch
// after an unrecoverable gap).
func (h *indexHandler) HandleReset(r StreamReset) {
	h.index.ResetStream(h.stream)
	h.logger.V(1).Info("Dropped the stream from the index; it is rebuilt from the batches that follow",
		"reason", r.Reason, "nextSeq", r.NextSeq)
}
