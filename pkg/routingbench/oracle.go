package routingbench

import (
	"github.com/kvgate/kvgate/pkg/inflight"
	"math/rand/v2"
	"time"
)

// oracle is the TTFT oracle: it routes each request to the engine on which
// it would get its first token soonest, computed from the engines
// themselves rather than from what a gateway can observe; the package
// documentation lists what it knows.
type oracle struct {
	f   *fleet
	rng *rand.Rand
}

func newOracle(f *fleet, seed uint64) *oracle {
	return &oracle{f: f, rng: rand.New(policySeed(seed, TTFTOracle))}
}

// route picks the engine with the lowest predicted time to first token;
// exact ties go to the fewest requests in flight, then at random.
func (o *oracle) route(_ int, r *Request) (int, error) {
	chosen, ties := -1, 0
	var best time.Duration
	for i, e := range o.f.engines {
		t := o.predict(e, r.Prompt)
		switch {
		case chosen < 0 || t < best || (t == best && e.inFlight < o.f.engines[chosen].inFlight):
			chosen, best, ties = i, t, 1
		case t == best && e.inFlight == o.f.engines[chosen].inFlight:
			// Reservoir sampling keeps every tie equally likely.
			if ties++; o.rng.IntN(ties) == 0 {
				chosen = i
			}
		}
	}
	return chosen, nil
}

// predict returns the time from now to the first token of a request with
// prompt on engine e, if no other request arrived: the rest of the step in
// flight, then steps that prefill the engine's backlog and the prompt's
// uncached tokens within the token budget left by the decoding requests,
// priced by the engine's own latency model (attention to cached prefixes
// and the decoding batch's context included, at the engine's speed).
func (o *oracle) predict(e *engine, prompt []uint32) time.Duration {
	cfg := e.eng.Config()
	hit := min(e.eng.CachedPrefixBlocks(prompt, nil), (len(prompt)-1)/cfg.BlockSize) * cfg.BlockSize
	b := e.eng.Backlog()
	prefill, decoding := e.eng.BacklogCost()
	work := b.PrefillTokens + len(prompt) - hit
	perStep := max(cfg.MaxNumBatchedTokens-b.Decoding, 1)
	steps := (work + perStep - 1) / perStep
	var wait time.Duration
	if e.busy {
		wait = e.stepEnd - o.f.now
	}
	lat := cfg.Latency
	return wait + time.Duration(steps)*lat.Time(decoding) + prefill + lat.PrefillTime(hit, len(prompt))
}

func (*oracle) firstToken(int) error { return nil }

func (*oracle) ended(int, inflight.Usage) error { return nil }

func (*oracle) changed() error { return nil }

func (*oracle) holding() bool { return false }
