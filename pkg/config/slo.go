package config

// SectionSLO is the configuration reference's section on service-level
// objectives and the queue of the SLO-aware routing algorithms.
const SectionSLO = "SLOs and queueing"

// SLOs and the per-model queue.
var (
	SLOTTFT = Var{
		Name:    "KVGATE_SLO_TTFT",
		Default: "0",
		Section: SectionSLO,
		Doc: "Time-to-first-token objective of every model, in seconds or with a unit (\"1.5s\"); 0 sets none. A GPU profile's " +
			"slos.ttft wins for its model, KVGATE_SLO_MODELS for the models it names. Read by the SLO-aware algorithms (slo, " +
			"slo-least-load, slo-least-load-pulling, slo-pack-load).",
	}
	SLOTTFTPerPromptToken = Var{
		Name:    "KVGATE_SLO_TTFT_PER_PROMPT_TOKEN",
		Default: "0",
		Section: SectionSLO,
		Doc: "Added to the time-to-first-token objective for each prompt token (e.g. \"200us\": 2 s more for a " +
			"10,000-token prompt), so that one objective fits short and long prompts; 0 adds nothing.",
	}
	SLOTPOT = Var{
		Name:    "KVGATE_SLO_TPOT",
		Default: "0",
		Section: SectionSLO,
		Doc:     "Objective on the mean time between output tokens, in seconds or with a unit (\"50ms\"); 0 sets none. A GPU profile's slos.tpot wins.",
	}
	SLOE2E = Var{
		Name:    "KVGATE_SLO_E2E",
		Default: "0",
		Section: SectionSLO,
		Doc:     "End-to-end latency objective, arrival to last token, in seconds or with a unit; 0 sets none. A GPU profile's slos.e2e wins.",
	}
	SLOModels = Var{
		Name:    "KVGATE_SLO_MODELS",
		Default: "",
		Section: SectionSLO,
		Doc: "Objectives of named models, replacing the defaults above for them: model=kind:duration,... separated by " +
			"semicolons, kinds ttft, ttft-per-token, tpot and e2e, e.g. \"llama=ttft:2s,tpot:50ms;qwen=e2e:30s\". " +
			"A model named with \"none\" has no objective.",
	}
	SLOQueueMaxLength = Var{
		Name:    "KVGATE_SLO_QUEUE_MAX_LENGTH",
		Default: "1024",
		Section: SectionSLO,
		Doc: "Most requests one model's queue holds while no pod can serve them within their objective; a request " +
			"arriving at a full queue is answered 429 with Retry-After, unless its priority (its InferenceObjective's) " +
			"is higher than a waiting request's: the waiting request of the lowest priority then leaves, answered 429 " +
			"slo_displaced, for it to wait (with KVGATE_SLO_QUEUE_FAIRNESS=round-robin, one of the flow with the most " +
			"requests of that priority waiting).",
	}
	SLOQueueMaxWait = Var{
		Name:    "KVGATE_SLO_QUEUE_MAX_WAIT",
		Default: "60",
		Section: SectionSLO,
		Doc: "Longest a request waits in its model's queue, in seconds or with a unit; it leaves earlier, answered 429 " +
			"with Retry-After, once it can no longer meet its objective. Also the longest Retry-After the queues answer " +
			"(their estimate of when a pod frees up, in whole seconds).",
	}
	SLOQueueFairness = Var{
		Name:    "KVGATE_SLO_QUEUE_FAIRNESS",
		Default: "deadline",
		Section: SectionSLO,
		Doc: "How a model's queue orders the waiting requests of one priority that belong to different flows (their " +
			"x-gateway-inference-fairness-id header, e.g. a tenant; requests without it share one default flow): deadline " +
			"sends them earliest deadline first, whatever their flow; round-robin has the flows take turns, each flow's " +
			"requests earliest deadline first, so that a flow flooding the queue cannot starve the others. With " +
			"round-robin, a request arriving at a full queue takes the place of the latest deadline of the flow with " +
			"the most requests waiting at the lowest priority (answered 429 slo_displaced) when its own priority is " +
			"higher, or equal and its own flow has at least two fewer requests of it waiting; otherwise it is refused (429 " +
			"slo_queue_full). Either way, higher priorities are sent first.",
	}
)

// Saturation: when the requests of a negative priority are shed, and, with
// flow control, when requests wait in their model's queue.
var (
	SaturationQueueDepth = Var{
		Name:    "KVGATE_SATURATION_QUEUE_DEPTH",
		Default: "5",
		Section: SectionSLO,
		Doc: "A pod has capacity for sheddable requests (an InferenceObjective's negative priority) while at most this " +
			"many requests wait in its engine's queue (vllm:num_requests_waiting), its KV cache is at most " +
			"KVGATE_SATURATION_KV_CACHE_UTILIZATION full and its metrics are fresh (KVGATE_SATURATION_METRICS_STALENESS_MS). " +
			"When no candidate pod of a request's model has capacity, a request of a negative priority is refused with " +
			"429 and Retry-After; requests of priority 0 or more are not refused for it, and with KVGATE_FLOW_CONTROL wait " +
			"in the gateway while it lasts. At least 0.",
	}
	SaturationKVCacheUtilization = Var{
		Name:    "KVGATE_SATURATION_KV_CACHE_UTILIZATION",
		Default: "0.8",
		Section: SectionSLO,
		Doc: "The most a pod's KV cache may be in use (vllm:kv_cache_usage_perc, 0 to 1) for the pod to have capacity " +
			"for sheddable requests (see KVGATE_SATURATION_QUEUE_DEPTH).",
	}
	SaturationMetricsStaleness = Var{
		Name:    "KVGATE_SATURATION_METRICS_STALENESS_MS",
		Default: "200",
		Section: SectionSLO,
		Doc: "How old, in milliseconds, a pod's latest scrape may be for the pod to have capacity for sheddable " +
			"requests (see KVGATE_SATURATION_QUEUE_DEPTH); a pod whose last scrape failed has none. It must exceed " +
			"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS: the default, four scrapes at the default interval, leaves room for " +
			"a late scrape.",
	}
	FlowControl = Var{
		Name:    "KVGATE_FLOW_CONTROL",
		Default: "false",
		Section: SectionSLO,
		Doc: "Holds the completion, chat, Messages and Responses requests of every routing algorithm in their model's " +
			"queue while no candidate pod has capacity (see KVGATE_SATURATION_QUEUE_DEPTH; the requests this gateway " +
			"sent a pod since its latest scrape count as waiting there), highest priority first, and routes each by its " +
			"algorithm among all the model's pods once one has capacity, instead of sending it to an engine's queue. The " +
			"queue is the SLO-aware algorithms' (KVGATE_SLO_QUEUE_MAX_LENGTH, KVGATE_SLO_QUEUE_MAX_WAIT); those " +
			"algorithms queue as before. Sheddable requests are still refused with 429 pool_saturated rather than queued, " +
			"and a request needing a stored response pinned to one pod is not queued.",
	}
)
