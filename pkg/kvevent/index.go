package kvevent

// StreamID names one KV-event stream: one pod's engine for one
// data-parallel rank.
type StreamID struct {
	// PodKey is the pod's "namespace/name".
	PodKey string `json:"pod"`
	// DPRank is the engine's data-parallel rank.
	DPRank int `json:"dpRank"`
	// Model is the base model the pod serves (endpoint.ModelNameLabel).
	Model string `json:"model"`
	// LoraID is the pod's endpoint.LoraIDLabel, "" when it has none.
	LoraID string `json:"loraID,omitempty"`
}

// KVIndex is what a KVEventManager (package manager) keeps up to date: an
// index of the blocks each stream's engine holds. pkg/indexer's
// SyncPrefixHashTable, through a small adapter, is the index the gateway
// uses.
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
