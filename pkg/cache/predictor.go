package cache

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// MovingInterval is the granularity of SimpleOutputPredictor's sliding
// window: history expires in steps of this length.
const MovingInterval = 10 * time.Second

// ColdPredictionStrategy chooses what SimpleOutputPredictor predicts for an
// input size it has no history for.
type ColdPredictionStrategy int

const (
	// OptimisticColdPrediction predicts 1 output token, the shape most
	// profiles serve best.
	OptimisticColdPrediction ColdPredictionStrategy = iota
	// RandomColdPrediction predicts uniformly between 1 and the maximum
	// output tokens.
	RandomColdPrediction
	// InputColdPrediction predicts as many output tokens as input tokens.
	InputColdPrediction
	// PessimisticColdPrediction predicts the maximum output tokens.
	PessimisticColdPrediction
)

// DefaultColdPrediction is the strategy of a predictor built without
// WithColdPrediction.
const DefaultColdPrediction = OptimisticColdPrediction

// SimpleOutputPredictor predicts how many tokens a request will generate from
// the output lengths of recently completed requests of similar input length.
//
// It keeps, per input bucket round(log2(input tokens)), a histogram of
// output buckets round(log2(output tokens)) over a sliding window, and
// predicts by drawing an output bucket at random, weighted by the histogram;
// bucket b predicts 2^b tokens, at most the maximum. It is safe for
// concurrent use.
type SimpleOutputPredictor struct {
	mu         sync.Mutex
	inBuckets  int
	outBuckets int
	maxOutput  int
	cold       ColdPredictionStrategy
	rng        *rand.Rand
	now        func() time.Time

	// slots is a ring of per-MovingInterval histograms (inBuckets rows of
	// outBuckets), slots[head] covering [headStart, headStart+MovingInterval).
	slots     [][]int32
	head      int
	headStart time.Time
	// hist and sums total the live slots: per input and output bucket, and
	// per input bucket.
	hist []int32
	sums []int32
	// remote and remoteSums are the other gateway replicas' histogram and
	// its per input bucket totals (see SetRemoteHistogram), nil when none.
	remote     []int32
	remoteSums []int32
}

// PredictorOption configures a SimpleOutputPredictor.
type PredictorOption func(*SimpleOutputPredictor)

// WithColdPrediction sets the strategy for input sizes without history.
func WithColdPrediction(s ColdPredictionStrategy) PredictorOption {
	return func(p *SimpleOutputPredictor) { p.cold = s }
}

// WithRandSource makes predictions draw from src, so that a fixed seed
// gives a reproducible sequence.
func WithRandSource(src rand.Source) PredictorOption {
	return func(p *SimpleOutputPredictor) { p.rng = rand.New(src) }
}

// WithClock replaces time.Now as the predictor's clock.
func WithClock(now func() time.Time) PredictorOption {
	return func(p *SimpleOutputPredictor) { p.now = now }
}

// NewSimpleOutputPredictor returns a predictor for inputs of up to
// maxInputTokens and outputs of up to maxOutputTokens (longer ones share the
// top bucket) that remembers the last window of history, rounded up to a
// whole number of MovingInterval steps. It panics if a maximum or the window
// is not positive.
func NewSimpleOutputPredictor(maxInputTokens, maxOutputTokens int, window time.Duration, opts ...PredictorOption) *SimpleOutputPredictor {
	if maxInputTokens <= 0 || maxOutputTokens <= 0 || window <= 0 {
		panic(fmt.Sprintf("cache: NewSimpleOutputPredictor(%d, %d, %v): arguments must be positive", maxInputTokens, maxOutputTokens, window))
	}
	p := &SimpleOutputPredictor{
		inBuckets:  log2Bucket(maxInputTokens) + 1,
		outBuckets: log2Bucket(maxOutputTokens) + 1,
		maxOutput:  maxOutputTokens,
		cold:       DefaultColdPrediction,
		rng:        rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		now:        time.Now,
	}
	for _, o := range opts {
		o(p)
	}
	size := p.inBuckets * p.outBuckets
	p.slots = make([][]int32, int((window+MovingInterval-1)/MovingInterval))
	for i := range p.slots {
		p.slots[i] = make([]int32, size)
	}
	p.hist = make([]int32, size)
	p.sums = make([]int32, p.inBuckets)
	p.headStart = p.now()
	return p
}

// AddTrace records cnt completed requests with the given token counts, now.
func (p *SimpleOutputPredictor) AddTrace(inputTokens, outputTokens int, cnt int32) {
	p.AddTraceWithTimestamp(inputTokens, outputTokens, cnt, p.now())
}

