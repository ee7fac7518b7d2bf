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
//     fleet's requests.
//
// Redis keys:
//   - aibrix:<model>_request_trace_<window end, Unix seconds>: a JSON object
//     of request counts (see cache.RequestTrace), merged across gateway
//     replicas, expiring after cache.RequestTraceTTL;
//   - aibrix:profile_<model>_<deployment>: a cache.ModelGPUProfile as
//     JSON, read only;
//   - kvgate:running_requests:<gateway id> and kvgate:gateways: the shared
//     state of each replica (see SharedCountsKeyPrefix and
//     DefaultSharedMaxBlocks).
//
// Nothing on the request path waits for Redis: the components write and
// read in the background and publish what they read. Their failures are
// counted in kvgate_cache_redis_errors_total{operation} (see Metrics).
package redisstate
