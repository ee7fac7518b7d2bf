package routing

// kvAware chooses the pod with the lowest predicted time to first token;
// the package documentation derives the prediction. Predictions within the
// tie tolerance of the lowest are equal, and go to the fewest running
// requests, then at random.
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
	prompt := float64(d.PromptTokens)
	bestCached := 0.0
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
