package budget

import (
	"sync"
	"testing"
)

func TestTakeRefusesWhatWouldPassTheLimit(t *testing.T) {
	b := New(10)
	if !b.Take(6) || !b.Take(4) || b.Take(1) || b.Held() != 10 {
		t.Fatalf("held %d after taking 6 and 4 of 10, then 1 more", b.Held())
	}
	b.Give(4)
	if b.Take(5) || !b.Take(4) || b.Held() != 10 {
		t.Fatalf("held %d after giving 4 back and taking 5, then 4", b.Held())
	}
	var zero Budget
	if zero.Take(1) || !zero.Take(0) {
		t.Error("the zero Budget takes a unit, or refuses none")
	}
}

func TestConcurrentTakesNeverPassTheLimit(t *testing.T) {
	const limit, goroutines, rounds = 8, 16, 2000
	b := New(limit)
	var wg sync.WaitGroup
	var mu sync.Mutex
	over := int64(0)
	for range goroutines {
		wg.Go(func() {
			for range rounds {
				if !b.Take(1) {
					continue
				}
				if h := b.Held(); h > limit {
					mu.Lock()
					over = max(over, h)
					mu.Unlock()
				}
				b.Give(1)
			}
		})
	}
	wg.Wait()
	if over != 0 || b.Held() != 0 {
		t.Errorf("held %d at most (limit %d), %d at the end", over, limit, b.Held())
	}
}
