// Package indexer keeps the sync prefix hash table: the in-process index of
// which pods hold the KV cache of which prompt prefixes, fed by the KV events
// of vLLM engines and queried by routers on every request.
//
// # What counts as a match
//
// A prompt is cut into whole blocks of the engine's block size (in tokens,
// learned from the engine's events; a trailing partial block never counts).
// Block i of a prompt matches a pod when the pod holds the KV cache of
// exactly the tokens of blocks 0 to i, computed for the same model and LoRA
// adapter and with no extra inputs (images, cache salts, prompt embeddings)
// that the prompt does not have. A pod is credited with the number of leading
// blocks it holds without a gap, on one data-parallel rank: a prefix split
// across ranks is usable by neither. The match names that rank and the
// longest run of the pod's other ranks (PodMatch.Rank, OtherRankBlocks),
// for a router that can send a request to the rank holding its prefix.
// Blocks in any medium count (GPU, CPU,
// storage tiers); the GPU-resident run is reported beside it. For hybrid
// models only KV-cache group 0 (the group of events without a group) counts.
// The index knows a block from the moment the engine's BlockStored event is
// applied until its BlockRemoved, an AllBlocksCleared, a purge of the pod, or
// eviction by the index's own bounds.
//
// The engines of one model need not share a block size: each lane keeps the
// block size of its events, and a match walks the prompt once per block size
// among its candidates, crediting each pod at its own engines' size and
// comparing runs in tokens (the sizes in use are counted in
// kvgate_indexer_block_size_streams). A parent is looked up only among the
// stream's lanes of the event's block size, and blocks of another size in a
// lane mean that its engine restarted unseen: its blocks of the old size are
// dropped (evicted_blocks_total{reason="block_size_changed"}).
//
// # Keys
//
// The index names blocks by its own chained 64-bit hash of their tokens,
// seeded at random per process and rooted in the model and adapter, so
// routers compute the same keys from a prompt without knowing the engine's
// hash function or seed. Per stream (pod and rank), a lane for each medium
// and group maps the engine's block hashes to these keys, so that events
// naming engine hashes (parents, removals) find their blocks; lanes place
// engine hashes by a keyed mix of the same secret, so that an engine
// choosing its hashes cannot pile them onto one probe sequence.
//
// A lane may name one block by several engine hashes. An engine that
// restarted with another hash seed (PYTHONHASHSEED unset) while its stream
// went on stores blocks the lane holds under new hashes, and an engine whose
// events leave out inputs its hashes include (older vLLM sends no extra
// keys, so blocks that differ only in images or cache salts look alike)
// names equal content by several hashes. Each new hash becomes a further
// name of the lane's block, so that the engine's later events find it by
// any of them; the block is resident once, is counted and evicted once, and
// stays until a BlockRemoved has named each of its hashes. A lane names a
// block by at most 8 hashes: further ones are skipped and counted in
// kvgate_indexer_skipped_blocks_total{reason="name_limit"}, and blocks
// stored under them are unknown parents.
//
// Blocks that name their LoRA adapter by the engine's adapter id alone
// (vLLM 0.9 sends no name) are not indexed and are counted in
// kvgate_indexer_skipped_blocks_total{reason="lora_id_only"}: requests name
// adapters, and neither the events nor the engine's API map ids to names, so
// such blocks could never match.
//
// # Unknown parents
//
// A BlockStored event whose parent hash the stream does not hold (the parent
// was stored before the index started, before the stream was reset or
// cleared, evicted by the index, removed while the engine kept another copy
// of it, or lost in a gap) is skipped whole and counted in
// kvgate_indexer_parent_misses_total: indexing its blocks from the root
// would credit pods with prefixes they do not hold. The chain heals when the
// engine stores the prefix again from its first block, which vLLM does
// whenever a request recomputes it.
//
// A parent hash of 0 that the stream does not hold means "no parent", as a
// nil one does: engines that always send a parent (llm-d-inference-sim)
// send 0 for a prompt's first block. A stream that holds a block named 0 is
// taken at its word.
//
// # Copies of a block
//
// vLLM does not deduplicate its cache. A request that fills a block whose
// content the cache already holds caches a second copy under the same hash,
// announced by a second BlockStored: a prefill continued in a later step or
// a decode never looks the cache up again, and requests of one step that
// fill equal blocks each keep their own. Evicting either copy sends a
// BlockRemoved of the hash. The index keeps one residency per block and
// lane, so the first removal drops the block while the engine may still
// serve it from the other copy, and the blocks the engine then chains from
// it are unknown parents until it stores the prefix again. Counting
// copies would need to tell a second copy from a re-announcement
// (kv_cache_report_mode "full" stores reused blocks again, with no removal
// to match), and the events do not: both come in the step that cached the
// first copy as well as in later ones. So a duplicated block can make the
// index under-credit its pod; it never credits a block no copy holds.
//
// # Bounds and eviction
//
// The number of keys per model (MaxPrefixesPerContext), of all models
// (MaxPrefixes) and of models (MaxContexts) are hard bounds. Each key carries
// a coarse clock, in whole seconds, refreshed when a block is stored
// (re-announced blocks included) or matched.
//
// So is the number of lanes per stream: 32, room for four media of eight
// KV-cache groups, more than vLLM's engines use. Each lane is a holder id of
// its model's key table, and every 64 ids add a word to every slot of the
// table and to what a match copies per block, for every pod's keys, so an
// engine naming a new medium or group in every event would otherwise make
// the whole model slower and larger. A stream's blocks in a further medium
// or group take one of its lanes that holds no block (after an
// AllBlocksCleared, all of them), or else are skipped and counted in
// kvgate_indexer_skipped_blocks_total{reason="lane_limit"}. A lane keeps at
// most 64 bytes of its medium's name: a longer one is cut and followed by a
// hash of the whole.
//
// When a model is full, the index evicts residencies, not whole keys, and
// makes the streams that hold the most pay: a stream (one engine: a pod's
// data-parallel rank) is charged one unit per block it holds, once per
// medium and KV-cache group, whether or not other pods hold the block too.
// One eviction round removes 1/32 of the model's residencies (and at least
// what the store needs): it lowers the streams with the highest charges to
// a common level, each giving up its least recently stored or matched
// blocks (equal clocks in the order of a rotating scan), and leaves every
// stream below the level alone. A key leaves the table when its last
// holder's residency goes. So one pod flooding the index evicts only its
// own blocks for as long as it holds more than the others: a stream holding
// no more than its share, about MaxPrefixesPerContext divided by the
// model's streams, loses nothing to eviction while another holds more, and
// a block many pods hold stays while any of them keeps it. A pod running
// several data-parallel ranks has a share per rank, as it has an engine
// and a cache per rank. When every stream holds about as much, the rounds
// take from each alike, oldest first: an LRU per stream.
//
// A round costs one scan of the key table and one of the paying streams'
// lanes, for 1/32 of the residencies: eviction costs what it evicts, about a
// microsecond of work per residency at bounds up to the default
// (BenchmarkEvictionFlood). It is exact in what it removes: an evicted
// residency leaves its key's holder set and its lane's map in the same
// step, so nothing dangles and later events naming an evicted block treat
// it as unknown. When all models together are full, the round comes from
// the least recently used model. A pod that sent no event and was credited
// by no match for EvictionDuration is purged by the sweep that Run performs
// every EvictionInterval. The sweep reclaims the memory of pods nobody uses;
// it does not detect dead engines, whose blocks a match would keep alive:
// the caller purges a pod whose engine died (PurgePod), as the KV event
// manager does within its dead-pod timeout.
//
// Memory follows the residencies: a key costs about 38 bytes in its model's
// table and each (block, holder) pair about 25 bytes in its lane, some 41
// bytes per residency when blocks have two holders. A key's holder set has
// one word per 64 lanes of its model (the highest holder id in use, purged
// pods' ids until the sweep narrows the table), whichever lanes hold the
// key, so each key costs about 10 bytes more (a word at the tables' load
// factor) per 64 lanes beyond the first 64: with one holder per block,
// about 58 bytes per block at 1 lane, 63 at 64, 71 at 65, 98 at 256 and
// 260 at 1024 (BenchmarkMemoryPerBlockByLanes). A model's memory is
// therefore bounded by MaxPrefixesPerContext keys of that size, and grows
// with the product of its keys and its lanes: a model followed by many
// streams (pods times data-parallel ranks times media and groups) should
// be given a MaxPrefixesPerContext that fits the memory it may take.
//
// # Concurrency
//
// Matches take no lock, never wait for a writer and write no shared memory
// per block (a key's clock at most once a second). Each model's key table is
// split into shards, each an open-addressing table whose slots are read and
// written with sync/atomic. Within one set of a shard's arrays a slot goes
// from empty to one key to a tombstone and entries never move, so a lookup
// always reads the holders of the key it found, and never misses a key that
// was present throughout; growing, shrinking and dropping tombstones build
// new arrays aside and publish them with one atomic store.
//
// Writers of one model (event batches, purges, evictions) serialise on the
// model's mutex; different models are independent, and the registry of
// pods, streams and models has a lock of its own that is never held while
// waiting for a model's writer. Nothing that only reads waits for a writer
// either: statistics (Stats, the metrics' gauges) read counts the writers
// publish after each event, and the idle sweep and the drop of a model past
// MaxContexts leave their work on a busy model to the writer that holds its
// mutex, which does it before letting go.
//
// A pod purge writes no slot: its lanes' holder ids stop being live, keys
// left with no live holder stop being counted, and their slots and the ids'
// bits are reclaimed when the shard is next rebuilt. To count those keys it
// looks up each of the pod's keys once, in slot order, or, when the pod
// holds more than a sixteenth as many keys as the table has slots, sweeps
// the slots for its bits, which streams through memory at about a
// nanosecond a slot where a lookup misses the cache; either way its time
// grows with the pod's entries. It delays only the writers of the pod's
// models. AllBlocksCleared finds a stream's residencies the same two ways.
//
// A released holder id goes to a new lane only 10 seconds later, so that a
// match still reading the released lane's pod cannot credit that pod with
// the new lane's blocks. Once that is over, the sweep that Run performs
// forgets the released ids above the model's last lane and, when that
// leaves a word of every holder set unused, rebuilds the key table without
// it: the lanes of purged pods stop widening every slot and every match.
// Ids are not renumbered, so a live lane keeps the width its id needs.
//
// A match keys the prompt a batch of blocks ahead of its lookups and asks the
// CPU to prefetch the slots of the batch it has keyed, so that the memory
// latency of one batch's lookups hides behind the hashing of the next.
package indexer
