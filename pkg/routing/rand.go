package routing

import (
	"math/rand/v2"
	"sync"
)

// lockedRand serializes a random source shared by concurrent decisions.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLockedRand(src rand.Source) *lockedRand {
	return &lockedRand{r: rand.New(src)}
}

// IntN returns a uniform integer in [0, n).
func (l *lockedRand) IntN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}
