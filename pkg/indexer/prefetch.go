//go:build amd64 || arm64

package indexer

// prefetchSlots asks the CPU to bring the cache line of each given key slot
// and the next line into its caches (a lookup probes a little over two
// 24-byte slots on average, which stay within those lines), without waiting
// for them: the hashing or lookups that follow run while the lines arrive. A
// plain load would stall the core at its first miss once the reorder buffer
// fills, which a walk that hashes between lookups does after a few blocks.
// It is a hint: it changes no memory and cannot fault.
//
//go:noescape
func prefetchSlots(slots []*keySlot)
