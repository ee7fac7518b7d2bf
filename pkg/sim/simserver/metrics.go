package simserver

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/sim"
)

// Histogram buckets of vLLM's metrics (vllm/v1/metrics/loggers.py).
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	tokenLatencyBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	requestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
		30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// metrics are the vLLM metrics of one simulated server, labelled by
// model_name and engine (the data-parallel rank) as vLLM labels them.
type metrics struct {
	model            string
	running          *prometheus.GaugeVec
	waiting          *prometheus.GaugeVec
	kvUsage          *prometheus.GaugeVec
	cacheConfig      *prometheus.GaugeVec
	prefixQueries    *prometheus.CounterVec
	prefixHits       *prometheus.CounterVec
	promptTokens     *prometheus.CounterVec
	generationTokens *prometheus.CounterVec
	preemptions      *prometheus.CounterVec
	success          *prometheus.CounterVec
	ttft             *prometheus.HistogramVec
	itl              *prometheus.HistogramVec
	tpot             *prometheus.HistogramVec
	e2e              *prometheus.HistogramVec
	queueTime        *prometheus.HistogramVec
	prefillTime      *prometheus.HistogramVec
}

// cacheConfigLabels are the labels of vllm:cache_config_info, a subset of
// the CacheConfig fields vLLM exports, plus engine.
var cacheConfigLabels = []string{"block_size", "cache_dtype", "enable_prefix_caching", "engine",
	"gpu_memory_utilization", "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override",
	"prefix_caching_hash_algo", "sliding_window"}

// newMetrics registers the metrics of a server for model on reg.
func newMetrics(reg prometheus.Registerer, model string) (*metrics, error) {
	labels := []string{"model_name", "engine"}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	// prometheus_client, which vLLM uses, appends _total to counter names;
	// client_golang does not.
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	m := &metrics{
		model:   model,
		running: gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting: gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage: gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		cacheConfig: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		}, cacheConfigLabels),
		prefixQueries:    counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:       counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		promptTokens:     counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generationTokens: counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		preemptions:      counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.",
		}, append(labels, "finished_reason")),
		ttft: histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:  histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tokenLatencyBuckets),
		tpot: histogram("vllm:time_per_output_token_seconds",
			"Histogram of time per output token in seconds (the name vLLM used for inter-token latency before v0.11).", tokenLatencyBuckets),
		e2e:       histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", requestLatencyBuckets),
		queueTime: histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", requestLatencyBuckets),
		prefillTime: histogram("vllm:request_prefill_time_seconds",
			"Histogram of time spent in PREFILL phase for request.", requestLatencyBuckets),
	}
	for _, c := range []prometheus.Collector{m.running, m.waiting, m.kvUsage, m.cacheConfig, m.prefixQueries,
		m.prefixHits, m.promptTokens, m.generationTokens, m.preemptions, m.success, m.ttft, m.itl, m.tpot, m.e2e, m.queueTime,
		m.prefillTime} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register simulator metrics: %w", err)
		}
	}
	return m, nil
}

// rankMetrics are the series of one engine rank.
type rankMetrics struct {
	running, waiting, kvUsage                                              prometheus.Gauge
	prefixQueries, prefixHits, promptTokens, generationTokens, preemptions prometheus.Counter
	success                                                                map[sim.FinishReason]prometheus.Counter
	ttft, itl, tpot, e2e, queueTime, prefillTime                           prometheus.Observer
}

// forRank returns the series of rank, whose engine runs with cfg, and sets
// its vllm:cache_config_info.
func (m *metrics) forRank(rank int, cfg sim.EngineConfig) *rankMetrics {
	l := prometheus.Labels{"model_name": m.model, "engine": strconv.Itoa(rank)}
	m.cacheConfig.With(prometheus.Labels{
		"block_size":               strconv.Itoa(cfg.BlockSize),
		"cache_dtype":              "auto",
		"enable_prefix_caching":    "True",
		"engine":                   strconv.Itoa(rank),
		"gpu_memory_utilization":   "0.9",
		"num_cpu_blocks":           "None",
		"num_gpu_blocks":           strconv.Itoa(cfg.NumGPUBlocks),
		"num_gpu_blocks_override":  strconv.Itoa(cfg.NumGPUBlocks),
		"prefix_caching_hash_algo": "sha256",
		"sliding_window":           "None",
	}).Set(1)
	rm := &rankMetrics{
		running:          m.running.With(l),
		waiting:          m.waiting.With(l),
		kvUsage:          m.kvUsage.With(l),
		prefixQueries:    m.prefixQueries.With(l),
		prefixHits:       m.prefixHits.With(l),
		promptTokens:     m.promptTokens.With(l),
		generationTokens: m.generationTokens.With(l),
		preemptions:      m.preemptions.With(l),
		success:          make(map[sim.FinishReason]prometheus.Counter),
		ttft:             m.ttft.With(l),
		itl:              m.itl.With(l),
		tpot:             m.tpot.With(l),
		e2e:              m.e2e.With(l),
		queueTime:        m.queueTime.With(l),
		prefillTime:      m.prefillTime.With(l),
	}
	for _, reason := range []sim.FinishReason{sim.FinishStop, sim.FinishLength, sim.FinishAbort} {
		rm.success[reason] = m.success.With(prometheus.Labels{
			"model_name": m.model, "engine": strconv.Itoa(rank), "finished_reason": string(reason),
		})
	}
	return rm
}

// setQueue records the rank's queues and KV-cache usage.
func (m *rankMetrics) setQueue(q sim.QueueState) {
	m.running.Set(float64(q.Running))
	m.waiting.Set(float64(q.Waiting))
	m.kvUsage.Set(q.KVCacheUsage)
}

// step records a finished step.
func (m *rankMetrics) step(s sim.StepStats) {
	m.running.Set(float64(s.Running))
	m.waiting.Set(float64(s.Waiting))
	m.kvUsage.Set(s.KVCacheUsage)
	m.prefixQueries.Add(float64(s.PrefixCacheQueries))
	m.prefixHits.Add(float64(s.PrefixCacheHits))
	m.promptTokens.Add(float64(s.PromptTokens))
	m.generationTokens.Add(float64(s.GenerationTokens))
	m.preemptions.Add(float64(s.Preemptions))
}

// token records a generated token: for a first token the time to first
// token and the prefill time (first scheduling to first token, as vLLM
// measures it), otherwise the gap since the previous token.
func (m *rankMetrics) token(out sim.RequestOutput, sincePrev time.Duration) {
	if tm := out.Stats.Timings; out.Stats.OutputTokens == 1 {
		m.ttft.Observe(tm.TTFT().Seconds())
		m.prefillTime.Observe(tm.FirstToken.Sub(tm.Scheduled).Seconds())
		return
	}
	m.itl.Observe(sincePrev.Seconds())
	m.tpot.Observe(sincePrev.Seconds())
}

// finished records a finished request.
func (m *rankMetrics) finished(out sim.RequestOutput) {
	m.requestSuccess(out.FinishReason)
	m.e2e.Observe(out.Stats.Timings.E2E().Seconds())
	m.queueTime.Observe(out.Stats.Timings.QueueTime().Seconds())
}

func (m *rankMetrics) requestSuccess(reason sim.FinishReason) { m.success[reason].Inc() }
