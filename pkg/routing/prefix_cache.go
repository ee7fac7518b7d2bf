package routing

import "math"

// prefixCache is AIBrix's prefix-cache algorithm on the sync prefix index,
// with running requests counted by the gateway
// (cache.RealtimeNumRequestsRunning):
//
//  1. Imbalance guard: when the most and least loaded candidates differ by
//     more than the configured absolute count, the request goes to the
//     least loaded pod, whatever the pods hold.
//  2. Otherwise each pod is scored by the share of the prompt it holds,
//     GPU-resident tokens counting fully and tokens held only in CPU or
//     storage tiers counting by the CPU cache weight. Among the pods that
//     hold some of it and run no more than mean + factor x standard
//     deviation of the candidates' running requests, the highest share
//     wins, ties going to the fewer running requests, then at random.
//  3. When no pod qualifies, or the request has no tokens, the request goes
//     to the pod with the fewest running requests.
//
// These rules leave a pod that holds nothing of the prompts idle as long as
// some pod holds some of each prompt and the loads stay within both limits:
// when every prompt opens alike (a shared system prompt), every request
// matches somewhere, and a pod that missed the first requests may get none
// for as long as the load stays low, however many pods sit idle beside the
// busy ones. AIBrix behaves so, and so does this algorithm; kv-aware
// weighs the idle pods' queues instead.
type prefixCache struct {
	absCount, factor, cpuWeight float64
}

func (prefixCache) needs() needs { return needRunning | needMatch }

func (a prefixCache) pick(in input) {
	d := in.d
	cs := d.Candidates
	lo, hi := math.Inf(1), math.Inf(-1)
	var n, sum, sumSq float64
	for i := range cs {
		if !in.considers(&cs[i]) {
			continue
		}
		r := cs[i].Running
		lo, hi = min(lo, r), max(hi, r)
		n++
		sum += r
		sumSq += r * r
	}
	switch {
	case hi-lo > a.absCount:
		d.chosen, d.Outcome = leastRunning(in), OutcomeImbalanceGuard
		return
	case !in.hasTokens:
		d.chosen, d.Outcome = leastRunning(in), OutcomeNoTokens
		return
	}
	mean := sum / n
	d.LoadLimit = mean + a.factor*math.Sqrt(max(sumSq/n-mean*mean, 0))

	best := 0.0
	for i := range cs {
		c := &cs[i]
		offGPU := float64(c.MatchedTokens - c.MatchedGPUTokens)
		c.Score = (float64(c.MatchedGPUTokens) + a.cpuWeight*offGPU) / float64(d.PromptTokens)
		if in.considers(c) {
			best = max(best, c.Score)
		}
	}
	if best == 0 {
		d.chosen, d.Outcome = leastRunning(in), OutcomeLoadFallback
		return
	}
	eligible := func(c *Candidate) bool { return c.Score > 0 && c.Running <= d.LoadLimit }
	d.chosen = choose(in, eligible, func(c *Candidate) float64 { return -c.Score }, 0, nil)
	switch {
	case d.chosen < 0:
		d.chosen, d.Outcome = leastRunning(in), OutcomeLoadOverPrefix
	case cs[d.chosen].Score < best:
		d.Outcome = OutcomeLoadOverPrefix
	default:
		d.Outcome = OutcomePrefixHit
	}
}
