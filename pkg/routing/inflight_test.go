package routing

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// newTestBook returns in-flight accounting on clock with a 1-minute TTL,
// counting expiries.
func newTestBook(clock *testsupport.Clock) (*inflight, *int) {
	expired := 0
	return &inflight{now: clock.Now, ttl: time.Minute, onExpire: func(n int) { expired += n }}, &expired
}

func TestInFlightQueueDrainsAtThePredictedSpeed(t *testing.T) {
	clock := newManualClock()
	in, _ := newTestBook(clock)
	in.start("a", 1000, 0.1, 0)
	if q := in.queue("a", clock.Now(), time.Time{}, 0); q != (podQueue{prefills: 1, tokens: 1000, seconds: 0.1}) {
		t.Fatalf("after one start: %+v, want 1 prefill, 1000 tokens, 0.1 s", q)
	}
	clock.Advance(40 * time.Millisecond)
	// The second prefill queues behind what is left of the first.
	in.start("a", 500, 0.05, 0)
	if q := in.queue("a", clock.Now(), time.Time{}, 0); q.prefills != 2 || q.tokens != 1500 || !near(q.seconds, 0.11) {
		t.Fatalf("after a second start 40 ms later: %+v, want 2 prefills, 1500 tokens, 0.11 s", q)
	}
	clock.Advance(200 * time.Millisecond)
	if q := in.queue("a", clock.Now(), time.Time{}, 0); q.prefills != 2 || q.seconds != 0 {
		t.Fatalf("once predicted done: %+v, want both still counted with no work left", q)
	}
	if q := in.queue("b", clock.Now(), time.Time{}, 0); q != (podQueue{}) {
		t.Fatalf("another pod: %+v, want nothing", q)
	}
}

func TestEndingAPrefillEndsEarlierOnesAndRepredictsTheRest(t *testing.T) {
	// Three prefills of 0.1 s each start together, predicted done at 0.1,
	// 0.2 and 0.3 s; the second one ends.
	tests := []struct {
		name       string
		firstToken bool // FirstToken, else Done
		after      time.Duration
		remain     float64 // queue left
	}{
		// Its first token proves the queue behind it starts now.
		{"first token early", true, 50 * time.Millisecond, 0.1},
		{"first token late", true, 500 * time.Millisecond, 0.1},
		// Done only says it ended by now: the prediction gets no later.
		{"done early", false, 50 * time.Millisecond, 0.1},
		{"done late", false, 500 * time.Millisecond, 0},
		{"done near the prediction", false, 250 * time.Millisecond, 0.05},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newManualClock()
			in, _ := newTestBook(clock)
			var ps []*Prefill
			for range 3 {
				ps = append(ps, in.start("a", 100, 0.1, 0))
			}
			clock.Advance(tt.after)
			if tt.firstToken {
				ps[1].FirstToken()
			} else {
				ps[1].Done()
			}
			q := in.queue("a", clock.Now(), time.Time{}, 0)
			if q.prefills != 1 || q.tokens != 100 || !near(q.seconds, tt.remain) {
				t.Fatalf("queue %+v, want only the third prefill left with %v s", q, tt.remain)
			}
			// The first prefill's own completion, later, changes nothing.
			ps[0].Done()
			ps[0].FirstToken()
			if q2 := in.queue("a", clock.Now(), time.Time{}, 0); q2 != q {
				t.Fatalf("after the first prefill's late completion: %+v, want %+v", q2, q)
			}
			ps[2].Done()
			if q := in.queue("a", clock.Now(), time.Time{}, 0); q != (podQueue{}) || in.count.Load() != 0 || in.tokens.Load() != 0 {
				t.Fatalf("after the last prefill: %+v, count %d tokens %d; want nothing", q, in.count.Load(), in.tokens.Load())
			}
		})
	}
}

func TestPrefillMethodsAreSafeOnNilAndRepeated(t *testing.T) {
	var p *Prefill
	p.FirstToken()
	p.Done()

	clock := newManualClock()
	in, _ := newTestBook(clock)
	p = in.start("a", 10, 0.001, 0)
	p.Done()
	p.Done()
	p.FirstToken()
	if in.count.Load() != 0 {
		t.Fatalf("count %d after repeated ends, want 0", in.count.Load())
	}
}

func TestPrefillsWithoutCompletionExpire(t *testing.T) {
	clock := newManualClock()
	in, expired := newTestBook(clock)
	in.start("a", 100, 0.01, 0)
	in.start("b", 100, 0.01, 0)
	clock.Advance(30 * time.Second)
	in.start("a", 100, 0.01, 0)
	clock.Advance(31 * time.Second)

	// Reading pod a drops its first prefill, 61 s old.
	if q := in.queue("a", clock.Now(), time.Time{}, 0); q.prefills != 1 || *expired != 1 {
		t.Fatalf("pod a after 61 s: %+v, %d expired; want 1 prefill left, 1 expired", q, *expired)
	}
	// Nobody reads pod b: the sweep of the next start drops its prefill
	// and forgets the pod.
	in.start("c", 100, 0.01, 0)
	if _, ok := in.pods.Load("b"); ok || *expired != 2 || in.count.Load() != 2 {
		t.Fatalf("after the sweep: pod b kept %v, %d expired, %d counted; want b gone, 2 expired, 2 counted", ok, *expired, in.count.Load())
	}
}

