// Package cache is the gateway's central cache, the Store.
//
// The Store holds:
//   - the registry of inference pods and the models they serve, fed by a
//     PodSource or by the PodSink methods, and announced to PodListeners
//     such as the KV event manager. Each pod is parsed once, when it enters
//     the registry, into an endpoint.Endpoint, and every lookup takes its
//     endpoint.Key. A pod serves its base model (the
//     model.aibrix.ai/name label or annotation) and LoRA adapters: those it
//     declares in the kvgate.io/lora-adapters annotation, those set with
//     SetPodAdapters, and those its engine lists on GET /v1/models (vLLM
//     lists every loaded adapter, runtime-loaded ones included, with the
//     base model as "parent"), read from every routable pod every
//     AdapterRefreshInterval. A request for an adapter is routed among the
//     pods serving it;
//   - the metrics of every routable pod, scraped from its vLLM /metrics in a
//     loop per pod and derived into load, KV-cache usage, prefix-cache hit
//     rate, recent latencies and prefill speed (GetMetricValueByPod,
//     GetMetricValueByPodModel). A pod whose scrape fails keeps its last
//     values, marked Stale, and PodScrapeState tells fresh, stale and
//     not yet scraped pods apart;
//   - which pods requests could not connect to: EjectPod takes a pod out
//     of routing for a backoff that doubles while it stays unreachable,
//     PodEjection reports it, and PodReachable or a successful scrape
//     readmits it;
//   - the requests in flight per pod and model (AddRequestCount,
//     DoneRequestCount, DoneRequestTrace), optionally shared with the other
//     gateway replicas through Redis;
//   - per-model request traces written to Redis for autoscalers
//     (RequestTraceKey), and per-model output predictors
//     (SimpleOutputPredictor);
//   - GPU profiles read from Redis (ModelGPUProfileKey), and the load
//     providers built on them and on the metrics.
//
// Reads never wait for I/O: scraping and Redis work run in the background
// and publish their results. The Store exports its own Prometheus metrics
// (kvgate_cache_*) on the Registerer given in its Config.
//
// Redis keys:
//   - aibrix:<model>_request_trace_<window end, Unix seconds>: a JSON object
//     of request counts (see RequestTrace), merged across gateway replicas,
//     expiring after RequestTraceTTL;
//   - aibrix:profile_<model>_<deployment>: a ModelGPUProfile as JSON, read
//     only;
//   - kvgate:running_requests:<gateway id> and kvgate:gateways: the shared
//     running-request counts (see SharedCountsKeyPrefix).
package cache
