// Package budget bounds a quantity held at once by many goroutines: bytes
// of request bodies, streams being served. Taking never blocks: what would
// pass the limit is refused, for the caller to answer and count.
package budget

import "sync/atomic"

// Budget holds at most its limit of units at once. Its zero value refuses
// everything but an empty Take.
type Budget struct {
	limit int64
	held  atomic.Int64
}

// New returns a Budget of limit units.
func New(limit int64) *Budget { return &Budget{limit: limit} }

// Take holds n more units, unless that would pass the limit.
func (b *Budget) Take(n int64) bool {
	for {
		held := b.held.Load()
		if held+n > b.limit {
			return false
		}
		if b.held.CompareAndSwap(held, held+n) {
			return true
		}
	}
}

// Give returns n units taken.
func (b *Budget) Give(n int64) { b.held.Add(-n) }

// Held returns the units held.
func (b *Budget) Held() int64 { return b.held.Load() }
