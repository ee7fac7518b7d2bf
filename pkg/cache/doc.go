// Package cache is the gateway's view of its inference pods: the Store, and
// the per-model components that read it.
//
// The Store holds:
//   - the registry of inference pods and the models they serve, fed by a
//     PodSource (see RunPodSource) or by the PodSink methods, and announced
//     to PodListeners such as the KV event manager. Each pod is parsed
//     once, when it enters the registry, into an endpoint.Endpoint, and
//     every lookup takes its endpoint.Key. A pod serves its base model (the
//     model.aibrix.ai/name label or annotation) and LoRA adapters: those it
//     declares in the kvgate.io/lora-adapters annotation, those set with
//     SetPodAdapters, and those its engine lists on GET /v1/models (vLLM
//     lists every loaded adapter, runtime-loaded ones included, with the
//     base model as "parent"), read from every routable pod every
//     AdapterRefreshInterval, at most MaxAdaptersPerPod a pod. A request
//     for an adapter is routed among the pods serving it. A change of a
//     pod's adapters that changes the models it serves is announced to the
//     PodListeners that are ModelsListeners. The same listing gives each
//     pod's model cards (ModelCard: root, parent, max_model_len, owned_by),
//     those of its base model and of the adapters taken, each string at
//     most MaxModelCardStringBytes (a longer one is dropped); ModelCard
//     serves a model's card from its ready pods;
//   - the metrics of every routable pod, scraped from its vLLM /metrics in a
//     loop per pod and derived into load, KV-cache usage, prefix-cache hit
//     rate, recent latencies and prefill speed, for the pod as a whole and
//     for each model it serves (GetMetricValueByPod,
//     GetMetricValueByPodModel). A page is read up to 4 MiB, and its series
//     of models the pod does not serve count for the pod as a whole only,
//     so that an engine cannot make the Store keep state for models it
//     makes up. A pod whose scrape fails keeps its last
//     values, marked Stale, PodScrapeState tells fresh, stale and not
//     yet scraped pods apart, and PodLastScraped says when the latest
//     successful scrape was (the KV event manager reads it to tell a dead
//     engine from a quiet one);
//   - which pods requests could not connect to: EjectPod takes a pod out
//     of routing for a backoff that doubles while it stays unreachable,
//     PodEjection reports it, and PodReachable or a successful scrape
//     readmits it;
//   - each pod's load record (inflight.PodLoad, see PodLoad): the requests
//     the request ledger (package inflight) has in flight on the pod and
//     its prefill queue, which the realtime metrics read
//     (RealtimeNumRequestsRunning, RealtimeNormalizedPendings). A pod
//     replaced by one of another UID starts with an empty record.
//
// Snapshots gives routing, in one registry lookup per candidate, all it
// reads of a pod: its endpoint, its built-in metrics and their scrape
// state, its ejection and its load record (PodSnapshot).
//
// The Store's background work (scraping, adapter listing) runs in Run,
// until its context ends. Reads never wait for I/O: scraping runs in the
// background and publishes its results. The Store exports its own
// Prometheus metrics (kvgate_cache_*) on the Registerer given in its
// Config.
//
// Beside the Store, components of their own:
//   - Profiles holds the GPU profiles of deployments (ModelGPUProfile),
//     set by hand or loaded from Redis (package redisstate), which decodes
//     them within MaxProfileIndexDimensions and MaxProfileIndexValues;
//   - OutputPredictors keeps a SimpleOutputPredictor per model, fed with
//     the usage of completed requests through the request ledger;
//   - CachedLoadProvider and PendingLoadProvider measure a pod's load and
//     what a request adds to it, from the Store's metrics and the profiles.
//
// RequestTrace is the format of the request traces written to Redis for
// autoscalers (see redisstate.Tracer).
package cache
