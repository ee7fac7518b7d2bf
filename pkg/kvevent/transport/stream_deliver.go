package transport

import (
	"fmt"
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
	now := time.Now()
	k := &s.obs.counters
	k.batches.Add(1)
	k.lastSeq.Store(seq)
	k.lastEventNanos.Store(now.UnixNano())
	if replayed {
		k.replayed.Add(1)
	}
	var received, processed [len(eventTypes)]int
	batch, stats, err := kvevent.DecodeEventBatchStats(payload)
	if err != nil {
		k.decodeErrors.Add(1)
		s.obs.metrics.IncrementErrorCount(ErrorTypeDecode)
		s.obs.metrics.recordBatch(seq, replayed, &received, &processed)
		s.obs.logger.Error(fmt.Errorf("decode batch seq %d from %s: %w", seq, s.obs.pubEndpoint, err),
			"Dropping undecodable KV event batch", "seq", seq, "bytes", len(payload))
		return
	}
	s.obs.metrics.recordSkips(stats)
	for _, ev := range batch.Events {
		if i := eventTypeIndex(ev.GetType()); i >= 0 {
			received[i]++
		}
	}
	k.events.Add(uint64(len(batch.Events)))
	h := s.handler.Load()
	if h.batch != nil {
		if err := h.batch.HandleBatch(seq, batch); err != nil {
			s.handlerFailed(seq, err)
		} else {
			processed = received
		}
	} else {
		for _, ev := range batch.Events {
			if err := h.event.HandleEvent(ev); err != nil {
				s.handlerFailed(seq, err)
			} else if i := eventTypeIndex(ev.GetType()); i >= 0 {
				processed[i]++
			}
		}
	}
	s.obs.metrics.RecordEventProcessingLatency(time.Since(now))
	s.obs.metrics.recordBatch(seq, replayed, &received, &processed)
	if s.obs.logs(levelTrace) {
		s.obs.logger.Info("Delivered KV event batch", "seq", seq, "events", len(batch.Events), "replayed", replayed)
	}
}

func (s *stream) handlerFailed(seq uint64, err error) {
	s.obs.counters.handlerErrors.Add(1)
	s.obs.metrics.IncrementErrorCount(ErrorTypeHandler)
	s.obs.logger.Error(err, "KV event handler failed", "seq", seq)
}
