package testsupport

import (
	"sync"
	"time"
)

// Clock is a clock a test moves by hand, for code that reads the time
// through a func() time.Time (pass c.Now) so that timeouts, expiries and
// sweeps can be tested without waiting. Now returns the start time plus
// every Advance since; nothing moves it otherwise. A Clock is safe for
// concurrent use; the zero Clock starts at the zero time.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock that reads start until it is advanced.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (backward when d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
