package tokenizer

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// resultOK is the calls_total label of a successful call.
const resultOK = "ok"

// metrics are a Tokenizer's Prometheus metrics.
type metrics struct {
	calls         map[string]prometheus.Counter // by result: resultOK or a Reason
	callDuration  prometheus.Histogram
	hits          prometheus.Counter
	misses        prometheus.Counter
	evictions     prometheus.Counter
	cachedTokens  prometheus.Gauge
	cachedBytes   prometheus.Gauge
	cachedEntries prometheus.Gauge

	partialHits        prometheus.Counter
	backgroundDropped  prometheus.Counter
	localTokenizations [2]prometheus.Counter // by form index
	localFallbacks     map[string]prometheus.Counter
	verificationsVec   *prometheus.CounterVec
	mismatchesVec      *prometheus.CounterVec
	reasoningProbesVec *prometheus.CounterVec
}

// Reasons a request of a model with tokenizer files is not tokenized in
// process, as kvgate_tokenizer_local_fallbacks_total labels them. The
// engine tokenizes it, but for fallbackTooLarge.
const (
	fallbackUnverified = "unverified" // not yet compared with the engine
	fallbackMismatch   = "mismatch"   // the engine's ids differed
	fallbackRequest    = "request"    // chat_template or multimodal settings in the request
	fallbackRender     = "render"     // the conversation does not render in process
	fallbackLongWord   = "long_word"  // a word longer than hf.MaxWordBytes
	fallbackTooLarge   = "too_large"  // beyond Config.LocalMaxBytes: routed without tokens
)

// Results of a comparison with the engine.
const (
	verifyMatch    = "match"
	verifyMismatch = "mismatch"
	verifyError    = "error"   // the engine did not answer
	verifySkipped  = "skipped" // every background slot was taken
)

func (m *metrics) verifications(model string, form int, result string) prometheus.Counter {
	return m.verificationsVec.WithLabelValues(model, forms[form], result)
}

func (m *metrics) reasoningProbes(model, result string) prometheus.Counter {
	return m.reasoningProbesVec.WithLabelValues(model, result)
}

func (m *metrics) mismatches(model string, form int) prometheus.Counter {
	return m.mismatchesVec.WithLabelValues(model, forms[form])
}

// localFormsCollectors returns the gauges of kvgate_tokenizer_local_forms,
// one per state, counting the models' forms in that state when scraped.
func localFormsCollectors(local map[string]*localModel) []prometheus.Collector {
	var out []prometheus.Collector
	for state, name := range stateNames {
		out = append(out, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "kvgate", Subsystem: "tokenizer", Name: "local_forms",
			Help: "Forms (completion, chat) of the models with tokenizer files, by state: active (tokenized in process), " +
				"unverified, verifying, fallback (the engine disagreed) or unavailable (no chat template).",
			ConstLabels: prometheus.Labels{"state": string(name)},
		}, func() float64 {
			n := 0
			for _, lm := range local {
				for f := range forms {
					if lm.state[f].Load() == int32(state) {
						n++
					}
				}
			}
			return float64(n)
		}))
	}
	return out
}

func newMetrics(reg prometheus.Registerer, local map[string]*localModel) (*metrics, error) {
	const ns, sub = "kvgate", "tokenizer"
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "calls_total",
		Help: "vLLM /tokenize calls by result: ok, timeout, canceled, connection, status or bad_body.",
	}, []string{"result"})
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	m := &metrics{
		calls: map[string]prometheus.Counter{resultOK: calls.WithLabelValues(resultOK)},
		callDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "call_duration_seconds",
			Help:    "Duration of vLLM /tokenize calls, whatever their result.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		hits:   counter("cache_hits_total", "Tokenizations served from the cache."),
		misses: counter("cache_misses_total", "Tokenizations not in the cache; concurrent identical misses share one call."),
		evictions: counter("cache_evictions_total",
			"Tokenizations evicted from the cache to stay within its memory budget, KVGATE_TOKENIZER_CACHE_MAX_TOKENS times 4 bytes."),
		cachedTokens: gauge("cache_tokens", "Token ids held by the cache."),
		cachedBytes: gauge("cache_bytes",
			"Bytes the cache's tokenizations take, as charged against its budget: 4 per token id and 192 per tokenization."),
		cachedEntries: gauge("cache_entries", "Tokenizations held by the cache."),
		partialHits: counter("cache_partial_hits_total",
			"Chat tokenizations answered at once with the tokens of the longest message prefix in the cache, while the engine tokenizes the whole chat in the background."),
		backgroundDropped: counter("background_dropped_total",
			"Calls off the request path not made because every background slot was taken: a chat waited for its whole tokenization instead of using a message prefix."),
		localFallbacks: map[string]prometheus.Counter{},
		verificationsVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "verifications_total",
			Help: "Comparisons of the in-process tokenizer with the engine's /tokenize, by model, form and result: match, mismatch, error (no answer) or skipped (no background slot).",
		}, []string{"model", "form", "result"}),
		mismatchesVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "mismatches_total",
			Help: "Requests the in-process tokenizer tokenized differently from the engine, by model and form; the engine tokenizes that model and form from the first one on.",
		}, []string{"model", "form"}),
		reasoningProbesVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "reasoning_probes_total",
			Help: "Chats carrying assistant reasoning sent to the engine's /tokenize, when a model's chat form is verified, to learn how it passes " +
				"reasoning to the chat template, by model and result: match (the engine's ids are those of a way of passing it), nomatch, " +
				"refused or error (no answer, asked again with the chat form's verification); nomatch or refused leaves the model's chats " +
				"carrying reasoning to the engine.",
		}, []string{"model", "result"}),
	}
	localCount := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "local_tokenizations_total",
		Help: "Prompts tokenized in process from the model's tokenizer files, by form.",
	}, []string{"form"})
	for i, f := range forms {
		m.localTokenizations[i] = localCount.WithLabelValues(f)
	}
	fallbacks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "local_fallbacks_total",
		Help: "Prompts of models with tokenizer files not tokenized in process, by reason: unverified, mismatch, request, render " +
			"or long_word (a word longer than 2 KiB), which the engine tokenized, or too_large (beyond KVGATE_TOKENIZER_LOCAL_MAX_BYTES), " +
			"routed on load alone.",
	}, []string{"reason"})
	for _, r := range []string{fallbackUnverified, fallbackMismatch, fallbackRequest, fallbackRender, fallbackLongWord, fallbackTooLarge} {
		m.localFallbacks[r] = fallbacks.WithLabelValues(r)
	}
	for _, r := range callReasons {
		m.calls[string(r)] = calls.WithLabelValues(string(r))
	}
	collectors := []prometheus.Collector{calls, m.callDuration, m.hits, m.misses, m.evictions, m.cachedTokens, m.cachedBytes, m.cachedEntries,
		m.partialHits, m.backgroundDropped, localCount, fallbacks, m.verificationsVec, m.mismatchesVec, m.reasoningProbesVec}
	collectors = append(collectors, localFormsCollectors(local)...)
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("register tokenizer metrics: %w", err)
		}
	}
	return m, nil
}

// observeCall records a finished call; result is resultOK or a Reason.
func (m *metrics) observeCall(seconds float64, result string) {
	m.callDuration.Observe(seconds)
	m.calls[result].Inc()
}
