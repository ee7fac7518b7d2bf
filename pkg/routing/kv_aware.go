package routing

import "math"

// kvAware chooses the pod where the request costs least: its predicted time
// to first token plus the delay its prefill causes the other requests, the
// ones decoding on the pod and those queued across the fleet (at least
// Config.MinFleetQueue on every pod). The package documentation derives
// both.
// Costs within the tie tolerance of the lowest are equal, and go to the pod
// with the least prefill work, then the fewest running requests, then at
// random.
type kvAware struct {
	tolerance float64
	// minQueue is Config.MinFleetQueue.
	minQueue float64
}

func (kvAware) needs() needs { return needRunning | needQueue | needMatch }

func (a kvAware) pick(in input) {
	bestCached := predictTTFT(in, a.minQueue)
	if in.d.chosen = chooseKVAware(in, nil, a.tolerance); in.d.chosen < 0 {
		return
	}
	in.d.Outcome = prefixOutcome(in, bestCached)
}

// predictTTFT sets every candidate's queue, predicted time to first token
// and score (kv-aware's cost: that prediction and the delay the prefill
// causes others, counting at least minQueue prefills queued on every pod),
// and returns the longest cached prefix, in tokens, of a candidate the
// choice considers.
func predictTTFT(in input, minQueue float64) (bestCached float64) {
	d := in.d
	cs := d.Candidates
	// perRequest estimates the prefill tokens of a request waiting in an
	// engine's queue.
	perRequest := in.meanUncached
	if perRequest <= 0 {
		perRequest = float64(d.PromptTokens)
	}
	// congestion counts the prefills queued on the least queued candidate,
	// at least minQueue, and fleetSpeed is the mean prefill speed of the
	// candidates it may choose: the fleet's backlog grows by a prefill's
	// tokens wherever it runs, and drains at the fleet's speed.
	congestion, fleetSpeed, considered := math.Inf(1), 0.0, 0
	for i := range cs {
		if in.considers(&cs[i]) {
			congestion = min(congestion, float64(cs[i].InFlightPrefills))
			considered++
		}
	}
	for i := range cs {
		if in.considers(&cs[i]) {
			fleetSpeed += cs[i].PrefillTokensPerSecond / float64(considered)
		}
	}
	congestion = max(congestion, minQueue)
	prompt := float64(d.PromptTokens)
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
	return bestCached
}

// chooseKVAware chooses, among the candidates eligible admits, the one of
// least cost (Score, as predictTTFT sets it), costs within tolerance of the
// lowest being equal; see kvAware for the ties.
func chooseKVAware(in input, eligible func(*Candidate) bool, tolerance float64) int {
	return choose(in, eligible, byScore, tolerance, byUncached)
}

func byUncached(c *Candidate) float64 { return c.uncached }

// prefixOutcome says what decided a prefix-aware choice, given the longest
// cached prefix of a considered candidate. A pod must have been chosen.
func prefixOutcome(in input, bestCached float64) Outcome {
	d := in.d
	switch {
	case !in.hasTokens:
		return OutcomeNoTokens
	case bestCached == 0:
		return OutcomeLoadFallback
	case float64(d.PromptTokens)-d.Candidates[d.chosen].uncached < bestCached:
		return OutcomeLoadOverPrefix
	}
	return OutcomePrefixHit
}
