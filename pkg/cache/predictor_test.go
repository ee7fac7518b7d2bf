package cache

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
)

func seeded(seed uint64) PredictorOption { return WithRandSource(rand.NewPCG(seed, 42)) }

func TestPredictDrawsOutputsWeightedByHistory(t *testing.T) {
	p := NewSimpleOutputPredictor(8192, 8192, time.Minute, seeded(1))
	p.AddTrace(1000, 32, 70)
	p.AddTrace(1000, 256, 30)
	p.AddTrace(10, 4000, 50) // another input bucket: must not leak into 1000's
	const n = 20000
	counts := map[int]int{}
	for range n {
		counts[p.Predict(1000)]++
	}
	if len(counts) != 2 {
		t.Fatalf("predictions %v, want only 32 and 256", counts)
	}
	if share := float64(counts[32]) / n; share < 0.68 || share > 0.72 {
		t.Fatalf("32 predicted %.3f of the time, want 0.70±0.02 (%v)", share, counts)
	}
	// Inputs that round to the same log2 bucket share the history.
	if got := p.Predict(1100); got != 32 && got != 256 {
		t.Fatalf("Predict(1100) = %d, want a prediction from the 1000-token bucket", got)
	}
}

func TestPredictionsRepeatWithTheSameSeed(t *testing.T) {
	a := NewSimpleOutputPredictor(8192, 8192, time.Minute, seeded(7))
	b := NewSimpleOutputPredictor(8192, 8192, time.Minute, seeded(7))
	for _, p := range []*SimpleOutputPredictor{a, b} {
		for out := 1; out <= 4096; out *= 2 {
			p.AddTrace(500, out, int32(out%7+1))
		}
	}
	for i := range 1000 {
		if x, y := a.Predict(500), b.Predict(500); x != y {
			t.Fatalf("draw %d: %d and %d from the same seed", i, x, y)
		}
	}
}

func TestColdPredictionStrategies(t *testing.T) {
	tests := []struct {
		strategy ColdPredictionStrategy
		check    func(got int) bool
		want     string
	}{
		{OptimisticColdPrediction, func(got int) bool { return got == 1 }, "1"},
		{RandomColdPrediction, func(got int) bool { return got >= 1 && got <= 2000 }, "in [1, 2000]"},
		{InputColdPrediction, func(got int) bool { return got == 300 }, "the input, 300"},
		{PessimisticColdPrediction, func(got int) bool { return got == 2000 }, "the maximum, 2000"},
	}
	for _, tt := range tests {
		p := NewSimpleOutputPredictor(4096, 2000, time.Minute, WithColdPrediction(tt.strategy), seeded(3))
		p.AddTrace(8, 8, 5) // history elsewhere does not count
		for range 50 {
			if got := p.Predict(300); !tt.check(got) {
				t.Fatalf("strategy %d predicted %d, want %s", tt.strategy, got, tt.want)
			}
		}
	}
	if got := NewSimpleOutputPredictor(10, 10, time.Second).Predict(5); got != 1 {
		t.Fatalf("default strategy predicted %d, want 1 (optimistic)", got)
	}
}

func TestHistoryExpiresWithTheWindow(t *testing.T) {
	clock := testsupport.NewClock(time.Unix(1000, 0))
	p := NewSimpleOutputPredictor(8192, 8192, 30*time.Second, WithClock(clock.Now), seeded(5))
	p.AddTrace(100, 16, 10)
	clock.Advance(20 * time.Second)
	p.AddTrace(100, 512, 10)
	clock.Advance(5 * time.Second)
	seen := map[int]bool{}
	for range 500 {
		seen[p.Predict(100)] = true
	}
	if !seen[16] || !seen[512] {
		t.Fatalf("within the window predictions were %v, want both 16 and 512", seen)
	}
	clock.Advance(10 * time.Second) // the first traces are 35 s old now
	for range 500 {
		if got := p.Predict(100); got != 512 {
			t.Fatalf("after the first traces expired: Predict = %d, want 512", got)
		}
	}
	clock.Advance(time.Hour)
	if got := p.Predict(100); got != 1 {
		t.Fatalf("after everything expired: Predict = %d, want the cold prediction 1", got)
	}
}

