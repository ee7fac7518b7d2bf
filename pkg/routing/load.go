package routing

// randomChoice draws a candidate uniformly at random.
type randomChoice struct{}

func (randomChoice) needs() needs { return 0 }

func (randomChoice) pick(in input) {
	in.d.chosen = in.rng.IntN(len(in.d.Candidates))
	in.d.Outcome = OutcomeRandom
}

// leastRequest chooses the pod with the fewest requests in flight from the
// gateway (cache.RealtimeNumRequestsRunning), ties at random. The gateway's
// own count moves the moment a request is routed, where the engine's scraped
// count lags by a scrape.
type leastRequest struct{}

func (leastRequest) needs() needs { return needRunning }

func (leastRequest) pick(in input) {
	for i := range in.d.Candidates {
		in.d.Candidates[i].Score = in.d.Candidates[i].Running
	}
	in.d.chosen = leastRunning(in)
	in.d.Outcome = OutcomeLoad
}

// leastKVCache chooses the pod with the lowest KV-cache usage
// (cache.KVCacheUsagePerc), ties by running requests. Pods whose usage has
// not been scraped yet are chosen only when no pod's has.
type leastKVCache struct{}

func (leastKVCache) needs() needs { return needRunning | needKVCache }

func (leastKVCache) pick(in input) {
	cs := in.d.Candidates
	for i := range cs {
		cs[i].Score = cs[i].KVCacheUsage
	}
	in.d.chosen = choose(in, func(c *Candidate) bool { return c.measured&hasKVCache != 0 }, byScore, 0, nil)
	if in.d.chosen < 0 {
		in.d.chosen = choose(in, nil, byScore, 0, nil)
	}
	in.d.Outcome = OutcomeLoad
}

// leastLatency chooses the pod with the lowest expected latency for the
// request: the pod's recent mean time to first token plus its mean
// inter-token latency times the predicted output tokens (one token when
// none is predicted), scaled by the requests in flight on the pod against
// the candidates' mean, (1 + running) / (1 + mean running). Both means come
// from the engine's own histograms over the Store's recent window, so they
// reflect the pod's current batch rather than the mix of request lengths
// that skews a mean end-to-end latency. But they lag by the window: a pod
// that was idle keeps its low means for seconds after the gateway starts
// sending it requests, and choosing the lowest mean alone would send it
// every request meanwhile (and, once its means catch up, send every request
// to the next). The gateway's own count of requests in flight moves with
// each request it routes; at a given throughput a pod's latency grows with
// the requests in it (Little's law), so the count stands in for the load the
// means have not measured yet. A pod without a measured TTFT is scored at
// the median of the measured ones, so that a new pod is neither flooded nor
// starved; a pod with no request in flight is scored at most at that
// median, since its means are those of the last requests it served, kept
// through windows that measure nothing, and the mean of a few long prompts
// would keep it from every request until it served again (it gets one,
// which measures it again, and its own means count once that request is in
// flight). A pod's mean TTFT measured while it was idle can be many times
// the busy pods' lower, so that scaling by the count alone sends it
// hundreds of requests before its means catch up; the prefill work the
// gateway has queued on the pod (Candidate.QueueSeconds), which its next
// first token waits for, is therefore a floor on its expected TTFT. Ties
// go by running requests.
type leastLatency struct{}

func (leastLatency) needs() needs { return needRunning | needQueue | needLatency }

func (leastLatency) pick(in input) {
	cs := in.d.Candidates
	tokens := float64(max(in.outputTokens, 1))
	measured := in.s.scores[:0]
	meanRunning := 0.0
	for i := range cs {
		c := &cs[i]
		c.Score = c.AvgTTFTSeconds + c.AvgTPOTSeconds*tokens
		if c.measured&hasTTFT != 0 && in.considers(c) {
			measured = append(measured, c.Score)
		}
		meanRunning += c.Running / float64(len(cs))
	}
	in.s.scores = measured
	if len(measured) > 0 {
		m := median(measured)
		for i := range cs {
			c := &cs[i]
			if c.measured&hasTTFT == 0 {
				c.Score = m
			} else if c.Running == 0 {
				c.Score = min(c.Score, m)
			}
		}
	}
	for i := range cs {
		c := &cs[i]
		c.Score = max(c.Score, c.QueueSeconds+c.AvgTPOTSeconds*tokens) * (1 + c.Running) / (1 + meanRunning)
	}
	in.d.chosen = choose(in, nil, byScore, 0, nil)
	in.d.Outcome = OutcomeLoad
}
