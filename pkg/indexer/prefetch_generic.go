//go:build !amd64 && !arm64

package indexer

import "sync/atomic"

// prefetchSlots loads the first word of each key slot, so that the cache
// misses of a run of lookups overlap instead of following each other. Unlike
// the prefetch instructions used on amd64 and arm64, the loads stall the
// core at the first miss once its reorder buffer fills.
func prefetchSlots(slots []*keySlot) {
	for _, s := range slots {
		_ = atomic.LoadUint64(&s.key)
	}
}
