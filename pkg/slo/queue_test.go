package slo

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/types"
)

// fleet stands for the pods of a model in unit tests: it has some free
// slots, and a request it cannot take may wait until its deadline less
// service (slack, without a deadline) before its SLO is lost. The real routing decisions are tested with the router in
// routing's tests and with vllm-sim engines in the gateway's.
type fleet struct {
	mu         sync.Mutex
	free       int
	slack      time.Duration
	clock      *clock
	service    time.Duration
	unmeetable bool
	routed     []string
}

func (f *fleet) try(id string) func() error { return f.tryBy(id, time.Time{}) }

func (f *fleet) tryBy(id string, deadline time.Time) func() error {
	return func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		switch {
		case f.unmeetable:
			return &routing.SLOError{Model: "m", Unmeetable: true}
		case f.free == 0:
			slack := f.slack
			if !deadline.IsZero() {
				slack = deadline.Sub(f.clock.Now()) - f.service
			}
			return &routing.SLOError{Model: "m", Slack: slack, Drain: 1500 * time.Millisecond}
		}
		f.free--
		f.routed = append(f.routed, id)
		return nil
	}
}

func (f *fleet) release(n int) {
	f.mu.Lock()
	f.free += n
	f.mu.Unlock()
}

func (f *fleet) order() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.routed...)
}

// clock is the manual clock of the queue tests.
type clock = testsupport.Clock

func newClock() *clock { return testsupport.NewClock(time.Unix(1_800_000_000, 0)) }

func entry(f *fleet, c *clock, id string, deadlineIn time.Duration, done func(error)) *Entry {
	rc := types.NewRoutingContext(id, "m")
	rc.ReceivedAt = c.Now()
	return &Entry{Request: rc, Deadline: c.Now().Add(deadlineIn), Try: f.try(id), Done: done}
}

func newTestQueue(t *testing.T, c *clock, cfg QueueConfig) (*QueueRouter, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Now = c.Now
	return NewQueueRouter("m", cfg, m), reg
}

func outcomeCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, o := range outcomes {
		out[o] = testsupport.MetricValue(t, reg, "kvgate_slo_requests_total", map[string]string{"model": "m", "outcome": o})
	}
	return out
}

func TestQueueRoutesWaitingRequestsEarliestDeadlineFirstAsCapacityFrees(t *testing.T) {
	c := newClock()
	f := &fleet{slack: time.Minute}
	q, reg := newTestQueue(t, c, QueueConfig{})
	var mu sync.Mutex
	var done []string
	for _, e := range []struct {
		id       string
		deadline time.Duration
	}{{"late", 30 * time.Second}, {"soon", 10 * time.Second}, {"middle", 20 * time.Second}} {
		id := e.id
		queued, err := q.Submit(entry(f, c, id, e.deadline, func(err error) {
			if err != nil {
				t.Errorf("%s left with %v", id, err)
			}
			mu.Lock()
			done = append(done, id)
			mu.Unlock()
		}), true)
		if !queued || err != nil {
			t.Fatalf("%s: queued %v, %v; want queued on a full fleet", id, queued, err)
		}
	}
	if q.Len() != 3 {
		t.Fatalf("%d waiting, want 3", q.Len())
	}
	q.Dispatch()
	if q.Len() != 3 {
		t.Fatalf("a pass on a full fleet routed something: %d waiting", q.Len())
	}
	for range 3 {
		f.release(1)
		q.Dispatch()
	}
	if got := fmt.Sprint(f.order()); got != "[soon middle late]" {
		t.Fatalf("routed %s, want earliest deadline first", got)
	}
	if got := fmt.Sprint(done); got != "[soon middle late]" || q.Len() != 0 {
		t.Fatalf("told %s, %d left; want all three routed", got, q.Len())
	}
	if o := outcomeCounts(t, reg); o[outcomeAdmitted] != 3 || o[outcomeRejected]+o[outcomeExpired] != 0 {
		t.Fatalf("outcomes %v, want 3 admitted", o)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_slo_queued_total", map[string]string{"model": "m"}); n != 3 {
		t.Fatalf("kvgate_slo_queued_total %v, want 3", n)
	}
}

func TestQueueRoutesAtOnceWhenNothingWaitsAndAPodCanTakeTheRequest(t *testing.T) {
	c := newClock()
	f := &fleet{free: 1}
	q, reg := newTestQueue(t, c, QueueConfig{})
	if err := q.Route(context.Background(), entry(f, c, "a", time.Second, nil), true); err != nil {
		t.Fatal(err)
	}
	if o := outcomeCounts(t, reg); o[outcomeAdmitted] != 1 {
		t.Fatalf("outcomes %v", o)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_slo_queued_total", map[string]string{"model": "m"}); n != 0 {
		t.Fatalf("a request routed at once counted as queued")
	}
}

