//go:build amd64 || arm64

package indexer

// prefetchSlots asks the CPU to bring the cache lines of the given key
// slots (a slot may span two lines) into its caches, without waiting for
// them: the hashing or lookups that follow run while the lines arrive. A
// plain load would stall the core at its first miss once the reorder buffer
// fills, which a walk that hashes between lookups does after a few blocks.
// It is a hint: it changes no memory and cannot fault.
//
//go:noescape
func prefetchSlots(slots []*keySlot)
