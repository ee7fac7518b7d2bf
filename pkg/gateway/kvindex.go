package gateway

import (
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

// kvIndex is the kvevent.KVIndex that keeps the prefix index up to date: the
// KV event manager delivers every followed stream's batches to the table,
// and routing queries the same table.
//
// A stream is identified in the table by its pod and data-parallel rank,
// and its blocks are indexed under the stream's base model. The stream's
// LoRA id plays no part: the engine names the adapter of each stored block
// in its events, and the table keys the block by that name.
type kvIndex struct {
	table *indexer.SyncPrefixHashTable
}

var _ kvevent.KVIndex = kvIndex{}

// ApplyBatch applies the stream's batch to the table.
func (x kvIndex) ApplyBatch(stream kvevent.StreamID, batch *kvevent.EventBatch) error {
	return x.table.ApplyBatch(tableStream(stream), batch)
}

// ResetStream drops what the table holds for the stream.
func (x kvIndex) ResetStream(stream kvevent.StreamID) {
	x.table.ResetStream(tableStream(stream))
}

// PurgePod drops every block the table holds for the pod, all ranks.
func (x kvIndex) PurgePod(podKey string) {
	x.table.PurgePod(podKey)
}

// tableStream names a KV-event stream the way the table does.
func tableStream(s kvevent.StreamID) indexer.Stream {
	return indexer.Stream{Pod: s.PodKey, Rank: s.DPRank, Model: s.Model}
}
