package routing

import (
	"math"

	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// outcomesOf lists the outcomes each algorithm can reach; their series are
// created up front so that dashboards see zeros.
var outcomesOf = map[string][]Outcome{
	Random:              {OutcomeRandom},
	LeastRequest:        {OutcomeLoad},
	LeastKVCache:        {OutcomeLoad},
	LeastLatency:        {OutcomeLoad},
	PrefixCache:         {OutcomePrefixHit, OutcomeLoadOverPrefix, OutcomeLoadFallback, OutcomeImbalanceGuard, OutcomeNoTokens},
	KVAware:             {OutcomePrefixHit, OutcomeLoadOverPrefix, OutcomeLoadFallback, OutcomeNoTokens},
	SLO:                 sloOutcomes,
	SLOLeastLoad:        sloOutcomes,
	SLOLeastLoadPulling: sloOutcomes,
	SLOPackLoad:         sloOutcomes,
}

var sloOutcomes = []Outcome{OutcomePrefixHit, OutcomeLoadOverPrefix, OutcomeLoadFallback, OutcomeNoTokens,
	OutcomeSLOWait, OutcomeSLOUnmeetable}

// routerMetrics are the Prometheus metrics of a Router.
type routerMetrics struct {
	decisions       *prometheus.CounterVec
	matchedFraction *prometheus.HistogramVec
	duration        *prometheus.HistogramVec
	ttftRatio       prometheus.Histogram
	prefixDropped   prometheus.CounterFunc
	// cachedPredicted, cachedFound and cachedReported compare the cached
	// prefixes routing counted on with what the engines found (see
	// Router.Observer).
	cachedPredicted, cachedFound, cachedReported prometheus.Counter

	// per algorithm, resolved once
	byAlg map[string]*algMetrics
}

type algMetrics struct {
	outcomes        map[Outcome]prometheus.Counter
	matchedFraction prometheus.Observer
	duration        prometheus.Observer
}

// newRouterMetrics registers the Router's metrics on reg; dropped reads
// how many attempts the in-flight prompt blocks did not record.
func newRouterMetrics(reg prometheus.Registerer, dropped func() float64) (*routerMetrics, error) {
	const ns, sub = "kvgate", "routing"
	m := &routerMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Routing decisions by algorithm and by what decided them (outcome).",
		}, []string{"algorithm", "outcome"}),
		matchedFraction: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "matched_fraction",
			Help:    "Share of the prompt's tokens the chosen pod holds in its KV cache (any medium), for tokenized requests.",
			Buckets: []float64{0, .1, .2, .3, .4, .5, .6, .7, .8, .9, .95, 1},
		}, []string{"algorithm"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "decision_duration_seconds",
			Help:    "Time to take a routing decision, after tokenization (prefix index match included).",
			Buckets: prometheus.ExponentialBuckets(1e-6, 2, 16),
		}, []string{"algorithm"}),
		ttftRatio: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "ttft_prediction_ratio",
			Help:    "Time to first token the gateway saw divided by kv-aware's prediction, for requests whose first token it relayed (streamed responses).",
			Buckets: []float64{.125, .25, .5, .67, .8, .9, 1, 1.1, 1.25, 1.5, 2, 4, 8},
		}),
		prefixDropped: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "inflight_prefix_dropped_total",
			Help: "Attempts whose prompt blocks were not remembered as in flight on their pod: the blocks " +
				"remembered had reached their bound.",
		}, dropped),
		cachedPredicted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "cached_tokens_predicted_total",
			Help: "Prompt tokens routing predicted the chosen pod had cached, for the attempts whose engine reported its cached tokens (prompt_tokens_details.cached_tokens).",
		}),
		cachedFound: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "cached_tokens_found_total",
			Help: "The part of kvgate_routing_cached_tokens_predicted_total the engines found cached: below it, predicted hits were evicted before the prefill started, or the index was wrong.",
		}),
		cachedReported: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "cached_tokens_reported_total",
			Help: "Cached prompt tokens the engines reported, for the same attempts as kvgate_routing_cached_tokens_predicted_total.",
		}),
		byAlg: map[string]*algMetrics{},
	}
	for alg, outcomes := range outcomesOf {
		am := &algMetrics{
			outcomes:        map[Outcome]prometheus.Counter{},
			matchedFraction: m.matchedFraction.WithLabelValues(alg),
			duration:        m.duration.WithLabelValues(alg),
		}
		for _, o := range outcomes {
			am.outcomes[o] = m.decisions.WithLabelValues(alg, string(o))
		}
		m.byAlg[alg] = am
	}
	if err := promreg.Register(reg, "routing", m.decisions, m.matchedFraction, m.duration, m.ttftRatio, m.prefixDropped,
		m.cachedPredicted, m.cachedFound, m.cachedReported); err != nil {
		return nil, err
	}
	return m, nil
}

// decided counts a decision of alg.
func (m *routerMetrics) decided(alg string, o Outcome) {
	if c, ok := m.byAlg[alg].outcomes[o]; ok {
		c.Inc()
		return
	}
	m.decisions.WithLabelValues(alg, string(o)).Inc()
}

// countCached compares the cached prefix routing predicted for an attempt
// on its pod with the cached tokens its engine reported, if it did.
func (m *routerMetrics) countCached(h *inflight.Handle) {
	u, _ := h.Usage()
	predicted, found, ok := CachedComparison(h.Route(), u)
	if !ok {
		return
	}
	m.cachedPredicted.Add(predicted)
	m.cachedFound.Add(found)
	m.cachedReported.Add(float64(max(u.CachedTokens, 0)))
}

// CachedComparison returns, for an attempt routed as rt whose engine
// reported usage u, the prompt tokens the decision predicted cached on its
// pod (the prompt less the predicted prefill work) and the part of them
// the engine found cached; ok is false when the engine reported no cached
// tokens or the prompt's length is unknown.
func CachedComparison(rt inflight.Route, u inflight.Usage) (predicted, found float64, ok bool) {
	if !u.CachedReported || rt.PromptTokens == 0 {
		return 0, 0, false
	}
	predicted = max(float64(rt.PromptTokens)-math.Round(rt.UncachedTokens), 0)
	return predicted, min(float64(max(u.CachedTokens, 0)), predicted), true
}