func TestInFlightAccountingIsConsistentUnderConcurrency(t *testing.T) {
	in := &inflight{now: time.Now, ttl: time.Minute}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				pod := fmt.Sprint("pod", (g+i)%3)
				p := in.start(pod, 10, 0.001, 0.01)
				in.queue(fmt.Sprint("pod", i%3), time.Now(), time.Time{}, 0)
				if i%2 == 0 {
					p.FirstToken()
				}
				p.Done()
			}
		})
	}
	wg.Wait()
	if in.count.Load() != 0 || in.tokens.Load() != 0 {
		t.Fatalf("after every prefill ended: count %d, tokens %d; want none", in.count.Load(), in.tokens.Load())
	}
	// The pods are remembered with their ended prefills until those are
	// older than the TTL.
	later := time.Now().Add(2 * time.Minute)
	for i := range 3 {
		in.queue(fmt.Sprint("pod", i), later, time.Time{}, 0)
	}
	n := 0
	in.pods.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Fatalf("%d pods kept a TTL after their last prefill ended; want none", n)
	}
}

func TestQueueCountsTheScrapedWaitingRequestsThatEndedSince(t *testing.T) {
	// Prefills start at 0, 10 and 30 ms; the engine is scraped at 20 ms
	// with some requests waiting; the first ended prefills end at 40 ms.
	tests := []struct {
		name    string
		waiting float64
		ended   int // of the first prefills, in order
		want    int
	}{
		{"none ended", 2, 0, 0},
		{"both waiting, both ended", 2, 2, 2},
		{"one waiting: the older was running", 1, 1, 0},
		{"one waiting, both ended", 1, 2, 1},
		{"none waiting", 0, 2, 0},
		{"another gateway's request waiting too", 3, 2, 2},
		{"the prefill started after the scrape does not count", 3, 3, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newManualClock()
			in, _ := newTestBook(clock)
			t0 := clock.Now()
			at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
			var ps []*Prefill
			for _, ms := range []int{0, 10, 30} {
				clock.Advance(at(ms).Sub(clock.Now()))
				ps = append(ps, in.start("a", 100, 0.001, 0))
			}
			clock.Advance(at(40).Sub(clock.Now()))
			if tt.ended > 0 {
				ps[tt.ended-1].FirstToken() // and so the ones before
			}
			if n := in.queue("a", clock.Now(), at(20), tt.waiting).waitingEnded; n != tt.want {
				t.Fatalf("against the scrape: %d ended, want %d", n, tt.want)
			}
			// A scrape after the ends counts none of them.
			if n := in.queue("a", clock.Now(), at(40), tt.waiting).waitingEnded; n != 0 {
				t.Fatalf("against a scrape at the ends: %d, want 0", n)
			}
			if n := in.queue("a", clock.Now(), time.Time{}, tt.waiting).waitingEnded; n != 0 {
				t.Fatalf("without a scrape: %d, want 0", n)
			}
		})
	}
}

func TestPrefilledLogKeepsTheLatestEnds(t *testing.T) {
	var l prefilledLog
	t0 := time.Unix(0, 0)
	for i := range 3 * maxPrefilled {
		l.add(t0, t0.Add(time.Duration(i+1)*time.Millisecond))
	}
	kept := len(l.entries)
	if kept < maxPrefilled || kept > 2*maxPrefilled {
		t.Fatalf("%d entries kept, want between %d and %d", kept, maxPrefilled, 2*maxPrefilled)
	}
	if last := l.entries[kept-1].end; !last.Equal(t0.Add(3 * maxPrefilled * time.Millisecond)) {
		t.Fatalf("latest end kept %v, want the last added", last)
	}
	if n := l.since(t0.Add(time.Nanosecond)); n != kept {
		t.Fatalf("since the start: %d, want all %d kept", n, kept)
	}
}

func TestStartPrefillFeedsTheGaugesAndThePredictionRatio(t *testing.T) {
	clock := newManualClock()
	r, reg := newTestRouter(t, uniformFleet(2), nil, func(c *Config) { c.Now = clock.Now })
	d := route(t, r, request("r", KVAware, prompt(0, 1000)), testPods(2))
	p := r.StartPrefill(d)
	if g := testsupport.MetricValue(t, reg, "kvgate_routing_inflight_prefill_tokens", nil); g != 1000 {
		t.Fatalf("inflight_prefill_tokens %v, want 1000", g)
	}
	// Predicted 0.1 s prefill + 0.02 s step; the first token takes 0.24 s.
	clock.Advance(240 * time.Millisecond)
	p.FirstToken()
	if n := testsupport.MetricValue(t, reg, "kvgate_routing_ttft_prediction_ratio", nil); n != 1 {
		t.Fatalf("prediction ratio observed %v times, want 1", n)
	}
	if g := testsupport.MetricValue(t, reg, "kvgate_routing_inflight_prefills", nil); g != 0 {
		t.Fatalf("inflight_prefills %v after the first token, want 0", g)
	}
	// A prefill ended by Done is not compared with its prediction.
	r.StartPrefill(route(t, r, request("r", KVAware, prompt(0, 1000)), testPods(2))).Done()
	if n := testsupport.MetricValue(t, reg, "kvgate_routing_ttft_prediction_ratio", nil); n != 1 {
		t.Fatalf("prediction ratio observed %v times after a Done, want still 1", n)
	}
	if r.StartPrefill(&Decision{}) != nil {
		t.Fatal("StartPrefill of an empty decision returned a prefill")
	}
}
