package transport

import (
	"time"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// deliver decodes batch seq and hands it to the handler; replayed tells
// whether it came from a replay rather than the live stream. A batch that
// does not decode is counted, logged and dropped; its seq still counts as
// delivered, so the stream goes on with the next one.
func (s *stream) deliver(seq uint64, payload []byte, replayed bool) {
	if replayed {
		s.replayDelivered()
	}
	start := time.Now()
	batch, skips, err := kvevent.DecodeEventBatchStats(payload)
	if err != nil {
		s.obs.batchUndecodable(seq, replayed, start, len(payload), err)
		return
	}
	var received, processed eventCounts
	for _, ev := range batch.Events {
		if i := eventTypeIndex(ev.GetType()); i >= 0 {
			received[i]++
		}
	}
	h := s.handler.Load()
	if h.batch != nil {
		if err := h.batch.HandleBatch(seq, batch); err != nil {
			s.obs.handlerFailed(seq, err)
		} else {
			processed = received
		}
	} else {
		for _, ev := range batch.Events {
			if err := h.event.HandleEvent(ev); err != nil {
				s.obs.handlerFailed(seq, err)
			} else if i := eventTypeIndex(ev.GetType()); i >= 0 {
				processed[i]++
			}
		}
	}
	s.obs.batchDelivered(seq, replayed, start, len(batch.Events), &received, &processed, skips)
}
