// Package redisstate keeps the gateway's state that lives in Redis, each
// role a component of its own with a Run(ctx) error that returns when its
// context ends:
//
//   - Tracer writes per-model request traces for autoscalers (AIBrix's GPU
//     optimizer), fed by the request ledger;
//   - ProfileLoader loads the GPU profiles the optimizer writes into
//     cache.Profiles;
//   - SharedCounts shares what gateway replicas have in flight (running
//     requests, pending load, queued prefill work, prompt blocks) and their
//     output predictors' history, so that each replica routes on the whole
//     fleet's requests;
//   - StoredResponses shares which engine made each OpenAI Responses API
//     response a replica relayed, so that every replica sends the requests
//     that need the response (vLLM keeps it in that engine's memory alone)
//     there.
//
// Redis keys:
//   - aibrix:<model>_request_trace_<window end, Unix seconds>: a JSON object
//     of request counts (see cache.RequestTrace), merged across gateway
//     replicas, expiring after cache.RequestTraceTTL;
//   - aibrix:profile_<model>_<deployment>: a cache.ModelGPUProfile as
//     JSON, read only;
//   - kvgate:running_requests:<gateway id> and kvgate:gateways: the shared
//     state of each replica (see SharedCountsKeyPrefix and
//     DefaultSharedMaxBlocks);
//   - kvgate:stored_response:<response id>: the engine that made the
//     response (see EncodeStoredResponse: pod namespace, name, UID and
//     address, and model), expiring after StoredResponsesConfig.TTL (1 h
//     by default); written only when absent, so that the first record of
//     an id stands.
//
// What other replicas and the GPU optimizer write may come from buggy or
// older versions, or from hosts whose clocks are off: every read is bounded,
// and what it leaves out is counted.
//   - Replicas: SharedCounts reads the state of at most 63 other replicas
//     (DefaultSharedMaxReplicas, 64 with itself), the latest to publish,
//     and only of those whose last publication lies within the TTL of the
//     Redis server's clock, which times every publication: the replicas'
//     own clocks may disagree by any amount. The others are left out,
//     counted in kvgate_cache_shared_gateways_skipped_total{reason="limit"}
//     and, for entries another writer listed ahead of the server's clock,
//     {reason="clock_ahead"} at each read. Entries more than max(10 TTL,
//     1 min) behind or ahead are pruned from kvgate:gateways, and a
//     kvgate:gateways of another type than a sorted set is replaced (an
//     error logged).
//   - Values: a count above 2^24 or a load or prefill value above 1e6 in
//     another replica's hash is dropped, counted in
//     kvgate_cache_shared_state_rejects_total{kind="value"}, so that no sum
//     can overflow; an output history of another shape than this replica's
//     predictors' is dropped alone ({kind="output_histogram"}).
//   - Replicas' hashes: one script per hash checks it and reads it at once,
//     so it cannot grow in between; a hash of more than 16384 fields
//     (DefaultSharedMaxHashFields), larger by MEMORY USAGE than 8 bytes per
//     MaxBlocks plus 2 MiB (DefaultSharedHashBytes; 2.25 MiB by default), or
//     a key that holds no hash, is left out whole, counted in
//     kvgate_cache_shared_gateways_skipped_total{reason="fields"},
//     {reason="bytes"} or {reason="not_hash"}. A read thus holds at most 63
//     hashes of 2.25 MiB.
//   - Pods and models: of the hashes read, only the fields about pods
//     registered here, and models they serve, are kept; the others are
//     counted in kvgate_cache_shared_fields_ignored_total{reason} at each
//     read, and count from the read after their pod or model is
//     registered. What a pod's load record keeps of the other replicas is
//     thus bounded by the registry.
//   - GPU profiles: ProfileLoader loads at most 256 profiles
//     (DefaultMaxProfiles), the first the scan finds, reads at most 256 KiB
//     of each (DefaultMaxProfileBytes), 16 at a time, and decodes them
//     within cache.MaxProfileIndexDimensions and cache.MaxProfileIndexValues;
//     what it skips is counted in
//     kvgate_cache_gpu_profile_rejects_total{reason}. A profile skipped for
//     its size or content keeps the version loaded before; one beyond the
//     256 is forgotten.
//   - Stored responses: a look-up reads at most 1 KiB and one byte of a
//     record (GETRANGE; MaxStoredResponseBytes); a longer value, a
//     malformed one or a key of another type is ignored, counted in
//     kvgate_cache_stored_response_lookups_total{result="invalid"}. Records
//     wait to be written in a queue of 4096 (DefaultStoredResponseQueue);
//     one that finds it full is dropped, counted in
//     kvgate_cache_stored_response_writes_total{result="dropped"}. Look-ups
//     of one id at once share one read, the later ones counted in
//     kvgate_cache_stored_response_lookups_total{result="coalesced"}; at
//     most 64 reads are in flight (DefaultStoredResponseLookups), and a
//     look-up that finds them all taken neither reads nor waits, counted in
//     {result="busy"}.
//
// Nothing on the request path waits for Redis, but for the look-up of a
// stored response this replica has no record of, which a request naming
// that response waits for, up to StoredResponsesConfig.LookupTimeout
// (50 ms by default): the other components write and read in the
// background and publish what they read, and StoredResponses writes in the
// background. Their failures are counted in
// kvgate_cache_redis_errors_total{operation} (see Metrics).
package redisstate
