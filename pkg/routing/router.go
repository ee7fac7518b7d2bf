package routing

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/types"
)

// uncachedEWMAWeight is the weight of the newest prefill in the running
// mean of uncached tokens per request.
const uncachedEWMAWeight = 0.1

// Router routes requests to pods with the algorithm each request names. It
// reads each candidate from its snapshot: the pod's metrics and scrape
// state from the Store, and the requests and prefills the gateway has in
// flight on it from its load record, which the request ledger keeps
// (package inflight). All its methods are safe for concurrent use; none
// waits for I/O.
type Router struct {
	cfg     Config
	algs    map[string]algorithm
	rng     *lockedRand
	scratch sync.Pool // *scratch
	metrics *routerMetrics
	log     klog.Logger
	// inFlight holds the prompt blocks of the attempts open.
	inFlight *inFlightPrefixes
	// meanUncached holds the float64 bits of a running mean of the
	// uncached tokens of started prefills, 0 before the first.
	meanUncached atomic.Uint64
}

// input is what an algorithm's pick reads: the decision with its gathered
// candidates and the request's facts.
type input struct {
	d   *Decision
	s   *scratch
	rng *lockedRand
	// hasTokens reports token ids; matched reports that every candidate
	// was matched against the index.
	hasTokens, matched bool
	// freshOnly reports that some candidates' metrics are current and
	// others' are not: only the current ones may be chosen on load.
	freshOnly bool
	// meanUncached estimates the prefill tokens of one queued request.
	meanUncached float64
	// outputTokens is the request's predicted output length, 0 if unknown.
	outputTokens int
	// model is the requested model; slo its SLO and elapsed the seconds
	// since it arrived.
	model   string
	slo     types.SLO
	elapsed float64
	// sloContended is rc.SLOContended.
	sloContended bool
}

// New returns a Router configured by cfg, with its metrics registered on
// cfg.Registerer. It fails when cfg is invalid or the metrics cannot be
// registered.
func New(cfg Config) (*Router, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.DefaultAlgorithm, _ = canonicalName(cfg.DefaultAlgorithm)
	r := &Router{
		cfg:      cfg,
		algs:     newAlgorithms(&cfg),
		rng:      newLockedRand(cfg.Rand),
		log:      cfg.Logger.WithName("routing"),
		inFlight: newInFlightPrefixes(cfg.MaxInFlightPrefixBlocks),
	}
	m, err := newRouterMetrics(cfg.Registerer, func() float64 { return float64(r.inFlight.dropped.Load()) })
	if err != nil {
		return nil, err
	}
	r.metrics = m
	r.scratch.New = func() any { return new(scratch) }
	return r, nil
}

// DefaultAlgorithm returns the algorithm of requests that name none.
func (r *Router) DefaultAlgorithm() string { return r.cfg.DefaultAlgorithm }

// Resolve returns the algorithm a request naming name is routed with: the
// default for "", else the algorithm of that name, matched regardless of
// case and surrounding white space. It fails with an *UnknownAlgorithmError
// otherwise. The gateway calls it on the routing-strategy header before
// tokenizing, so that a bad name costs nothing.
func (r *Router) Resolve(name string) (string, error) {
	if name == "" {
		return r.cfg.DefaultAlgorithm, nil
	}
	if n, ok := canonicalName(name); ok {
		return n, nil
	}
	return "", &UnknownAlgorithmError{Name: name}
}

// Route chooses one of pods for the request rc with the algorithm
// rc.Algorithm names (see Resolve), records the choice with
// rc.SetTargetPod, and describes it in d, which it overwrites. ctx carries
// the request's logger, if any; Route never waits, so its deadline plays no
// part. pods are the snapshots of the routable pods serving rc.Model
// (cache.Store.Snapshots), one per candidate: every input of the decision
// but the prefix index comes from them. The Router reads but never modifies
// them. Prefix algorithms match rc.PromptTokenIDs under each pod's base
// model (endpoint.Endpoint.Model) and rc.LoraAdapter; without token ids
// they route on load. Route fails with an *UnknownAlgorithmError, or with an
// error wrapping ErrNoPods when pods is empty; d is then left describing no
// pod. An SLO-aware algorithm that finds no pod predicted to meet the
// request's SLO fails with an *SLOError, d describing the candidates and no
// chosen pod.
func (r *Router) Route(ctx context.Context, rc *types.RoutingContext, pods []cache.PodSnapshot, d *Decision) error {
	start := time.Now()
	name, err := r.Resolve(rc.Algorithm)
	if err != nil {
		d.reset()
		return err
	}
	if len(pods) == 0 {
		d.reset()
		return fmt.Errorf("route request %s for model %q: %w", rc.RequestID, rc.Model, ErrNoPods)
	}
	alg := r.algs[name]
	s := r.scratch.Get().(*scratch)
	defer r.scratch.Put(s)

	in := r.gather(rc, pods, alg.needs(), d, s)
	d.Algorithm = name
	alg.pick(in)
	am := r.metrics.byAlg[name]
	if d.chosen < 0 {
		am.duration.Observe(time.Since(start).Seconds())
		r.metrics.decided(name, d.Outcome)
		r.logDecision(ctx, rc, d)
		if d.sloErr == nil {
			return fmt.Errorf("route request %s for model %q with %s: %w", rc.RequestID, rc.Model, name, ErrNoPods)
		}
		return d.sloErr
	}
	r.settle(rc, &in, s)
	rc.SetTargetPod(d.Endpoint.Pod)

	am.duration.Observe(time.Since(start).Seconds())
	r.metrics.decided(name, d.Outcome)
	if in.hasTokens && r.cfg.Index != nil {
		am.matchedFraction.Observe(float64(d.Chosen().MatchedTokens) / float64(d.PromptTokens))
	}
	r.logDecision(ctx, rc, d)
	return nil
}

