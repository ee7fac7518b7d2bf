package manager

import (
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// indexHandler delivers one stream's batches and resets to a KVIndex.
type indexHandler struct {
	index  kvevent.KVIndex
	stream kvevent.StreamID
	logger klog.Logger
}

var (
	_ kvevent.BatchHandler = (*indexHandler)(nil)
	_ kvevent.ResetHandler = (*indexHandler)(nil)
)

// HandleEvent applies one event as a batch of its own. A client calls
// HandleBatch instead; HandleEvent serves callers that deliver events one
// by one.
func (h *indexHandler) HandleEvent(event kvevent.KVEvent) error {
	return h.index.ApplyBatch(h.stream, &kvevent.EventBatch{Events: []kvevent.KVEvent{event}, DataParallelRank: h.stream.DPRank})
}

// HandleBatch applies a batch to the index.
func (h *indexHandler) HandleBatch(_ uint64, batch *kvevent.EventBatch) error {
	return h.index.ApplyBatch(h.stream, batch)
}

// HandleReset drops the stream from the index: what follows rebuilds it
// (from seq 0 after a publisher restart, from the next available batch
// after an unrecoverable gap).
func (h *indexHandler) HandleReset(r kvevent.StreamReset) {
	h.index.ResetStream(h.stream)
	h.logger.V(1).Info("Dropped the stream from the index; it is rebuilt from the batches that follow",
		"reason", r.Reason, "nextSeq", r.NextSeq)
}
