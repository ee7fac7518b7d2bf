package routing

// kvAware chooses the pod with the lowest predicted time to first token;
// the package documentation derives the prediction. Predictions within the
// tie tolerance of the lowest are equal, and go to the pod with the least
// prefill work, then the fewest running requests, then at random.
type kvAware struct {
	tolerance float64
}

func (kvAware) needs() needs { return needRunning | needQueue | needMatch }

func (a kvAware) pick(in input) {
	bestCached := predictTTFT(in)
	in.d.chosen = chooseTTFT(in, nil, a.tolerance)
	in.d.Outcome = prefixOutcome(in, bestCached)
}

// predictTTFT sets every candidate's queue, predicted time to first token
// and score (that prediction), and returns the longest cached prefix, in
// tokens, of a candidate the choice considers.
func predictTTFT(in input) (bestCached float64) {
	d := in.d
	cs := d.Candidates
	// perRequest estimates the prefill tokens of a request waiting in an
	// engine's queue.
	perRequest := in.meanUncached
	if perRequest <= 0 {
		perRequest = float64(d.PromptTokens)
	}
	prompt := float64(d.PromptTokens)
	for i := range cs {
		c := &cs[i]
		speed := c.PrefillTokensPerSecond
		waiting := max(c.Waiting-float64(c.WaitingEnded), 0)
		c.QueueSeconds = max(c.QueueSeconds, waiting*perRequest/speed)
		c.PredictedTTFTSeconds = c.QueueSeconds + c.uncached/speed + c.AvgTPOTSeconds
		c.Score = c.PredictedTTFTSeconds
		if in.considers(c) {
			bestCached = max(bestCached, prompt-c.uncached)
		}
	}
	return bestCached
}

// chooseTTFT chooses, among the candidates eligible admits, the one with
// the lowest predicted time to first token, predictions within tolerance
// of the lowest being equal; see kvAware for the ties.
func chooseTTFT(in input, eligible func(*Candidate) bool, tolerance float64) int {
	return choose(in, eligible, func(c *Candidate) float64 { return c.PredictedTTFTSeconds }, tolerance, byUncached)
}

func byUncached(c *Candidate) float64 { return c.uncached }

// prefixOutcome says what decided a prefix-aware choice, given the longest
// cached prefix of a considered candidate.
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