func TestTracesWithPastTimestamps(t *testing.T) {
	clock := testsupport.NewClock(time.Unix(1000, 0))
	p := NewSimpleOutputPredictor(8192, 8192, 30*time.Second, WithClock(clock.Now), seeded(5))
	clock.Advance(25 * time.Second)
	p.AddTraceWithTimestamp(100, 64, 1, clock.Now().Add(-15*time.Second)) // late but inside the window
	p.AddTraceWithTimestamp(100, 2048, 1, clock.Now().Add(-time.Hour))    // older than the window
	p.AddTraceWithTimestamp(100, 2048, 0, clock.Now())                    // no requests
	for range 200 {
		if got := p.Predict(100); got != 64 {
			t.Fatalf("Predict = %d, want 64 only", got)
		}
	}
	clock.Advance(20 * time.Second) // the late trace is now 35 s old
	if got := p.Predict(100); got != 1 {
		t.Fatalf("late trace outlived the window: Predict = %d", got)
	}
}

func TestPredictionsStayWithinTheMaximum(t *testing.T) {
	p := NewSimpleOutputPredictor(1000, 1000, time.Minute, seeded(9))
	p.AddTrace(1_000_000, 1_000_000, 3) // beyond both maxima: top buckets
	if got := p.Predict(5000); got != 1000 {
		t.Fatalf("Predict = %d, want the maximum 1000 (top bucket is 2^10)", got)
	}
}

func TestPredictorIsSafeForConcurrentUse(t *testing.T) {
	p := NewSimpleOutputPredictor(8192, 8192, time.Minute)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				if w%2 == 0 {
					p.AddTrace(100+i, 1+i%500, 1)
				} else if got := p.Predict(100 + i); got < 1 || got > 8192 {
					t.Errorf("Predict = %d", got)
				}
			}
		}()
	}
	wg.Wait()
}

func TestNewSimpleOutputPredictorRejectsNonPositiveArguments(t *testing.T) {
	for _, args := range [][3]int{{0, 10, 1}, {10, -1, 1}, {10, 10, 0}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewSimpleOutputPredictor%v did not panic", args)
				}
			}()
			NewSimpleOutputPredictor(args[0], args[1], time.Duration(args[2])*time.Second)
		}()
	}
}

func BenchmarkPredict(b *testing.B) {
	p := NewSimpleOutputPredictor(DefaultPredictorMaxTokens, DefaultPredictorMaxTokens, DefaultPredictorWindow, seeded(1))
	for out := 1; out < 1<<16; out *= 2 {
		p.AddTrace(2000, out, 10)
	}
	b.ReportAllocs()
	for b.Loop() {
		p.Predict(2000)
	}
}

func BenchmarkAddTrace(b *testing.B) {
	p := NewSimpleOutputPredictor(DefaultPredictorMaxTokens, DefaultPredictorMaxTokens, DefaultPredictorWindow)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p.AddTrace(1000+i%5000, 1+i%3000, 1)
	}
}

func TestPredictDrawsFromRemoteHistoryToo(t *testing.T) {
	local := NewSimpleOutputPredictor(8192, 8192, time.Minute, seeded(1))
	other := NewSimpleOutputPredictor(8192, 8192, time.Minute, seeded(2))
	other.AddTrace(1000, 4096, 10)
	if err := local.SetRemoteHistogram(other.Histogram()); err != nil {
		t.Fatal(err)
	}
	if got := local.Predict(1000); got != 4096 {
		t.Fatalf("Predict(1000) = %d with only remote history of 4096-token outputs", got)
	}
	if h := local.Histogram(); slices.ContainsFunc(h, func(n int32) bool { return n != 0 }) {
		t.Fatal("the remote history shows in the predictor's own")
	}
	local.AddTrace(1000, 16, 10)
	seen := map[int]bool{}
	for range 200 {
		seen[local.Predict(1000)] = true
	}
	if !seen[16] || !seen[4096] || len(seen) != 2 {
		t.Fatalf("predictions %v, want both 16 (own) and 4096 (remote)", seen)
	}
	if err := local.SetRemoteHistogram(nil); err != nil {
		t.Fatal(err)
	}
	if got := local.Predict(1000); got != 16 {
		t.Fatalf("Predict(1000) = %d after clearing the remote history", got)
	}
	for _, bad := range [][]int32{{1, 2}, append(make([]int32, len(other.Histogram())-1), -1)} {
		if err := local.SetRemoteHistogram(bad); err == nil {
			t.Errorf("SetRemoteHistogram(%d counts) accepted", len(bad))
		}
	}
}