func TestQueueRefusesWhatItCannotServe(t *testing.T) {
	tests := []struct {
		name       string
		fleet      *fleet
		hold       bool
		maxLen     int
		wantReason string
	}{
		{"queue full", &fleet{slack: time.Minute}, true, 1, ReasonQueueFull},
		{"unmeetable", &fleet{unmeetable: true}, true, 0, ReasonUnmeetable},
		{"push without capacity", &fleet{slack: time.Minute}, false, 0, ReasonNoCapacity},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			q, reg := newTestQueue(t, c, QueueConfig{MaxLength: tt.maxLen})
			f := tt.fleet
			if tt.wantReason == ReasonQueueFull {
				if queued, _ := q.Submit(entry(f, c, "first", time.Minute, nil), true); !queued {
					t.Fatal("the first request did not wait")
				}
			}
			err := q.Route(context.Background(), entry(f, c, "r", time.Minute, nil), tt.hold)
			var qe *Error
			if !errors.As(err, &qe) || qe.Reason != tt.wantReason || qe.RetryAfter < time.Second || qe.RetryAfter%time.Second != 0 {
				t.Fatalf("Route = %v (%+v), want %s with a Retry-After of whole seconds", err, qe, tt.wantReason)
			}
			if o := outcomeCounts(t, reg); o[outcomeRejected] != 1 {
				t.Fatalf("outcomes %v, want 1 rejected", o)
			}
		})
	}
}

func TestQueueLetsGoOfRequestsThatCanNoLongerMeetTheirSLO(t *testing.T) {
	c := newClock()
	f := &fleet{clock: c, service: 800 * time.Millisecond}
	q, reg := newTestQueue(t, c, QueueConfig{MaxWait: time.Minute})
	var got error
	e := entry(f, c, "r", time.Second, func(err error) { got = err })
	e.Try = f.tryBy("r", e.Deadline)
	if queued, _ := q.Submit(e, true); !queued {
		t.Fatal("not queued")
	}
	if at, ok := q.NextExpiry(); !ok || !at.Equal(c.Now().Add(200*time.Millisecond)) {
		t.Fatalf("next expiry %v %v, want in 200 ms (the slack)", at, ok)
	}
	c.Advance(150 * time.Millisecond)
	q.Dispatch()
	if got != nil || q.Len() != 1 {
		t.Fatalf("let go before its slack ran out: %v", got)
	}
	c.Advance(100 * time.Millisecond)
	f.release(1) // too late: the request cannot meet its SLO any more
	q.Dispatch()
	var qe *Error
	if !errors.As(got, &qe) || qe.Reason != ReasonExpired || qe.Waited != 250*time.Millisecond || q.Len() != 0 {
		t.Fatalf("left with %v (%+v), %d waiting; want expired after 250 ms", got, qe, q.Len())
	}
	if o := outcomeCounts(t, reg); o[outcomeExpired] != 1 || o[outcomeAdmitted] != 0 {
		t.Fatalf("outcomes %v", o)
	}
}

func TestQueueBoundsTheWaitOfRequestsWithoutATimeTarget(t *testing.T) {
	c := newClock()
	f := &fleet{slack: time.Duration(1<<63 - 1)} // a TPOT-only objective: no deadline of its own
	q, _ := newTestQueue(t, c, QueueConfig{MaxWait: 2 * time.Second})
	var got error
	q.Submit(entry(f, c, "r", time.Hour, func(err error) { got = err }), true)
	c.Advance(2 * time.Second)
	q.Dispatch()
	var qe *Error
	if !errors.As(got, &qe) || qe.Reason != ReasonExpired {
		t.Fatalf("after the longest wait the request left with %v, want expired", got)
	}
}

