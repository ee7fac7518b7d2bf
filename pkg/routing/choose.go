package routing

import (
	"math"

	"github.com/kvgate/kvgate/pkg/cache"
)

// choose returns the index of the candidate with the lowest key among those
// in considers and eligible admits (every one when eligible is nil), or -1
// when none is. Candidates whose key is within tolerance (relative to the
// lowest key) of the lowest are tied; ties go to the lowest tie key (when
// tie is not nil), then to the pod with the fewest running requests, then
// to one drawn at random.
func choose(in input, eligible func(*Candidate) bool, key func(*Candidate) float64, tolerance float64,
	tie func(*Candidate) float64) int {
	cs := in.d.Candidates
	ok := func(i int) bool { return in.considers(&cs[i]) && (eligible == nil || eligible(&cs[i])) }
	lo := math.Inf(1)
	for i := range cs {
		// A comparison, unlike min, never lets a NaN key win.
		if k := key(&cs[i]); ok(i) && k < lo {
			lo = k
		}
	}
	if math.IsInf(lo, 1) {
		return -1
	}
	limit := lo + tolerance*math.Abs(lo)
	tied := func(i int) bool { return ok(i) && key(&cs[i]) <= limit }
	if tie != nil {
		least := math.Inf(1)
		for i := range cs {
			if tied(i) {
				least = min(least, tie(&cs[i]))
			}
		}
		inWindow := tied
		tied = func(i int) bool { return inWindow(i) && tie(&cs[i]) == least }
	}
	fewest := math.Inf(1)
	for i := range cs {
		if tied(i) && cs[i].Running < fewest {
			fewest = cs[i].Running
		}
	}
	chosen, n := -1, 0
	for i := range cs {
		if !tied(i) || cs[i].Running != fewest {
			continue
		}
		// Reservoir sampling: the n-th tie replaces the choice with
		// probability 1/n, so that every tie is equally likely.
		if n++; n == 1 || in.rng.IntN(n) == 0 {
			chosen = i
		}
	}
	return chosen
}

// considers reports whether a load algorithm may choose c: any candidate,
// unless some have current metrics and others do not, which are then left
// out (see the package documentation).
func (in input) considers(c *Candidate) bool {
	return !in.freshOnly || c.Scrape == cache.ScrapeFresh
}

func byScore(c *Candidate) float64   { return c.Score }
func byRunning(c *Candidate) float64 { return c.Running }

// leastRunning chooses the candidate with the fewest running requests,
// ties at random: least-request's rule, which the prefix algorithms fall
// back to.
func leastRunning(in input) int { return choose(in, nil, byRunning, 0, nil) }
