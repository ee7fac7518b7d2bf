package routing

import "math"

// kvAware chooses the pod where the request costs least: its predicted time
// to first token plus the delay its prefill causes the other requests, the
// ones decoding on the pod and, when every pod has prefills queued, those
// queued across the fleet. The package documentation derives both.
// Costs within the tie tolerance of the lowest are equal, and go to the
// fewest running requests, then at random.
type kvAware struct {
	tolerance float64
}

func (kvAware) needs() needs { return needRunning | needQueue | needMatch }

func (a kvAware) pick(in input) {
	d := in.d
	cs := d.Candidates
	// perRequest estimates the prefill tokens of a request waiting in an
	// engine's queue.
	perRequest := in.meanUncached
	if perRequest <= 0 {
		perRequest = float64(d.PromptTokens)
	}
	// congestion counts the prefills queued on the least queued candidate,
	// and fleetSpeed is the candidates' mean prefill speed: the fleet's
	// backlog grows by a prefill's tokens wherever it runs, and drains at
	// the fleet's speed.
	congestion, fleetSpeed := math.Inf(1), 0.0
	for i := range cs {
		if in.considers(&cs[i]) {
			congestion = min(congestion, float64(cs[i].InFlightPrefills))
		}
		fleetSpeed += cs[i].PrefillTokensPerSecond / float64(len(cs))
	}
	prompt := float64(d.PromptTokens)
	bestCached := 0.0
	for i := range cs {
		c := &cs[i]
		speed := c.PrefillTokensPerSecond
		waiting := max(c.Waiting-float64(c.WaitingEnded), 0)
		c.QueueSeconds = max(c.QueueSeconds, waiting*perRequest/speed)
		prefill := c.uncached / speed
		c.PredictedTTFTSeconds = c.QueueSeconds + prefill + c.AvgTPOTSeconds
		c.Decoding = max(c.Running-float64(c.InFlightPrefills), 0)
		c.Score = c.PredictedTTFTSeconds + prefill*c.Decoding + c.uncached/fleetSpeed*congestion
		if in.considers(c) {
			bestCached = max(bestCached, prompt-c.uncached)
		}
	}
	d.chosen = choose(in, nil, byScore, a.tolerance)
	switch {
	case !in.hasTokens:
		d.Outcome = OutcomeNoTokens
	case bestCached == 0:
		d.Outcome = OutcomeLoadFallback
	case prompt-cs[d.chosen].uncached < bestCached:
		d.Outcome = OutcomeLoadOverPrefix
	default:
		d.Outcome = OutcomePrefixHit
	}
}