// AddTraceWithTimestamp records cnt requests that completed at ts with the
// given token counts. A ts older than the window, or a cnt below 1, is
// ignored.
func (p *SimpleOutputPredictor) AddTraceWithTimestamp(inputTokens, outputTokens int, cnt int32, ts time.Time) {
	if cnt < 1 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.advanceLocked(ts)
	back := 0
	if age := p.headStart.Sub(ts); age > 0 {
		back = int((age-1)/MovingInterval) + 1
	}
	if back >= len(p.slots) {
		return
	}
	in := min(log2Bucket(inputTokens), p.inBuckets-1)
	i := in*p.outBuckets + min(log2Bucket(outputTokens), p.outBuckets-1)
	slot := (p.head - back + len(p.slots)) % len(p.slots)
	p.slots[slot][i] += cnt
	p.hist[i] += cnt
	p.sums[in] += cnt
}

// Predict returns the predicted output tokens of a request with inputTokens
// input tokens.
func (p *SimpleOutputPredictor) Predict(inputTokens int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.advanceLocked(p.now())
	in := min(log2Bucket(inputTokens), p.inBuckets-1)
	total := p.sums[in]
	var remote []int32
	if p.remote != nil {
		total += p.remoteSums[in]
		remote = p.remote[in*p.outBuckets : (in+1)*p.outBuckets]
	}
	if total <= 0 {
		return p.coldLocked(inputTokens)
	}
	cursor := p.rng.Int32N(total)
	row := p.hist[in*p.outBuckets : (in+1)*p.outBuckets]
	out := len(row) - 1
	for b, n := range row {
		if remote != nil {
			n += remote[b]
		}
		if cursor < n {
			out = b
			break
		}
		cursor -= n
	}
	return min(1<<out, p.maxOutput)
}

// Histogram returns a copy of the predictor's own history over its window
// (not what SetRemoteHistogram added): the count of requests per input
// bucket (row) and output bucket (column), row after row. Another gateway
// replica's predictor of the same size adds it with SetRemoteHistogram.
func (p *SimpleOutputPredictor) Histogram() []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.advanceLocked(p.now())
	return append([]int32(nil), p.hist...)
}

// SetRemoteHistogram sets the history of other gateway replicas, the sum
// of their Histograms, which predictions then draw from with the
// predictor's own; nil clears it. A row of counts (one input bucket's)
// whose sum would overflow is halved until it fits, which keeps its
// shape. It fails, clearing the remote history so that no stale one
// stays, when h is not the size of the predictor's histogram (see
// HistogramSize) or holds a negative count.
func (p *SimpleOutputPredictor) SetRemoteHistogram(h []int32) error {
	var err error
	switch {
	case h == nil:
	case len(h) != p.inBuckets*p.outBuckets:
		err = fmt.Errorf("remote output histogram has %d counts, want %d input by %d output buckets", len(h), p.inBuckets, p.outBuckets)
	case slices.ContainsFunc(h, func(n int32) bool { return n < 0 }):
		err = errors.New("remote output histogram has a negative count")
	}
	if h == nil || err != nil {
		p.mu.Lock()
		p.remote, p.remoteSums = nil, nil
		p.mu.Unlock()
		return err
	}
	remote := append([]int32(nil), h...)
	sums := make([]int32, p.inBuckets)
	for i := range sums {
		row := remote[i*p.outBuckets : (i+1)*p.outBuckets]
		for {
			var s int64
			for _, n := range row {
				s += int64(n)
			}
			if s <= math.MaxInt32/2 {
				sums[i] = int32(s)
				break
			}
			for j := range row {
				row[j] /= 2
			}
		}
	}
	p.mu.Lock()
	p.remote, p.remoteSums = remote, sums
	p.mu.Unlock()
	return nil
}

func (p *SimpleOutputPredictor) coldLocked(inputTokens int) int {
	switch p.cold {
	case RandomColdPrediction:
		return p.rng.IntN(p.maxOutput) + 1
	case InputColdPrediction:
		return max(inputTokens, 1)
	case PessimisticColdPrediction:
		return p.maxOutput
	default:
		return 1
	}
}

// advanceLocked moves the head slot forward to the one covering ts,
// expiring the history that falls out of the window.
func (p *SimpleOutputPredictor) advanceLocked(ts time.Time) {
	steps := int(ts.Sub(p.headStart) / MovingInterval)
	if steps <= 0 {
		return
	}
	p.headStart = p.headStart.Add(time.Duration(steps) * MovingInterval)
	if steps >= len(p.slots) {
		for _, s := range p.slots {
			clear(s)
		}
		clear(p.hist)
		clear(p.sums)
		return
	}
	for range steps {
		p.head = (p.head + 1) % len(p.slots)
		expired := p.slots[p.head]
		for i, n := range expired {
			if n != 0 {
				p.hist[i] -= n
				p.sums[i/p.outBuckets] -= n
				expired[i] = 0
			}
		}
	}
}

// log2Bucket is round(log2(tokens)), 0 for fewer than 2 tokens.
func log2Bucket(tokens int) int {
	if tokens <= 1 {
		return 0
	}
	return int(math.Round(math.Log2(float64(tokens))))
}