// settle fills in what the chosen candidate needs for in-flight accounting
// and the decision's summary: its match, when the algorithm did not match
// every candidate, and its uncached tokens.
func (r *Router) settle(rc *types.RoutingContext, in *input, s *scratch) {
	d := in.d
	c := &d.Candidates[d.chosen]
	if in.hasTokens && !in.matched && r.cfg.Index != nil {
		r.match(rc, d, d.Candidates[d.chosen:d.chosen+1], s)
	}
	c.setUncached(d.PromptTokens, r.cfg.CPUCacheWeight)
	d.Endpoint, d.PodKey = c.ep, c.Pod
	if in.matched && r.algs[d.Algorithm].needs()&needMatch != 0 {
		d.DPRank = c.dpRank()
	}
}

// dpRank returns the rank of the candidate's pod that holds strictly more
// of the prompt's prefix than its other ranks, for a pod serving several
// ranks behind its port from rank 0; -1 for none.
func (c *Candidate) dpRank() int {
	ep := c.ep
	if ep.DPSize < 2 || ep.DPStartRank != 0 || c.MatchedBlocks <= c.otherRankBlocks || c.rank >= ep.DPSize {
		return -1
	}
	return c.rank
}

// Observer returns the request ledger observer through which the Router
// follows the attempts it routed: each opened attempt's uncached tokens
// feed the running mean kv-aware charges a request waiting in an engine's
// queue, its prompt's blocks count as held on its pod until it closes (see
// Candidate.InFlightMatchedBlocks), each first token is compared with
// kv-aware's prediction (kvgate_routing_ttft_prediction_ratio), and each
// closed attempt's cached tokens, as its engine reported them, are compared
// with the prefix the decision counted on
// (kvgate_routing_cached_tokens_*_total).
func (r *Router) Observer() inflight.Observer {
	return inflight.Observer{
		Opened: func(h *inflight.Handle) {
			r.noteUncached(h.Route().UncachedTokens)
			r.inFlight.add(h)
		},
		FirstToken: func(h *inflight.Handle) {
			if p := h.Route().PredictedTTFTSeconds; p > 0 {
				r.metrics.ttftRatio.Observe(h.FirstTokenAt().Sub(h.Opened()).Seconds() / p)
			}
		},
		Closed: func(h *inflight.Handle) {
			r.inFlight.remove(h)
			r.metrics.countCached(h)
		},
	}
}

// noteUncached folds a started prefill's uncached tokens into the running
// mean. Concurrent updates may lose one another's sample, which a running
// mean tolerates.
func (r *Router) noteUncached(tokens float64) {
	old := r.meanUncached.Load()
	mean := math.Float64frombits(old)
	if mean == 0 {
		mean = tokens
	} else {
		mean += uncachedEWMAWeight * (tokens - mean)
	}
	r.meanUncached.CompareAndSwap(old, math.Float64bits(mean))
}

// logDecision logs the decision at verbosity 4 and its candidates at 5.
func (r *Router) logDecision(ctx context.Context, rc *types.RoutingContext, d *Decision) {
	l := r.logger(ctx)
	if v := l.V(4); v.Enabled() && d.chosen < 0 {
		v.Info("No pod meets the request's SLO", "requestID", rc.RequestID,
			"clientRequestID", rc.LoggedClientRequestID(), "model", rc.Model, "algorithm", d.Algorithm,
			"outcome", d.Outcome, "err", d.sloErr)
	} else if v.Enabled() {
		c := d.Chosen()
		v.Info("Routed request", "requestID", rc.RequestID,
			"clientRequestID", rc.LoggedClientRequestID(), "model", rc.Model, "lora", rc.LoraAdapter,
			"algorithm", d.Algorithm, "outcome", d.Outcome, "pod", d.PodKey,
			"promptTokens", d.PromptTokens, "matchedTokens", c.MatchedTokens, "matchedGPUTokens", c.MatchedGPUTokens,
			"uncachedTokens", c.UncachedTokens, "running", c.Running, "waiting", c.Waiting,
			"queueSeconds", c.QueueSeconds, "prefillTokensPerSecond", c.PrefillTokensPerSecond,
			"predictedTTFTSeconds", c.PredictedTTFTSeconds, "score", c.Score)
	}
	if v := l.V(5); v.Enabled() {
		v.Info("Routing candidates", "requestID", rc.RequestID,
			"clientRequestID", rc.LoggedClientRequestID(), "algorithm", d.Algorithm, "candidates", d.Candidates)
	}
}

// logger returns the logger ctx carries, else the Router's.
func (r *Router) logger(ctx context.Context) klog.Logger {
	if ctx != nil {
		if l, err := logr.FromContext(ctx); err == nil {
			return l
		}
	}
	return r.log
}

// reset makes d describe no decision, keeping its slices.
func (d *Decision) reset() {
	*d = Decision{Candidates: d.Candidates[:0], promptBlocks: d.promptBlocks[:0], DPRank: -1}
}

// InFlightBlocks returns, per pod ("namespace/name"), the keys of the
// prompt blocks that the attempts this Router follows hold there (see
// Candidate.InFlightMatchedBlocks): each attempt's in prompt order, so that
// a cut at most max keys in all leaves its leading blocks. It reports
// whether some were left out for lack of room. Another gateway replica hands them to the pod's load record
// (inflight.PodLoad.SetRemoteBlocks), so that its kv-aware credits the pod
// with the prefixes this one sent there; the keys are the same in every
// process.
func (r *Router) InFlightBlocks(max int) (blocks map[string][]uint64, truncated bool) {
	return r.inFlight.snapshot(max)
}
