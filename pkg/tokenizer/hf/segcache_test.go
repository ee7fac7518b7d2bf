package hf

import (
	"runtime"
	"testing"

	"github.com/zeebo/xxh3"
)

// TestSegmentCacheStaysWithinItsBudget fills a segment cache with many
// more tiny entries than it holds, the case where what an entry takes
// besides its ids matters most, then with larger ones, which the maps
// sized for the tiny ones must not outweigh, and checks on the heap, at
// points all through its generations, that it takes no more than its
// budget.
func TestSegmentCacheStaysWithinItsBudget(t *testing.T) {
	const budget = 1 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := newSegmentCache(budget)
	key := uint64(0)
	for _, n := range []int{1, 4, 64, 1} {
		ids := make([]uint32, n)
		holds := budget / segmentBytes(ids)
		for i := range 3 * holds {
			key++
			c.put(xxh3.Uint128{Hi: key, Lo: key * 0x9e3779b97f4a7c15}, ids)
			if i%(holds/8) != 0 {
				continue
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			if heap := int(after.HeapAlloc) - int(before.HeapAlloc); heap > budget {
				t.Fatalf("a segment cache of %d bytes holding %d entries, the last of %d ids, takes %d bytes of heap",
					budget, len(c.cur)+len(c.prev), n, heap)
			}
		}
	}
	runtime.KeepAlive(c)
}
