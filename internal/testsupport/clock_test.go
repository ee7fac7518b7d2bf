package testsupport

import (
	"sync"
	"testing"
	"time"
)

func TestClockMovesOnlyWhenAdvanced(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	c := NewClock(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now = %v, want the start %v", got, start)
	}
	c.Advance(90 * time.Second)
	c.Advance(-30 * time.Second)
	if got, want := c.Now(), start.Add(time.Minute); !got.Equal(want) {
		t.Fatalf("Now after +90s and -30s = %v, want %v", got, want)
	}
	var zero Clock
	if !zero.Now().IsZero() {
		t.Fatalf("zero Clock reads %v, want the zero time", zero.Now())
	}
}

func TestClockIsSafeForConcurrentUse(t *testing.T) {
	c := NewClock(time.Unix(0, 0))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), time.Unix(0, 0).Add(400*time.Millisecond); !got.Equal(want) {
		t.Fatalf("Now = %v, want %v after 400 advances of 1ms", got, want)
	}
}
