package transport

import (
	"fmt"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// deliver decodes batch seq and hands it to the handler. A batch that does
// not decode is counted, logged and dropped; its seq still counts as
// delivered, so the stream goes on with the next one.
func (c *ZMQClient) deliver(seq uint64, payload []byte, replayed bool) {
	now := time.Now()
	k := &c.counters
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
		c.metrics.IncrementErrorCount(ErrorTypeDecode)
		c.metrics.recordBatch(seq, replayed, &received, &processed)
		c.logger.Error(fmt.Errorf("decode batch seq %d from %s: %w", seq, c.pubEndpoint, err),
			"Dropping undecodable KV event batch", "seq", seq, "bytes", len(payload))
		return
	}
	c.metrics.recordSkips(stats)
	for _, ev := range batch.Events {
		if i := eventTypeIndex(ev.GetType()); i >= 0 {
			received[i]++
		}
	}
	k.events.Add(uint64(len(batch.Events)))
	h := c.handler.Load()
	if h.batch != nil {
		if err := h.batch.HandleBatch(seq, batch); err != nil {
			c.handlerFailed(seq, err)
		} else {
			processed = received
		}
	} else {
		for _, ev := range batch.Events {
			if err := h.event.HandleEvent(ev); err != nil {
				c.handlerFailed(seq, err)
			} else if i := eventTypeIndex(ev.GetType()); i >= 0 {
				processed[i]++
			}
		}
	}
	c.metrics.RecordEventProcessingLatency(time.Since(now))
	c.metrics.recordBatch(seq, replayed, &received, &processed)
	if c.logs(levelTrace) {
		c.logger.Info("Delivered KV event batch", "seq", seq, "events", len(batch.Events), "replayed", replayed)
	}
}

func (c *ZMQClient) handlerFailed(seq uint64, err error) {
	c.counters.handlerErrors.Add(1)
	c.metrics.IncrementErrorCount(ErrorTypeHandler)
	c.logger.Error(err, "KV event handler failed", "seq", seq)
}
