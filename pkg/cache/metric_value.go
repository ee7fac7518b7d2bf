package cache

import "time"

// Names of the metrics the Store keeps per pod and per pod and model. The
// scraped ones are derived from the engine's vLLM /metrics; the realtime ones
// come from the pod's load record, kept by the request ledger (package
// inflight), and need no scrape.
const (
	// NumRequestsRunning is vllm:num_requests_running, summed over the
	// engines of the pod.
	NumRequestsRunning = "num_requests_running"
	// NumRequestsWaiting is vllm:num_requests_waiting, summed over the
	// engines of the pod.
	NumRequestsWaiting = "num_requests_waiting"
	// KVCacheUsagePerc is the fraction (0..1) of the KV cache in use,
	// averaged over the engines of the pod. It is read from the first of
	// vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc (older vLLM) and
	// vllm:cpu_cache_usage_perc that the engine exposes.
	KVCacheUsagePerc = "kv_cache_usage_perc"
	// PrefixCacheHitRate is the share of prompt tokens served from the
	// prefix cache over the recent window: the delta of
	// vllm:prefix_cache_hits_total over the delta of
	// vllm:prefix_cache_queries_total. It is 0 on the first scrape, on the
	// scrape that sees the counters reset (engine restart) and when no
	// tokens were queried in the window.
	PrefixCacheHitRate = "prefix_cache_hit_rate"
	// AvgTTFTSeconds is the mean of vllm:time_to_first_token_seconds over
	// the requests observed in the recent window (see AvgE2ELatencySeconds).
	AvgTTFTSeconds = "avg_ttft_seconds"
	// AvgTPOTSeconds is the mean of vllm:inter_token_latency_seconds, or of
	// vllm:time_per_output_token_seconds on engines without it, over the
	// recent window (see AvgE2ELatencySeconds).
	AvgTPOTSeconds = "avg_tpot_seconds"
	// AvgE2ELatencySeconds is the mean of vllm:e2e_request_latency_seconds
	// over the observations of the recent window. A window without new
	// observations keeps the previous mean; before the first windowed mean
	// the engine's lifetime mean stands in.
	AvgE2ELatencySeconds = "avg_e2e_latency_seconds"
	// PrefillTokensPerSecond estimates how fast the pod computes prompt
	// tokens: the tokens it computed rather than took from its prefix cache
	// (the delta of vllm:prompt_tokens_total minus the delta of
	// vllm:prefix_cache_hits_total) per second of computing them (the delta
	// of the sum of vllm:request_prefill_time_seconds, less one engine step
	// per prefill, a step lasting the mean inter-token latency), over the
	// prefill-speed window (Config.PrefillSpeedWindow, 1 min by default);
	// PrefillSample.TokensPerSecond gives the formula and its limits. Engines without the prefill-time histogram are measured
	// against vllm:time_to_first_token_seconds instead, which includes
	// queueing and so underestimates the speed. A window whose prefills
	// were nearly all cache hits, or that saw no prefill, keeps the
	// previous estimate for up to one more prefill-speed window, then the
	// pod has no value until a window measures one again; before the first
	// one the lifetime counters stand in, and a pod that never ran a
	// prefill long enough to tell has no value. Divide a prompt's uncached tokens by it and add one step to
	// predict the prefill part of its time to first token.
	PrefillTokensPerSecond = "prefill_tokens_per_second"
	// CacheBlockSize is the block_size label of vllm:cache_config_info:
	// tokens per KV-cache block.
	CacheBlockSize = "cache_block_size"
	// CacheNumGPUBlocks is the num_gpu_blocks label of
	// vllm:cache_config_info, summed over the engines of the pod.
	CacheNumGPUBlocks = "cache_num_gpu_blocks"

	// RealtimeNumRequestsRunning counts the requests routed to the pod (and
	// model) whose attempts are open in the request ledger; with shared
	// request counts it includes the other gateway replicas' requests.
	RealtimeNumRequestsRunning = "realtime_num_requests_running"
	// RealtimeNormalizedPendings sums, over the requests routed to the pod
	// whose attempts are open, the load each adds according to the pod's
	// GPU profile (see PendingLoadProvider); 1 is the pod's capacity.
	RealtimeNormalizedPendings = "realtime_normalized_pendings"
)

// MetricValue is one metric of a pod, or of a model on a pod.
type MetricValue struct {
	// Value is the metric's value. For a subscribed histogram it is the
	// lifetime mean (Histogram.Sum / Histogram.Count).
	Value float64
	// Histogram holds the cumulative histogram of a subscribed histogram
	// metric, nil otherwise. It is shared: treat it as read-only.
	Histogram *HistogramValue
	// UpdatedAt is when the value was measured: the time of the scrape that
	// produced it, or the time of the read for realtime metrics.
	UpdatedAt time.Time
	// Stale is set when the pod's latest scrape failed or the pod is no
	// longer scraped (not ready): Value is then the last value measured.
	Stale bool
}

// HistogramValue is a cumulative Prometheus histogram summed over the
// series of a pod (or of a model on a pod).
type HistogramValue struct {
	Count float64
	Sum   float64
	// Buckets are in increasing order of UpperBound; the +Inf bucket is
	// left out (its count is Count).
	Buckets []Bucket
}

// Bucket is one cumulative histogram bucket.
type Bucket struct {
	UpperBound      float64
	CumulativeCount float64
}

// MetricSubscriber asks the Store to keep more of the engines' metrics than
// the built-in ones.
type MetricSubscriber interface {
	// SubscribedMetrics names the metrics the subscriber reads. Names of
	// the Store's built-in metrics need nothing more; any other name is
	// taken as a metric family of the engine's /metrics (for example
	// "vllm:num_preemptions_total") and kept, under that name, summed over
	// the pod's series: gauges, counters and untyped samples as Value,
	// histograms and summaries as Histogram.
	SubscribedMetrics() []string
}
