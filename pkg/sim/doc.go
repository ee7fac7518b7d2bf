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
// # Engine
//
// Engine adds vLLM's v1 scheduler and a latency model (see LatencyModel:
// per-token costs, attention that grows with each token's context, and a
// speed factor for the GPU) to the KV cache: continuous batching of running requests, chunked prefill
// within a token budget, first-come first-served admission bounded by
// MaxNumSeqs and free blocks, prefix-cache hits taken at admission, and
// preemption by recomputation of the newest running request when a running
// request cannot get a block. Each step publishes one event batch with the
// events of that step, or nothing when it produced none.
//
// Simplified, relative to vLLM:
//   - one full-attention KV-cache group: no sliding window, hybrid models,
//     speculative decoding, KV connectors or multimodal inputs;
//   - first-come first-served only (no priority policy), no max_loras limit,
//     no async scheduling: a step's tokens are known when it ends;
//   - the simulated model generates a pseudo-random function of the prompt,
//     the request's seed and the engine's output seed, ignoring EOS when the
//     request sets MaxTokens and ending with EOS after DefaultOutputTokens
//     otherwise;
//   - prefix-cache queries and hits are counted once per request, when it is
//     admitted; vLLM counts a lookup every time it tries to admit a waiting
//     request, so a request held back for KV space counts once per step;
//   - a reset of the prefix cache is published at once, not with the next
//     step's batch.
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
