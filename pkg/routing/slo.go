package routing

import (
	"fmt"
	"math"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
)

// SLOVerdict says whether a pod is predicted to serve a request within its
// SLO.
type SLOVerdict string

// Verdicts of the SLO-aware algorithms on a candidate.
const (
	// SLOMeets: the pod is predicted to meet every target of the SLO and
	// has the capacity its GPU profile allows.
	SLOMeets SLOVerdict = "meets"
	// SLOMisses: the pod is predicted to miss a target.
	SLOMisses SLOVerdict = "misses"
	// SLOFull: the pod is predicted to meet the SLO but is at capacity:
	// the request would take it past its profiled capacity (pending load
	// above 1), or, while the model's queue is contended, prefill work
	// beyond the SLO's base time to first token is queued on it and the
	// request's own prefill there is not cheap (see the package
	// documentation).
	SLOFull SLOVerdict = "full"
)

// ProfileSource gives the GPU profile of a model on a deployment, nil when
// there is none; *cache.Profiles implements it.
type ProfileSource interface {
	Lookup(model, deployment string) *cache.ModelGPUProfile
}

// SLOError reports a request that no candidate pod is predicted to serve
// within its SLO. It wraps cache.ErrLoadCapacityReached when a pod could
// once its queue drains (the request may wait), cache.ErrSLOFailureRequest
// when none could even idle.
type SLOError struct {
	// Model is the requested model.
	Model string
	// Unmeetable reports that no pod could meet the SLO even with nothing
	// queued on it.
	Unmeetable bool
	// Slack is how much longer the request can wait and still meet its
	// SLO on the pod best placed once that pod's queue has drained; 0
	// when Unmeetable.
	Slack time.Duration
	// Drain is the least prefill work queued on a candidate pod: about
	// when one of them could take the request.
	Drain time.Duration
}

func (e *SLOError) Error() string {
	if e.Unmeetable {
		return fmt.Sprintf("no pod of model %q can serve the request within its SLO", e.Model)
	}
	return fmt.Sprintf("no pod of model %q can serve the request within its SLO now (slack %v, queues drain in %v)",
		e.Model, e.Slack.Round(time.Millisecond), e.Drain.Round(time.Millisecond))
}

// Unwrap returns cache.ErrSLOFailureRequest or cache.ErrLoadCapacityReached.
func (e *SLOError) Unwrap() error {
	if e.Unmeetable {
		return cache.ErrSLOFailureRequest
	}
	return cache.ErrLoadCapacityReached
}

// cheapPrefillShare is the share of an SLO's base time to first token up
// to which a request's own prefill on a pod is cheap: while the model's
// queue is contended, a long prefill queue does not make the pod full for
// it (see the package documentation).
const cheapPrefillShare = 0.1

// sloAware is the SLO-aware family (see the package documentation): it
// predicts each candidate's time to first token as kv-aware does, and its
// inter-token and end-to-end latency from the pod's measured inter-token
// latency, its GPU profile and the predicted output length, and chooses
// among the pods predicted to meet the request's SLO within the capacity
// their profiles allow: kv-aware's own choice when it is one of them, else
// kv-aware's choice among them (least load), or the pod whose SLO budget is
// the most used (pack load). A request without an SLO is routed as kv-aware
// routes it.
type sloAware struct {
	tolerance float64
	pack      bool
	// minQueue is Config.MinFleetQueue.
	minQueue float64

	profiles ProfileSource
	// defaultSpeed is Config.DefaultPrefillTokensPerSecond.
	defaultSpeed float64
}

func (sloAware) needs() needs { return needRunning | needQueue | needMatch }

func (a sloAware) pick(in input) {
	d := in.d
	bestCached := predictTTFT(in, a.minQueue)
	if in.slo.IsZero() {
		if d.chosen = chooseKVAware(in, nil, a.tolerance); d.chosen >= 0 {
			d.Outcome = prefixOutcome(in, bestCached)
		}
		return
	}
	// Whether waiting can help is judged optimistically, at the fastest
	// prefill speed measured or configured: a speed measured low on the
	// first few prefills must not refuse a request a pod can serve.
	fastest := a.defaultSpeed
	for i := range d.Candidates {
		if c := &d.Candidates[i]; in.considers(c) {
			fastest = max(fastest, c.PrefillTokensPerSecond)
		}
	}
	bestBudget := math.Inf(1)
	best := -1
	for i := range d.Candidates {
		c := &d.Candidates[i]
		idle := a.judge(in, c, fastest)
		if in.considers(c) && idle < bestBudget {
			bestBudget, best = idle, i
		}
	}
	meets := func(c *Candidate) bool { return c.SLOVerdict == SLOMeets }
	switch {
	case a.pack && in.sloContended:
		d.chosen = choose(in, meets, func(c *Candidate) float64 { return -c.SLOBudget }, 0, nil)
	default:
		// kv-aware's own choice, when it meets the objective: below
		// capacity the family then decides exactly as kv-aware does, ties
		// included.
		if d.chosen = chooseKVAware(in, nil, a.tolerance); d.chosen < 0 || !meets(&d.Candidates[d.chosen]) {
			d.chosen = chooseKVAware(in, meets, a.tolerance)
		}
	}
	if d.chosen >= 0 {
		d.Outcome = prefixOutcome(in, bestCached)
		return
	}
	d.Outcome = OutcomeSLOWait
	e := &SLOError{Model: in.model, Drain: time.Duration(math.MaxInt64)}
	for i := range d.Candidates {
		if c := &d.Candidates[i]; in.considers(c) {
			e.Drain = min(e.Drain, seconds(c.QueueSeconds))
		}
	}
	if best < 0 || bestBudget > 1+a.tolerance {
		d.Outcome, e.Unmeetable, e.Drain = OutcomeSLOUnmeetable, true, 0
	} else {
		e.Slack = a.slack(in, &d.Candidates[best], fastest)
	}
	d.sloErr = e
}