// newTestRouters returns Routers with default bounds, the queue of model
// "m" on clock c, and the registry of their metrics.
func newTestRouters(t *testing.T, c *clock) (*Routers, *QueueRouter, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	rs := NewRouters(NewProvider(Config{}, m), m)
	q, err := rs.GetRouter(&types.RoutingContext{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	q.cfg.Now = c.Now
	return rs, q, reg
}

func TestQueueDropsWaitingRequestsOfAModelThatLeft(t *testing.T) {
	c := newClock()
	f := &fleet{slack: time.Minute}
	rs, q, reg := newTestRouters(t, c)
	var got error
	q.Submit(entry(f, c, "r", time.Minute, func(err error) { got = err }), true)
	rs.Forget("m")
	var qe *Error
	if !errors.As(got, &qe) || qe.Reason != ReasonModelGone {
		t.Fatalf("waiting request left with %v, want model_gone", got)
	}
	if n := testutilCount(t, reg, "kvgate_slo_requests_total"); n != 0 {
		t.Fatalf("%d series of the forgotten model remain", n)
	}
	if q2, _ := rs.GetRouter(&types.RoutingContext{Model: "m"}); q2 == q {
		t.Fatal("the forgotten model's queue was handed out again")
	}
}

// testutilCount returns how many series of name reg holds.
func testutilCount(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

func TestQueueRouteLeavesTheQueueAtOnceWhenItsContextEnds(t *testing.T) {
	c := newClock()
	f := &fleet{slack: time.Minute}
	q, reg := newTestQueue(t, c, QueueConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- q.Route(ctx, entry(f, c, "r", time.Minute, nil), true) }()
	testsupport.Eventually(t, "the request never queued", func() bool { return q.Len() == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Route = %v, want the context's error", err)
	}
	if q.Len() != 0 {
		t.Fatalf("%d still waiting after the client left", q.Len())
	}
	f.release(1)
	q.Dispatch()
	if len(f.order()) != 0 {
		t.Fatal("a cancelled request was routed")
	}
	if o := outcomeCounts(t, reg); o[outcomeCancelled] != 1 {
		t.Fatalf("outcomes %v, want 1 cancelled", o)
	}
}

func TestQueueRunRoutesConcurrentRequestsAsCapacityFreesAndLosesNone(t *testing.T) {
	f := &fleet{slack: time.Minute}
	reg := prometheus.NewRegistry()
	m, _ := NewMetrics(reg)
	q := NewQueueRouter("m", QueueConfig{}, m)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- q.Run(ctx) }()

	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			rc := types.NewRoutingContext(fmt.Sprint("r", i), "m")
			errs <- q.Route(context.Background(), &Entry{Request: rc, Deadline: rc.ReceivedAt.Add(time.Minute),
				Try: f.try(rc.RequestID)}, true)
		})
	}
	testsupport.Eventually(t, "not every request queued", func() bool { return q.Len() == n })
	for range n / 8 {
		f.release(8)
		q.Trigger()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := len(f.order()); got != n {
		t.Fatalf("%d routed, want %d", got, n)
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if o := outcomeCounts(t, reg); o[outcomeAdmitted] != n {
		t.Fatalf("outcomes %v", o)
	}
}

func TestRoutersCloseRefusesWhatWaitsAndWhatComesAfter(t *testing.T) {
	c := newClock()
	f := &fleet{slack: time.Minute}
	rs, q, reg := newTestRouters(t, c)
	var got error
	if queued, err := q.Submit(entry(f, c, "r", time.Minute, func(err error) { got = err }), true); !queued {
		t.Fatalf("the request was not queued: %v", err)
	}
	rs.Close()
	var qe *Error
	if !errors.As(got, &qe) || qe.Reason != ReasonStopped {
		t.Fatalf("waiting request left with %v, want stopped", got)
	}
	f.release(1)
	if _, err := q.Submit(entry(f, c, "late", time.Minute, nil), true); !errors.As(err, &qe) || qe.Reason != ReasonStopped {
		t.Errorf("a request submitted after Close: %v, want stopped", err)
	}
	if _, err := rs.GetRouter(&types.RoutingContext{Model: "other"}); !errors.Is(err, ErrStopped) {
		t.Errorf("GetRouter after Close: %v, want ErrStopped", err)
	}
	if o := outcomeCounts(t, reg); o[outcomeDropped] != 1 || o[outcomeRejected] != 1 || o[outcomeAdmitted] != 0 {
		t.Errorf("outcomes %v, want one dropped and one rejected", o)
	}
}

func TestQueueGoesBackToTheEarliestRequestWhenCapacityFreesDuringAPass(t *testing.T) {
	// The fleet is full. A pass tries the earliest request, which waits;
	// a request completes just then (capacity frees and the queue is
	// triggered) before the pass tries the next one. The pass starts
	// again from the earliest, which takes the room; the next one waits.
	c := newClock()
	f := &fleet{slack: time.Minute, clock: c}
	q, _ := newTestQueue(t, c, QueueConfig{})
	first := entry(f, c, "first", time.Minute, nil)
	armed := false
	try := first.Try
	first.Try = func() error {
		err := try()
		if err != nil && armed {
			armed = false
			f.release(1)
			q.Trigger()
		}
		return err
	}
	for _, e := range []*Entry{first, entry(f, c, "second", 2*time.Minute, nil)} {
		if queued, err := q.Submit(e, true); !queued {
			t.Fatalf("%s was not queued: %v", e.Request.RequestID, err)
		}
	}
	armed = true
	q.Dispatch()
	if got := f.order(); !slices.Equal(got, []string{"first"}) || q.Len() != 1 {
		t.Fatalf("routed %v with %d waiting; want the earliest request routed and the other waiting", got, q.Len())
	}
}

func TestQueueHandsOnTheErrorOfARequestNoPodIsLeftToRoute(t *testing.T) {
	// The model's last pod left and a pass tried the waiting request before
	// Forget closed the queue: the request leaves with Try's own error, as
	// Submit returns it, not as one that could not meet its SLO.
	c := newClock()
	f := &fleet{slack: time.Minute}
	q, reg := newTestQueue(t, c, QueueConfig{})
	var got error
	e := entry(f, c, "r", time.Minute, func(err error) { got = err })
	if queued, _ := q.Submit(e, true); !queued {
		t.Fatal("not queued")
	}
	e.Try = func() error { return routing.ErrNoPods }
	c.Advance(5 * time.Millisecond)
	q.Dispatch()
	var qe *Error
	if !errors.Is(got, routing.ErrNoPods) || errors.As(got, &qe) || q.Len() != 0 {
		t.Fatalf("left with %v, %d waiting; want routing.ErrNoPods itself", got, q.Len())
	}
	if o := outcomeCounts(t, reg); o[outcomeDropped] != 1 || o[outcomeExpired] != 0 {
		t.Fatalf("outcomes %v, want one dropped", o)
	}
}

// runningTestRouters returns Routers on the real clock with their loops
// running until the test ends, the queue of model "m", and the Capacity
// lock its passes hold for reading.
func runningTestRouters(t *testing.T, cfg Config) (*Routers, *QueueRouter, *sync.RWMutex) {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	capacity := &sync.RWMutex{}
	cfg.Capacity = capacity
	rs := NewRouters(NewProvider(cfg, m), m)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = rs.Run(ctx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran })
	q, err := rs.GetRouter(&types.RoutingContext{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	return rs, q, capacity
}

func TestQueueRefusesARequestWhoseModelLeftWhileItWasTried(t *testing.T) {
	// Forget closes the queue between Submit's check of it and the
	// request's insertion: the request must not wait in a queue nothing
	// passes over any more, until its client gives up.
	c := newClock()
	f := &fleet{slack: time.Minute}
	rs, q, _ := newTestRouters(t, c)
	e := entry(f, c, "r", time.Minute, nil)
	try := e.Try
	e.Try = func() error {
		rs.Forget("m") // the model's last pod leaves meanwhile
		return try()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := q.Route(ctx, e, true)
	var qe *Error
	if !errors.As(err, &qe) || qe.Reason != ReasonModelGone || q.Len() != 0 {
		t.Fatalf("Route = %v, %d waiting; want model_gone at once", err, q.Len())
	}
}

func TestQueuePassesOverARequestWhenCapacityFreedAsItWasFirstTried(t *testing.T) {
	// The first try of a request arriving at an empty queue finds the
	// fleet full; a request completes before it is queued, and the
	// completion's Trigger finds no request waiting. The request is routed
	// by the pass its queueing makes, not left waiting with a pod free.
	rs, q, capacity := runningTestRouters(t, Config{MaxWait: time.Minute})
	f := &fleet{slack: time.Minute}
	rc := types.NewRoutingContext("r", "m")
	e := &Entry{Request: rc, Deadline: rc.ReceivedAt.Add(time.Minute)}
	try, first := f.try("r"), true
	e.Try = func() error {
		err := try()
		if err != nil && first {
			first = false
			done := make(chan struct{})
			go func() { // as the request ledger frees capacity
				capacity.Lock()
				f.release(1)
				rs.Trigger()
				capacity.Unlock()
				close(done)
			}()
			<-done
		}
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := q.Route(ctx, e, true); err != nil {
		t.Fatalf("Route = %v with a pod free (routed %v); want routed", err, f.order())
	}
}

func TestQueueLetsGoOfARequestQueuedAtAnEmptyQueueWithoutAnotherTrigger(t *testing.T) {
	// The queue's loop, idle on an empty queue, must arm its timer for the
	// expiry of the first request queued, by its slack or MaxWait.
	tests := []struct {
		name           string
		slack, maxWait time.Duration
	}{
		{"slack", 300 * time.Millisecond, time.Minute},
		{"max wait", time.Minute, 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, q, _ := runningTestRouters(t, Config{MaxWait: tt.maxWait})
			q.Trigger()
			testsupport.Eventually(t, "the loop made no pass", func() bool { return q.Status().LastTry != nil })
			time.Sleep(10 * time.Millisecond) // the loop waits again
			f := &fleet{slack: tt.slack}
			rc := types.NewRoutingContext("r", "m")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			start := time.Now()
			err := q.Route(ctx, &Entry{Request: rc, Deadline: rc.ReceivedAt.Add(time.Minute), Try: f.try("r")}, true)
			var qe *Error
			if !errors.As(err, &qe) || qe.Reason != ReasonExpired {
				t.Fatalf("Route = %v after %v; want expired after 300 ms", err, time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

func TestRoutersForgetLeavesTheSeriesOfTheModelsNextQueue(t *testing.T) {
	// A request for the model arrives while Forget refuses what waited in
	// its old queue, and waits in a new one: that queue's series stay.
	c := newClock()
	f := &fleet{slack: time.Minute}
	rs, q, reg := newTestRouters(t, c)
	var q2 *QueueRouter
	old := entry(f, c, "old", time.Minute, func(error) {
		var err error
		if q2, err = rs.GetRouter(&types.RoutingContext{Model: "m"}); err != nil {
			t.Error(err)
			return
		}
		if queued, err := q2.Submit(entry(f, c, "new", time.Minute, nil), true); !queued {
			t.Errorf("the new request was not queued: %v", err)
		}
	})
	if queued, _ := q.Submit(old, true); !queued {
		t.Fatal("the old request was not queued")
	}
	rs.Forget("m")
	if q2 == nil || q2.Len() != 1 {
		t.Fatal("no request waits in the model's new queue")
	}
	if g := testsupport.MetricValue(t, reg, "kvgate_slo_queue_length", map[string]string{"model": "m"}); g != 1 {
		t.Fatalf("kvgate_slo_queue_length of the new queue = %v, want 1", g)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_slo_queued_total", map[string]string{"model": "m"}); n != 1 {
		t.Fatalf("kvgate_slo_queued_total of the new queue = %v, want 1", n)
	}
}

func TestQueueRetryAfterIsWholeSecondsFromOneToMaxWait(t *testing.T) {
	const maxDrain = time.Duration(math.MaxInt64) // routing's "no pod to estimate from"
	tests := []struct {
		maxWait, drain, want time.Duration
	}{
		{time.Minute, -time.Hour, time.Second},
		{time.Minute, 0, time.Second},
		{time.Minute, 1500 * time.Millisecond, 2 * time.Second},
		{time.Minute, 30 * time.Second, 30 * time.Second},
		{time.Minute, 10 * time.Hour, time.Minute},
		{time.Minute, maxDrain, time.Minute},
		{90500 * time.Millisecond, maxDrain, 91 * time.Second},
		{500 * time.Millisecond, 10 * time.Second, time.Second},
		{maxDrain, maxDrain, maxDrain.Truncate(time.Second)},
	}
	for _, tt := range tests {
		q := NewQueueRouter("m", QueueConfig{MaxWait: tt.maxWait}, nil)
		if got := q.retryAfter(tt.drain); got != tt.want {
			t.Errorf("MaxWait %v: retryAfter(%v) = %v, want %v", tt.maxWait, tt.drain, got, tt.want)
		}
	}
}

func TestQueueTellsEveryRequestOneOutcomeUnderConcurrentRoutesCancelsAndCompletions(t *testing.T) {
	// Requests of priorities from -1 (sheddable) to 2, in five flows,
	// arrive, wait, give up (a third of them, after up to 2 ms), expire,
	// are displaced from the full queue and are routed as completions free
	// capacity, while passes, Trigger, Status and NextExpiry run from
	// other goroutines: every Route returns, every request is counted
	// once, none is routed that Route did not report routed, the gauge
	// ends at the queue's length, and nothing is kept of the flows.
	for _, fairness := range FairnessPolicies {
		t.Run(fairness, func(t *testing.T) { testQueueOutcomesUnderConcurrency(t, fairness) })
	}
}

func testQueueOutcomesUnderConcurrency(t *testing.T, fairness string) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	capacity := &sync.RWMutex{}
	q := NewQueueRouter("m", QueueConfig{MaxLength: 64, MaxWait: 300 * time.Millisecond, Capacity: capacity, Fairness: fairness}, m)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- q.Run(ctx) }()

	f := &fleet{slack: time.Minute, free: 2}
	stopBackground := make(chan struct{})
	var background sync.WaitGroup
	every := func(d func() time.Duration, do func()) {
		background.Go(func() {
			for {
				select {
				case <-stopBackground:
					return
				case <-time.After(d()):
					do()
				}
			}
		})
	}
	every(func() time.Duration { return time.Duration(rand.IntN(300)) * time.Microsecond }, func() {
		capacity.Lock() // a completion, as the request ledger frees capacity
		f.release(1)
		q.Trigger()
		capacity.Unlock()
	})
	every(func() time.Duration { return time.Millisecond }, func() { q.Status(); q.NextExpiry() })

	const n = 1000
	var wg sync.WaitGroup
	var routed, refused, expired, gaveUp atomic.Int64
	var toldMu sync.Mutex
	told := map[string]int{}
	for i := range n {
		if i%20 == 0 {
			time.Sleep(2 * time.Millisecond)
		}
		wg.Go(func() {
			id := fmt.Sprint("r", i)
			rctx, cancel := context.Background(), context.CancelFunc(func() {})
			if i%3 == 0 {
				rctx, cancel = context.WithTimeout(rctx, time.Duration(rand.IntN(2000))*time.Microsecond)
			}
			defer cancel()
			rc := types.NewRoutingContext(id, "m")
			rc.Priority = rand.IntN(4) - 1
			rc.FairnessID = fmt.Sprint("flow-", rand.IntN(5))
			e := &Entry{Request: rc, Deadline: rc.ReceivedAt.Add(time.Duration(rand.IntN(1000)) * time.Millisecond),
				Try: f.try(id), Done: func(error) {
					toldMu.Lock()
					told[id]++
					toldMu.Unlock()
				}}
			err := q.Route(rctx, e, true)
			var qe *Error
			switch {
			case err == nil:
				routed.Add(1)
			case errors.As(err, &qe) && qe.Reason == ReasonExpired:
				expired.Add(1)
			case errors.As(err, &qe):
				refused.Add(1)
			case rctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
				// context.Canceled when its context ended as a pass tried
				// it (see Cancel)
				gaveUp.Add(1)
			default:
				t.Errorf("%s: %v", id, err)
			}
			if i%7 == 0 {
				wg.Go(q.Dispatch)
			}
		})
	}
	returned := make(chan struct{})
	go func() { wg.Wait(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatalf("Route calls stuck with %d waiting", q.Len())
	}
	close(stopBackground)
	background.Wait()
	stop()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}

	if total := routed.Load() + refused.Load() + expired.Load() + gaveUp.Load(); total != n {
		t.Errorf("%d Route outcomes, want %d", total, n)
	}
	if got := int64(len(f.order())); got != routed.Load() {
		t.Errorf("the fleet took %d requests, Route reported %d routed", got, routed.Load())
	}
	for id, k := range told {
		if k != 1 {
			t.Errorf("%s told %d times", id, k)
		}
	}
	if q.Len() != 0 {
		t.Errorf("%d left in the queue", q.Len())
	}
	assertNoFlowsKept(t, q)
	if g := testsupport.MetricValue(t, reg, "kvgate_slo_queue_length", map[string]string{"model": "m"}); g != 0 {
		t.Errorf("kvgate_slo_queue_length %v, want 0", g)
	}
	o := outcomeCounts(t, reg)
	var sum float64
	for _, k := range o {
		sum += k
	}
	if sum != n {
		t.Errorf("outcome counters sum to %v (%v), want %d", sum, o, n)
	}
}

// withPriority sets the priority of e's request and returns e.
func withPriority(e *Entry, priority int) *Entry {
	e.Request.Priority = priority
	return e
}

func TestQueueRoutesHigherPriorityRequestsFirstThenEarliestDeadline(t *testing.T) {
	type arrival struct {
		id       string
		priority int
		deadline time.Duration // from the first arrival
	}
	tests := []struct {
		name     string
		arrivals []arrival // in this order, 1 ms apart
		want     string
	}{
		{"a later higher-priority request before an earlier lower-priority one",
			[]arrival{{"low", 0, 10 * time.Second}, {"high", 5, 30 * time.Second}}, "[high low]"},
		{"equal priorities keep earliest deadline first",
			[]arrival{{"late", 3, 30 * time.Second}, {"soon", 3, 10 * time.Second}, {"middle", 3, 20 * time.Second}}, "[soon middle late]"},
		{"equal priorities and deadlines keep arrival order",
			[]arrival{{"first", 1, 10 * time.Second}, {"second", 1, 10 * time.Second}}, "[first second]"},
		{"priority, then deadline",
			[]arrival{{"a", 0, 5 * time.Second}, {"b", 2, 50 * time.Second}, {"c", 1, 20 * time.Second}, {"d", 2, 40 * time.Second},
				{"e", 1, 10 * time.Second}}, "[d b e c a]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			start := c.Now()
			f := &fleet{slack: time.Minute}
			q, _ := newTestQueue(t, c, QueueConfig{})
			priorities := map[string]int{}
			for _, a := range tt.arrivals {
				e := withPriority(entry(f, c, a.id, 0, nil), a.priority)
				e.Deadline = start.Add(a.deadline)
				priorities[a.id] = a.priority
				if queued, err := q.Submit(e, true); !queued {
					t.Fatalf("%s was not queued on a full fleet: %v", a.id, err)
				}
				c.Advance(time.Millisecond)
			}
			var shown []string
			for _, w := range q.Status().Waiting {
				shown = append(shown, w.RequestID)
				if w.Priority != priorities[w.RequestID] {
					t.Errorf("/debug/slo shows %s with priority %d, want %d", w.RequestID, w.Priority, priorities[w.RequestID])
				}
			}
			if got := fmt.Sprint(shown); got != tt.want {
				t.Errorf("Status lists %s waiting, want %s", got, tt.want)
			}
			for range tt.arrivals {
				f.release(1)
				q.Dispatch()
			}
			if got := fmt.Sprint(f.order()); got != tt.want || q.Len() != 0 {
				t.Fatalf("routed %s with %d waiting, want %s", got, q.Len(), tt.want)
			}
		})
	}
}

func TestQueueLetsGoOfAnExpiringRequestBehindHigherPriorityOnes(t *testing.T) {
	// A low-priority request with little slack waits behind more
	// higher-priority ones than a pass tries on a full fleet: the queue's
	// loop still wakes for its expiry, and a pass lets it go then.
	c := newClock()
	f := &fleet{slack: time.Minute}
	q, reg := newTestQueue(t, c, QueueConfig{})
	var got error
	low := entry(f, c, "low", time.Minute, func(err error) { got = err })
	low.Try = func() error { return &routing.SLOError{Model: "m", Slack: 200 * time.Millisecond, Drain: time.Second} }
	if queued, _ := q.Submit(low, true); !queued {
		t.Fatal("the low-priority request was not queued")
	}
	for i := range maxWaitsPerPass + 2 {
		if queued, _ := q.Submit(withPriority(entry(f, c, fmt.Sprint("high", i), time.Minute, nil), 1), true); !queued {
			t.Fatalf("high%d was not queued", i)
		}
	}
	if w := q.Status().Waiting; w[len(w)-1].RequestID != "low" {
		t.Fatalf("the low-priority request is not last in the queue")
	}
	if at, ok := q.NextExpiry(); !ok || !at.Equal(c.Now().Add(200*time.Millisecond)) {
		t.Fatalf("next expiry %v %v, want the low-priority request's, in 200 ms", at, ok)
	}
	c.Advance(200 * time.Millisecond)
	q.Dispatch()
	var qe *Error
	if !errors.As(got, &qe) || qe.Reason != ReasonExpired || q.Len() != maxWaitsPerPass+2 {
		t.Fatalf("the low-priority request left with %v, %d waiting; want it expired and the others waiting", got, q.Len())
	}
	if o := outcomeCounts(t, reg); o[outcomeExpired] != 1 {
		t.Fatalf("outcomes %v, want 1 expired", o)
	}
}

func TestQueueFullMakesRoomOnlyForAHigherPriorityArrival(t *testing.T) {
	type waiting struct {
		id       string
		priority int
		deadline time.Duration
	}
	full := []waiting{{"a", 0, 10 * time.Second}, {"b", 0, 30 * time.Second}, {"c", 1, 5 * time.Second}}
	tests := []struct {
		name          string
		priority      int
		wantDisplaced string // "" when the arrival is refused
		wantWaiting   string
	}{
		{"a higher priority displaces the lowest priority's latest deadline", 1, "b", "[c x a]"},
		{"the highest priority displaces the same", 9, "b", "[x c a]"},
		{"the lowest priority waiting is refused", 0, "", "[c a b]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			f := &fleet{slack: time.Minute}
			q, reg := newTestQueue(t, c, QueueConfig{MaxLength: len(full)})
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			routes := map[string]chan error{}
			for _, w := range full {
				e := withPriority(entry(f, c, w.id, w.deadline, nil), w.priority)
				route := make(chan error, 1)
				routes[w.id] = route
				go func() { route <- q.Route(ctx, e, true) }()
				testsupport.Eventually(t, w.id+" to wait", func() bool { return len(q.Status().Waiting) == len(routes) })
			}
			queued, err := q.Submit(withPriority(entry(f, c, "x", 20*time.Second, nil), tt.priority), true)
			var qe *Error
			if tt.wantDisplaced == "" {
				if queued || !errors.As(err, &qe) || qe.Reason != ReasonQueueFull {
					t.Fatalf("Submit = %v, %v; want refused with %s", queued, err, ReasonQueueFull)
				}
			} else {
				if !queued || err != nil {
					t.Fatalf("Submit = %v, %v; want queued", queued, err)
				}
				select {
				case err := <-routes[tt.wantDisplaced]:
					if !errors.As(err, &qe) || qe.Reason != ReasonDisplaced || qe.RetryAfter != 2*time.Second {
						t.Fatalf("the displaced request's Route = %v (%+v), want %s with the 2 s Retry-After of a full queue",
							err, qe, ReasonDisplaced)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("the Route of %s did not return", tt.wantDisplaced)
				}
			}
			var shown []string
			for _, w := range q.Status().Waiting {
				shown = append(shown, w.RequestID)
			}
			if got := fmt.Sprint(shown); got != tt.wantWaiting {
				t.Fatalf("waiting %s, want %s", got, tt.wantWaiting)
			}
			wantDisplaced, wantRejected := 1.0, 0.0
			if tt.wantDisplaced == "" {
				wantDisplaced, wantRejected = 0, 1
			}
			if o := outcomeCounts(t, reg); o[outcomeDisplaced] != wantDisplaced || o[outcomeRejected] != wantRejected {
				t.Fatalf("outcomes %v, want %v displaced and %v rejected", o, wantDisplaced, wantRejected)
			}
			if g := testsupport.MetricValue(t, reg, "kvgate_slo_queue_length", map[string]string{"model": "m"}); g != float64(len(full)) {
				t.Fatalf("kvgate_slo_queue_length %v, want %d", g, len(full))
			}
		})
	}
}

func TestQueueRefusesASheddableRequestRatherThanHoldIt(t *testing.T) {
	tests := []struct {
		name       string
		free       int  // pods' free slots as it arrives
		waiting    bool // a request of priority 0 waits as it arrives
		hold       bool
		wantReason string // "" when routed
		wantTried  bool
	}{
		{"no pod can take it", 0, false, true, ReasonSheddable, true},
		{"others wait, though a pod is free", 1, true, true, ReasonSheddable, false},
		{"a pod can take it at once", 1, false, true, "", true},
		{"without hold, no pod can take it", 0, false, false, ReasonNoCapacity, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			f := &fleet{slack: time.Minute}
			q, reg := newTestQueue(t, c, QueueConfig{})
			if tt.waiting {
				if queued, err := q.Submit(entry(f, c, "waiting", time.Minute, nil), true); !queued {
					t.Fatalf("the request of priority 0 was not queued: %v", err)
				}
			}
			f.release(tt.free)
			e := withPriority(entry(f, c, "sheddable", time.Minute, nil), -1)
			tried := false
			try := e.Try
			e.Try = func() error { tried = true; return try() }
			queued, err := q.Submit(e, tt.hold)
			if queued {
				t.Fatalf("the sheddable request waits, %d in the queue", q.Len())
			}
			var qe *Error
			switch {
			case tt.wantReason == "" && err != nil:
				t.Fatalf("Submit = %v, want routed", err)
			case tt.wantReason != "" && (!errors.As(err, &qe) || qe.Reason != tt.wantReason || qe.RetryAfter != 2*time.Second):
				t.Fatalf("Submit = %v (%+v), want %s with a Retry-After of 2 s", err, qe, tt.wantReason)
			}
			if tried != tt.wantTried {
				t.Errorf("tried %v, want %v", tried, tt.wantTried)
			}
			o := outcomeCounts(t, reg)
			switch tt.wantReason {
			case "":
				if o[outcomeAdmitted] != 1 {
					t.Errorf("outcomes %v, want 1 admitted", o)
				}
			case ReasonSheddable:
				if o[outcomeShed] != 1 || o[outcomeRejected] != 0 {
					t.Errorf("outcomes %v, want 1 shed", o)
				}
			default:
				if o[outcomeRejected] != 1 {
					t.Errorf("outcomes %v, want 1 rejected", o)
				}
			}
		})
	}
}
