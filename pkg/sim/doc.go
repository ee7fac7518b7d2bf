// Package sim simulates a vLLM engine closely enough to exercise KV-cache
// aware routing without GPUs: its paged KV cache, the KV-cache events it
// publishes, its scheduler and a latency model.
//
// The package is the engine core. It runs no goroutines, reads no clock and
// does no I/O, so that the same code serves a real-time HTTP server (package
// simserver) and a discrete-event simulation in virtual time. Given the same
// configuration and the same calls, it produces the same events and timings.
//
// # KV cache
//
// KVCache follows vLLM's v1 BlockPool and KVCacheManager for one
// full-attention group:
//   - a fixed number of blocks of BlockSize tokens, block 0 reserved (vLLM's
//     null block);
//   - only full blocks are cached, each under a digest chained over its
//     parent's full digest (see the block hash scheme below);
//   - blocks are reference counted; a freed block goes to the tail of a free
//     queue and stays cached until it is popped from the head for reuse, so
//     eviction is least-recently-freed first; a finished request frees its
//     blocks last block first, so its tail is evicted before its head;
//   - a lookup never counts the block holding a prompt's last token, which
//     vLLM always recomputes;
//   - identical blocks computed concurrently are cached twice, and evicting
//     one copy announces its removal although the other copy stays.
//
// Events are vLLM's: one BlockStored per request per step with the blocks
// that step filled (chained by parent hash, decode-filled blocks included),
// one BlockRemoved per evicted block when it is popped for reuse, and
// AllBlocksCleared when the prefix cache is reset, which is refused while
// any request holds blocks.
//
// # Block hashes
//
// digest(i) = sha256(digest(i-1) || tokens of block i as 4-byte big-endian
// integers || LoRA name), with digest(-1) = sha256(hash seed); the wire hash
// is the digest's last 8 bytes read big-endian. This is the shape of vLLM's
// default (sha256 chained over full digests, low 64 bits on the wire, a
// per-engine NONE_HASH), not its bytes, which come from Python's pickle.
//
// # Tokenizer
//
// Tokenizer is a deterministic, dependency-free word-piece tokenizer with a
// ChatML chat template (see its documentation). Engines tokenize every
// request with it, so the ids in events equal the ids /tokenize returns.
package sim