// judge sets c's predicted inter-token and end-to-end latency, SLO budget
// and verdict, and returns the budget the request would use on c if c had
// nothing queued and prefilled at speed fastest. The budget is the largest
// share of a target the prediction uses: at most 1 meets the SLO, and so
// does a prediction within the tie tolerance of it, as kv-aware holds
// predictions within it equal.
func (a sloAware) judge(in input, c *Candidate, fastest float64) (idleBudget float64) {
	c.PredictedTPOTSeconds = c.AvgTPOTSeconds
	c.PendingLoad = c.load.PendingLoad()
	var consumption float64
	capacityOK := true
	if prof := a.profile(in, c); prof != nil {
		if pt, err := prof.Point(in.outputTokens, in.d.PromptTokens); err == nil {
			c.PredictedTPOTSeconds = max(c.PredictedTPOTSeconds, pt.TPOTSeconds)
			if consumption, err = pt.PendingLoad(); err == nil {
				capacityOK = c.PendingLoad+consumption <= 1
			} else {
				capacityOK = false
			}
		}
	}
	if base := in.slo.TTFT.Seconds(); base > 0 && in.sloContended && c.QueueSeconds > base &&
		c.uncached/c.PrefillTokensPerSecond > cheapPrefillShare*base {
		capacityOK = false
	}
	decode := c.PredictedTPOTSeconds * float64(max(in.outputTokens-1, 0))
	c.PredictedE2ESeconds = c.PredictedTTFTSeconds + decode
	c.SLOBudget = in.budget(c.PredictedTTFTSeconds, c.PredictedTPOTSeconds, c.PredictedE2ESeconds)
	switch {
	case c.SLOBudget > 1+a.tolerance:
		c.SLOVerdict = SLOMisses
	case !capacityOK:
		c.SLOVerdict = SLOFull
	default:
		c.SLOVerdict = SLOMeets
	}
	if consumption > 1 {
		return math.Inf(1)
	}
	idleTTFT := idleTTFT(c, fastest)
	return in.budget(idleTTFT, c.PredictedTPOTSeconds, idleTTFT+decode)
}

// idleTTFT predicts c's time to first token with nothing queued, prefilling
// at speed.
func idleTTFT(c *Candidate, speed float64) float64 {
	return c.uncached/max(speed, c.PrefillTokensPerSecond) + c.AvgTPOTSeconds
}

// slack returns how much longer the request can wait and still meet its
// time targets on c once c's queue has drained, prefilling at speed
// fastest.
func (a sloAware) slack(in input, c *Candidate, fastest float64) time.Duration {
	idle := idleTTFT(c, fastest)
	s := math.Inf(1)
	if t := in.ttftTarget(); t > 0 {
		s = min(s, t-in.elapsed-idle)
	}
	if t := in.slo.E2E.Seconds(); t > 0 {
		s = min(s, t-in.elapsed-idle-(c.PredictedE2ESeconds-c.PredictedTTFTSeconds))
	}
	if math.IsInf(s, 1) {
		return time.Duration(math.MaxInt64)
	}
	return seconds(max(s, 0))
}

// profile returns c's GPU profile for the request's model, nil without
// one.
func (a sloAware) profile(in input, c *Candidate) *cache.ModelGPUProfile {
	if a.profiles == nil || c.ep.Deployment == "" {
		return nil
	}
	return a.profiles.Lookup(in.model, c.ep.Deployment)
}

// ttftTarget returns the request's time-to-first-token target in seconds,
// 0 for none.
func (in input) ttftTarget() float64 {
	return in.slo.TTFTFor(in.d.PromptTokens).Seconds()
}

// budget returns the largest share of an SLO target that predictions of
// the time to first token, the inter-token latency and the end-to-end
// latency use, the time the request has waited counting against the time
// targets; 0 when the SLO sets no target.
func (in input) budget(ttft, tpot, e2e float64) float64 {
	b := 0.0
	if t := in.ttftTarget(); t > 0 {
		b = max(b, (in.elapsed+ttft)/t)
	}
	if t := in.slo.TPOT.Seconds(); t > 0 {
		b = max(b, tpot/t)
	}
	if t := in.slo.E2E.Seconds(); t > 0 {
		b = max(b, (in.elapsed+e2e)/t)
	}
	return b
}

func seconds(s float64) time.Duration {
	if s >= math.MaxInt64/float64(time.Second) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}
