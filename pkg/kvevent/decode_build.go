package kvevent

import "unsafe"

// Building the decoded batch. The decoder has collected every event in its
// scratch buffers; build gives the batch its own memory with one allocation
// per kind of data rather than several per event: the batch (with room for
// the events of a small batch), one array per event type, one pointer-free
// array for all hashes and tokens, and, when events carry extra_keys, one
// array of per-block keys and one copy of their bytes.

// smallBatch is how many events fit in the batch allocation itself. Most
// scheduler steps produce only a few events.
const smallBatch = 4

// batchAlloc is a batch and the storage for its events when it has at most
// smallBatch of them.
type batchAlloc struct {
	batch  EventBatch
	events [smallBatch]KVEvent
}

func (d *decoder) build(ts float64, rank int) *EventBatch {
	a := &batchAlloc{batch: EventBatch{TS: ts, DataParallelRank: rank}}
	n := len(d.recs)
	if n == 0 {
		return &a.batch
	}
	if n <= smallBatch {
		a.batch.Events = a.events[:n:n]
	} else {
		a.batch.Events = make([]KVEvent, n)
	}
	var nStored, nRemoved, nCleared int
	for i := range d.recs {
		switch d.recs[i].typ {
		case EventTypeBlockStored:
			nStored++
		case EventTypeBlockRemoved:
			nRemoved++
		default:
			nCleared++
		}
	}
	stored := make([]BlockStoredEvent, nStored)
	removed := make([]BlockRemovedEvent, nRemoved)
	cleared := make([]AllBlocksClearedEvent, nCleared)
	hashes, tokens := numericSlab(len(d.hashes), len(d.tokens))
	copy(hashes, d.hashes)
	copy(tokens, d.tokens)
	extras := d.copyExtras()

	at := TimeFromTS(ts)
	for i := range d.recs {
		rec := &d.recs[i]
		switch rec.typ {
		case EventTypeBlockStored:
			e := take(&stored)
			*e = BlockStoredEvent{
				Timestamp:                at,
				BlockHashes:              sub(hashes, rec.hashes),
				ParentBlockHash:          rec.parent,
				HasParent:                rec.hasParent,
				TokenIDs:                 sub(tokens, rec.tokens),
				BlockSize:                rec.blockSize,
				LoraID:                   rec.loraID,
				LoraName:                 rec.loraName,
				Medium:                   rec.medium,
				GroupIdx:                 rec.groupIdx,
				KVCacheSpecKind:          rec.specKind,
				KVCacheSpecSlidingWindow: rec.window,
				Locality:                 rec.locality,
				Ownership:                rec.ownership,
				SessionID:                rec.sessionID,
			}
			if rec.hasExtras {
				e.ExtraKeys = sub(extras, rec.extras)
				if e.ExtraKeys == nil {
					e.ExtraKeys = [][]byte{}
				}
			}
			a.batch.Events[i] = e
		case EventTypeBlockRemoved:
			e := take(&removed)
			*e = BlockRemovedEvent{
				Timestamp:   at,
				BlockHashes: sub(hashes, rec.hashes),
				Medium:      rec.medium,
				GroupIdx:    rec.groupIdx,
				Locality:    rec.locality,
				Ownership:   rec.ownership,
			}
			a.batch.Events[i] = e
		default:
			e := take(&cleared)
			e.Timestamp = at
			a.batch.Events[i] = e
		}
	}
	return &a.batch
}

// numericSlab returns room for nHashes hashes and nTokens token ids carved
// from one pointer-free allocation: the tokens take the words after the
// hashes, two per word. uint32 needs no stricter alignment than uint64, and
// neither type holds pointers, so the garbage collector sees one ordinary
// []uint64 that both slices keep alive.
func numericSlab(nHashes, nTokens int) ([]BlockHash, []uint32) {
	words := nHashes + (nTokens+1)/2
	if words == 0 {
		return nil, nil
	}
	slab := make([]BlockHash, words)
	if nTokens == 0 {
		return slab, nil
	}
	return slab[:nHashes:nHashes], unsafe.Slice((*uint32)(unsafe.Pointer(&slab[nHashes])), nTokens)
}

// copyExtras copies the payload bytes of every extra_keys element into one
// allocation and returns the per-block keys, nil for nil elements.
func (d *decoder) copyExtras() [][]byte {
	if len(d.extras) == 0 {
		return nil
	}
	total := 0
	for _, s := range d.extras {
		if s.lo >= 0 {
			total += s.hi - s.lo
		}
	}
	keys := make([][]byte, len(d.extras))
	data := make([]byte, total)
	for i, s := range d.extras {
		if s.lo < 0 {
			continue
		}
		n := copy(data, d.r.buf[s.lo:s.hi])
		keys[i] = data[:n:n]
		data = data[n:]
	}
	return keys
}

// take returns the first element of *s and drops it from *s.
func take[T any](s *[]T) *T {
	e := &(*s)[0]
	*s = (*s)[1:]
	return e
}

// sub returns the part of a batch-wide array that s covers, capped so that
// appending to it cannot overwrite a neighbour, or nil when s is empty.
func sub[T any](all []T, s span) []T {
	if s.lo == s.hi {
		return nil
	}
	return all[s.lo:s.hi:s.hi]
}
