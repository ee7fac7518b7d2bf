package inflight

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testsupport"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newTestLedger returns a ledger on clock with a one-minute TTL, its metrics
// on a fresh registry.
func newTestLedger(t testing.TB, clock *testsupport.Clock) (*Ledger, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	l, err := New(Config{TTL: time.Minute, Now: clock.Now, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return l, reg
}

func newManualClock() *testsupport.Clock { return testsupport.NewClock(time.Unix(1_800_000_000, 0)) }

// send admits a request for model m and routes it to pod with tokens of
// prefill work taking work seconds.
func send(l *Ledger, pod *PodLoad, tokens int, work float64) *Handle {
	return l.Admit("r", "m").Route(Route{Pod: pod, UncachedTokens: float64(tokens), PrefillSeconds: work})
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestQueueDrainsAtThePredictedSpeed(t *testing.T) {
	clock := newManualClock()
	l, _ := newTestLedger(t, clock)
	a, b := NewPodLoad("ns/a"), NewPodLoad("ns/b")
	send(l, a, 1000, 0.1)
	if q := a.Queue(clock.Now(), time.Time{}, 0); q != (Queue{Prefills: 1, Tokens: 1000, Seconds: 0.1}) {
		t.Fatalf("after one start: %+v, want 1 prefill, 1000 tokens, 0.1 s", q)
	}
	clock.Advance(40 * time.Millisecond)
	// The second prefill queues behind what is left of the first.
	send(l, a, 500, 0.05)
	if q := a.Queue(clock.Now(), time.Time{}, 0); q.Prefills != 2 || q.Tokens != 1500 || !near(q.Seconds, 0.11) {
		t.Fatalf("after a second start 40 ms later: %+v, want 2 prefills, 1500 tokens, 0.11 s", q)
	}
	clock.Advance(200 * time.Millisecond)
	if q := a.Queue(clock.Now(), time.Time{}, 0); q.Prefills != 2 || q.Seconds != 0 {
		t.Fatalf("once predicted done: %+v, want both still counted with no work left", q)
	}
	if q := b.Queue(clock.Now(), time.Time{}, 0); q != (Queue{}) {
		t.Fatalf("another pod: %+v, want nothing", q)
	}
}

func TestEndingAPrefillEndsEarlierOnesAndRepredictsTheRest(t *testing.T) {
	// Three prefills of 0.1 s each start together, predicted done at 0.1,
	// 0.2 and 0.3 s; the second one ends.
	tests := []struct {
		name       string
		firstToken bool // FirstToken, else Close
		after      time.Duration
		remain     float64 // queue left
	}{
		// Its first token proves the queue behind it starts now.
		{"first token early", true, 50 * time.Millisecond, 0.1},
		{"first token late", true, 500 * time.Millisecond, 0.1},
		// A close only says it ended by now: the prediction gets no later.
		{"closed early", false, 50 * time.Millisecond, 0.1},
		{"closed late", false, 500 * time.Millisecond, 0},
		{"closed near the prediction", false, 250 * time.Millisecond, 0.05},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newManualClock()
			l, reg := newTestLedger(t, clock)
			pod := NewPodLoad("ns/a")
			var hs []*Handle
			for range 3 {
				hs = append(hs, send(l, pod, 100, 0.1))
			}
			clock.Advance(tt.after)
			if tt.firstToken {
				hs[1].FirstToken()
			} else {
				hs[1].Close(Done, "")
			}
			q := pod.Queue(clock.Now(), time.Time{}, 0)
			if q.Prefills != 1 || q.Tokens != 100 || !near(q.Seconds, tt.remain) {
				t.Fatalf("queue %+v, want only the third prefill left with %v s", q, tt.remain)
			}
			// The first prefill's own end, later, changes nothing.
			hs[0].FirstToken()
			hs[0].Close(Done, "")
			if q2 := pod.Queue(clock.Now(), time.Time{}, 0); q2 != q {
				t.Fatalf("after the first prefill's late end: %+v, want %+v", q2, q)
			}
			hs[2].Close(Done, "")
			if q := pod.Queue(clock.Now(), time.Time{}, 0); q != (Queue{}) || l.prefills.Load() != 0 || l.prefillTokens.Load() != 0 {
				t.Fatalf("after the last prefill: %+v, count %d tokens %d; want nothing", q, l.prefills.Load(), l.prefillTokens.Load())
			}
			if g := testsupport.MetricValue(t, reg, "kvgate_routing_inflight_prefills", nil); g != 0 {
				t.Fatalf("inflight_prefills %v, want 0", g)
			}
		})
	}
}

func TestAnAttemptClosesOnce(t *testing.T) {
	clock := newManualClock()
	l, reg := newTestLedger(t, clock)
	pod := NewPodLoad("ns/p")
	r := l.Admit("r1", "m")
	h := r.Route(Route{Pod: pod, UncachedTokens: 10, PrefillSeconds: 0.001})
	if !h.Close(Done, "") {
		t.Fatal("the first Close did not close the attempt")
	}
	if h.Close(Failed, "again") || h.Close(Done, "") {
		t.Fatal("a repeated Close closed the attempt again")
	}
	h.FirstToken()
	if o, _ := h.Outcome(); o != Done || pod.Running() != 0 || l.prefills.Load() != 0 {
		t.Fatalf("outcome %q, running %d, prefills %d; want done and nothing counted", o, pod.Running(), l.prefills.Load())
	}
	// The client retries with the same request id: a new request, whose
	// attempt the first one's late closes do not touch.
	h2 := l.Admit("r1", "m").Route(Route{Pod: pod})
	h.Close(Done, "late duplicate")
	if got := pod.Running(); got != 1 {
		t.Fatalf("running after a stale close = %v, want 1", got)
	}
	h2.Close(Done, "")
	h2.Close(Done, "")
	if got := pod.Running(); got != 0 {
		t.Fatalf("running after the close = %v, want 0", got)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_request_done_ignored_total", map[string]string{"reason": "closed"}); n != 4 {
		t.Fatalf("ignored closes = %v, want 4", n)
	}
	r.End()
	r.End()
	if l.Tracked() != 1 {
		t.Fatalf("tracked %d after ending one of two requests twice, want 1", l.Tracked())
	}
}

func TestRetryMovesTheRequestFromPodToPod(t *testing.T) {
	clock := newManualClock()
	l, _ := newTestLedger(t, clock)
	a, b := NewPodLoad("ns/a"), NewPodLoad("ns/b")
	r := l.Admit("r1", "m")
	if got := l.Model("m"); got != (ModelCounts{Pending: 1}) {
		t.Fatalf("before routing: %+v, want 1 pending, 0 routed", got)
	}
	first := r.Route(Route{Pod: a, UncachedTokens: 100, PrefillSeconds: 0.01})
	if a.Running() != 1 || a.RunningModel("m") != 1 || b.Running() != 0 {
		t.Fatalf("after routing to a: a=%d b=%d", a.Running(), b.Running())
	}
	// The pod refused the connection: the attempt fails, the request is
	// routed again.
	first.Close(Failed, "connection_refused")
	second := r.Route(Route{Pod: b, UncachedTokens: 100, PrefillSeconds: 0.01})
	if a.Running() != 0 || b.Running() != 1 || a.Queue(clock.Now(), time.Time{}, 0).Prefills != 0 {
		t.Fatalf("after the retry on b: a=%d b=%d, a's queue %+v", a.Running(), b.Running(), a.Queue(clock.Now(), time.Time{}, 0))
	}
	if got := l.Model("m"); got != (ModelCounts{Pending: 1, Routed: 1}) {
		t.Fatalf("model counts %+v, want 1 pending, 1 routed", got)
	}
	// Routing again with an attempt open closes it.
	third := r.Route(Route{Pod: a})
	if o, reason := second.Outcome(); o != Failed || reason != "rerouted" || b.Running() != 0 || a.Running() != 1 {
		t.Fatalf("the open attempt closed as %q (%s); a=%d b=%d", o, reason, a.Running(), b.Running())
	}
	r.End()
	if o, _ := third.Outcome(); o != Cancelled || a.Running() != 0 || l.Model("m") != (ModelCounts{}) || l.Tracked() != 0 {
		t.Fatalf("after End: attempt %q, a=%d, model %+v, tracked %d", o, a.Running(), l.Model("m"), l.Tracked())
	}
	if h := r.Route(Route{Pod: a}); h.Close(Done, "") || a.Running() != 0 {
		t.Fatalf("routing an ended request opened an attempt: a=%d", a.Running())
	}
}

func TestRunningCountsPerModelAndOtherReplicas(t *testing.T) {
	clock := newManualClock()
	l, _ := newTestLedger(t, clock)
	pod := NewPodLoad("ns/p")
	var hs []*Handle
	for _, model := range []string{"base", "lora", "lora"} {
		hs = append(hs, l.Admit("r", model).Route(Route{Pod: pod, PendingLoad: 0.25}))
	}
	if pod.Running() != 3 || pod.RunningModel("base") != 1 || pod.RunningModel("lora") != 2 || pod.PendingLoad() != 0.75 {
		t.Fatalf("pod %d base %d lora %d pending %v, want 3, 1, 2, 0.75", pod.Running(), pod.RunningModel("base"),
			pod.RunningModel("lora"), pod.PendingLoad())
	}
	pod.SetRemote(5, map[string]int64{"lora": 4})
	if pod.Running() != 8 || pod.RunningModel("lora") != 6 || pod.Local()["lora"] != 2 {
		t.Fatalf("with other replicas: pod %d lora %d local %v", pod.Running(), pod.RunningModel("lora"), pod.Local())
	}
	pod.SetRemote(0, nil)
	hs[1].Close(Done, "")
	if pod.RunningModel("lora") != 1 || pod.Running() != 2 {
		t.Fatalf("lora after one close = %d, pod %d; want 1, 2", pod.RunningModel("lora"), pod.Running())
	}
	hs[0].Close(Done, "")
	hs[2].Close(Done, "")
	if pod.PendingLoad() != 0 || len(pod.Local()) != 0 {
		t.Fatalf("after every close: pending %v, local %v", pod.PendingLoad(), pod.Local())
	}
}

func TestRequestsWithoutAnEndExpire(t *testing.T) {
	clock := newManualClock()
	l, reg := newTestLedger(t, clock)
	a, b := NewPodLoad("ns/a"), NewPodLoad("ns/b")
	lost := send(l, a, 100, 0.01)
	send(l, b, 100, 0.01)
	clock.Advance(30 * time.Second)
	kept := send(l, a, 100, 0.01)
	queued := l.Admit("queued", "m") // never routed
	clock.Advance(31 * time.Second)

	// The requests admitted 61 s ago are reaped, on every pod: their
	// attempts expire, their prefills leave the queues, and only them.
	l.reap(clock.Now())
	if q := a.Queue(clock.Now(), time.Time{}, 0); q.Prefills != 1 || a.Running() != 1 || b.Running() != 0 || b.Queue(clock.Now(), time.Time{}, 0).Prefills != 0 {
		t.Fatalf("after 61 s: a %+v running %d, b running %d; want a's newer request left", q, a.Running(), b.Running())
	}
	if o, _ := lost.Outcome(); o != Expired || l.Tracked() != 2 {
		t.Fatalf("lost attempt %q, %d tracked; want expired, 2 tracked", o, l.Tracked())
	}
	for name, want := range map[string]float64{"kvgate_cache_requests_expired_total": 2, "kvgate_routing_inflight_prefills_expired_total": 2} {
		if n := testsupport.MetricValue(t, reg, name, nil); n != want {
			t.Fatalf("%s = %v, want %v", name, n, want)
		}
	}
	// A close arriving after the reaper is ignored and counted.
	lost.Close(Done, "")
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_request_done_ignored_total", map[string]string{"reason": "expired"}); n != 1 {
		t.Fatalf("closes of expired attempts ignored %v times, want 1", n)
	}
	clock.Advance(time.Minute)
	l.reap(clock.Now())
	if o, _ := kept.Outcome(); o != Expired || l.Tracked() != 0 || l.Model("m") != (ModelCounts{}) {
		t.Fatalf("a minute later: attempt %q, tracked %d, model %+v", o, l.Tracked(), l.Model("m"))
	}
	if h := queued.Route(Route{Pod: a}); a.Running() != 0 {
		t.Fatalf("a reaped request was routed: %v", h)
	}
}

func TestRunReapsOnItsOwnUntilStopped(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, err := New(Config{TTL: 50 * time.Millisecond, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	pod := NewPodLoad("ns/p")
	l.Admit("lost", "m").Route(Route{Pod: pod})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	testsupport.EventuallyWhy(t, "the lost request to expire", func() (string, bool) {
		return fmt.Sprint("running ", pod.Running()), pod.Running() == 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_requests_expired_total", nil); n != 1 {
		t.Fatalf("expired = %v, want 1", n)
	}
	if _, err := New(Config{TTL: -1}); err == nil {
		t.Fatal("a negative TTL was accepted")
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
			l, _ := newTestLedger(t, clock)
			pod := NewPodLoad("ns/a")
			t0 := clock.Now()
			at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
			var hs []*Handle
			for _, ms := range []int{0, 10, 30} {
				clock.Advance(at(ms).Sub(clock.Now()))
				hs = append(hs, send(l, pod, 100, 0.001))
			}
			clock.Advance(at(40).Sub(clock.Now()))
			if tt.ended > 0 {
				hs[tt.ended-1].FirstToken() // and so the ones before
			}
			if n := pod.Queue(clock.Now(), at(20), tt.waiting).WaitingEnded; n != tt.want {
				t.Fatalf("against the scrape: %d ended, want %d", n, tt.want)
			}
			// A scrape after the ends counts none of them.
			if n := pod.Queue(clock.Now(), at(40), tt.waiting).WaitingEnded; n != 0 {
				t.Fatalf("against a scrape at the ends: %d, want 0", n)
			}
			if n := pod.Queue(clock.Now(), time.Time{}, tt.waiting).WaitingEnded; n != 0 {
				t.Fatalf("without a scrape: %d, want 0", n)
			}
		})
	}
}

func TestPrefillsSinceCountsTheQueuedPrefillsOpenedSinceAScrape(t *testing.T) {
	// Prefills open at 0, 10, 20 and 30 ms; the engine is scraped at 15 ms.
	clock := newManualClock()
	l, _ := newTestLedger(t, clock)
	pod := NewPodLoad("ns/a")
	t0 := clock.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var hs []*Handle
	for _, ms := range []int{0, 10, 20, 30} {
		clock.Advance(at(ms).Sub(clock.Now()))
		hs = append(hs, send(l, pod, 100, 0.001))
	}
	if n := pod.PrefillsSince(at(15)); n != 2 {
		t.Fatalf("after the scrape: %d, want the 2 opened since", n)
	}
	if n := pod.PrefillsSince(at(20)); n != 2 {
		t.Fatalf("since the instant one opened: %d, want it counted", n)
	}
	if n := pod.PrefillsSince(time.Time{}); n != 4 {
		t.Fatalf("since ever: %d, want every queued prefill", n)
	}
	// The third's first token ends its prefill and the two before it;
	// the fourth's is still queued.
	hs[2].FirstToken()
	if n := pod.PrefillsSince(at(15)); n != 1 {
		t.Fatalf("after a first token: %d, want the one still queued", n)
	}
	hs[3].Close(Done, "")
	if n := pod.PrefillsSince(at(15)); n != 0 {
		t.Fatalf("once every prefill left the queue: %d, want 0", n)
	}
	if n := NewPodLoad("ns/b").PrefillsSince(at(15)); n != 0 {
		t.Fatalf("another pod: %d, want 0", n)
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

// TestPrefilledLogCountsAsAScanWould checks the count kept between scrapes
// against a scan of every prefill the log was given, through adds and
// scrapes in random order: repeated scrapes, newer ones, an older one read
// late, ends at and before a scrape, and the log's halving.
func TestPrefilledLogCountsAsAScanWould(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var l prefilledLog
	var all []prefilled
	t0 := time.Unix(1000, 0)
	now, scrape := t0, t0
	for i := range 20000 {
		switch r := rng.IntN(10); {
		case r < 6:
			now = now.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
			start := now.Add(-time.Duration(rng.IntN(200)) * time.Millisecond)
			l.add(start, now)
			all = append(all, prefilled{start, now})
		case r < 8:
			scrape = now.Add(-time.Duration(rng.IntN(20)) * time.Millisecond)
		}
		at := scrape
		if rng.IntN(20) == 0 {
			at = scrape.Add(-time.Duration(rng.IntN(50)) * time.Millisecond) // a decision reading an older scrape
		}
		got := l.since(at)
		// The log forgets what ended by a scrape it was asked about, and
		// the oldest half past its bound: a scan of what it still holds
		// must agree, and never count more than every prefill given would.
		want, bound := 0, 0
		for _, e := range l.entries {
			if e.start.Before(at) && e.end.After(at) {
				want++
			}
		}
		for _, e := range all {
			if e.start.Before(at) && e.end.After(at) {
				bound++
			}
		}
		if got != want || got > bound {
			t.Fatalf("step %d: since(%v) = %d, a scan of the log gives %d, of every prefill %d", i, at.Sub(t0), got, want, bound)
		}
	}
}

func TestObserversSeeEveryStep(t *testing.T) {
	clock := newManualClock()
	l, _ := newTestLedger(t, clock)
	var mu sync.Mutex
	var seen []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, s)
	}
	l.Observe(Observer{
		Admitted:   func(r *Request) { note("admitted " + r.ID()) },
		Opened:     func(h *Handle) { note(fmt.Sprintf("opened %s on %s", h.Request().ID(), h.Route().Pod.ID())) },
		FirstToken: func(h *Handle) { note(fmt.Sprint("first token after ", h.FirstTokenAt().Sub(h.Opened()))) },
		Closed: func(h *Handle) {
			o, reason := h.Outcome()
			u, ok := h.Usage()
			note(fmt.Sprintf("closed %s (%s) usage {%d %d} %v", o, reason, u.PromptTokens, u.CompletionTokens, ok))
		},
	})
	l.Observe(Observer{Closed: func(*Handle) { note("second observer") }})
	r := l.Admit("r1", "m")
	r.Route(Route{Pod: NewPodLoad("ns/a")}).Close(Failed, "dial")
	h := r.Route(Route{Pod: NewPodLoad("ns/b")})
	clock.Advance(20 * time.Millisecond)
	h.FirstToken()
	h.ReportUsage(Usage{PromptTokens: 10, CompletionTokens: 3})
	h.Close(Done, "")
	r.End()
	want := []string{"admitted r1", "opened r1 on ns/a", "closed failed (dial) usage {0 0} false", "second observer",
		"opened r1 on ns/b", "first token after 20ms", "closed done () usage {10 3} true", "second observer"}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("observers saw\n%q\nwant\n%q", seen, want)
	}
}

func TestARequestReapedWhileItIsReroutedLeavesNothingOnThePods(t *testing.T) {
	clock := newManualClock()
	l, _ := newTestLedger(t, clock)
	a, b := NewPodLoad("ns/a"), NewPodLoad("ns/b")
	r := l.Admit("r1", "m")
	first := r.Route(Route{Pod: a, UncachedTokens: 100, PrefillSeconds: 0.01, PendingLoad: 0.5})
	clock.Advance(2 * time.Minute) // past the TTL
	var mu sync.Mutex
	var seen []string
	note := func(what string, h *Handle) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, what+" "+h.Route().Pod.ID())
	}
	l.Observe(Observer{
		Opened: func(h *Handle) { note("opened", h) },
		Closed: func(h *Handle) {
			note("closed", h)
			if h == first {
				// The reaper's goroutine runs while the request is routed
				// again, as its first attempt closes.
				l.reap(clock.Now())
			}
		},
	})
	second := r.Route(Route{Pod: b, UncachedTokens: 100, PrefillSeconds: 0.01, PendingLoad: 0.5})
	if o, _ := second.Outcome(); o == "" {
		t.Errorf("the attempt of the reaped request is open")
	}
	for _, p := range []*PodLoad{a, b} {
		if q := p.Queue(clock.Now(), time.Time{}, 0); p.Running() != 0 || p.RunningModel("m") != 0 || p.PendingLoad() != 0 || q.Prefills != 0 {
			t.Errorf("%s: running %d, for m %d, pending %v, queue %+v; want nothing left", p.ID(), p.Running(),
				p.RunningModel("m"), p.PendingLoad(), q)
		}
	}
	if l.Tracked() != 0 || len(l.Models()) != 0 || l.prefills.Load() != 0 {
		t.Errorf("left: tracked %d, models %v, prefills %d", l.Tracked(), l.Models(), l.prefills.Load())
	}
	// Observers see an attempt closed after it opened, or not at all.
	mu.Lock()
	defer mu.Unlock()
	if i, j := slices.Index(seen, "opened ns/b"), slices.Index(seen, "closed ns/b"); (i < 0) != (j < 0) || j < i {
		t.Errorf("observers saw %q: the attempt on b closed before it opened", seen)
	}
}

func TestLedgerIsConsistentUnderConcurrency(t *testing.T) {
	l, err := New(Config{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	pods := []*PodLoad{NewPodLoad("ns/a"), NewPodLoad("ns/b"), NewPodLoad("ns/c")}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				r := l.Admit(fmt.Sprintf("w%d-%d", g, i), "m")
				h := r.Route(Route{Pod: pods[(g+i)%3], UncachedTokens: 10, PrefillSeconds: 0.001, PendingLoad: 0.1})
				pods[i%3].Queue(time.Now(), time.Now(), 1)
				if i%3 == 0 {
					h.Close(Failed, "dial")
					h = r.Route(Route{Pod: pods[(g+i+1)%3], UncachedTokens: 10, PrefillSeconds: 0.001})
				}
				if i%2 == 0 {
					h.FirstToken()
					h.ReportUsage(Usage{PromptTokens: 100, CompletionTokens: 10})
				}
				h.Close(Done, "")
				h.Close(Done, "")
				r.End()
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			l.reap(time.Now())
		}
	})
	wg.Wait()
	for _, p := range pods {
		if q := p.Queue(time.Now(), time.Time{}, 0); p.Running() != 0 || p.PendingLoad() != 0 || q.Prefills != 0 || q.Tokens != 0 {
			t.Fatalf("%s: running %d, pending %v, queue %+v; want nothing left", p.ID(), p.Running(), p.PendingLoad(), q)
		}
		if n := len(p.prefilled.entries); n > 2*maxPrefilled {
			t.Fatalf("%s remembers %d ended prefills, more than %d", p.ID(), n, 2*maxPrefilled)
		}
	}
	if l.Tracked() != 0 || len(l.Models()) != 0 || l.prefills.Load() != 0 || l.prefillTokens.Load() != 0 {
		t.Fatalf("left: tracked %d, models %v, prefills %d, tokens %d", l.Tracked(), l.Models(), l.prefills.Load(), l.prefillTokens.Load())
	}
}

func BenchmarkAdmitRouteClose(b *testing.B) {
	l, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	pods := make([]*PodLoad, 8)
	for i := range pods {
		pods[i] = NewPodLoad(fmt.Sprint("ns/p", i))
	}
	var worker atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := int(worker.Add(1))
		for i := 0; pb.Next(); i++ {
			r := l.Admit("bench", "m")
			h := r.Route(Route{Pod: pods[(w+i)%len(pods)], UncachedTokens: 512, PrefillSeconds: 0.05})
			h.FirstToken()
			h.ReportUsage(Usage{PromptTokens: 512, CompletionTokens: 128})
			h.Close(Done, "")
			r.End()
		}
	})
}

func TestRemoteBlocksReplaceOneAnother(t *testing.T) {
	p := NewPodLoad("ns/p")
	if p.HasRemoteBlocks() || p.RemoteBlock(1) {
		t.Fatal("a new record holds remote blocks")
	}
	p.SetRemoteBlocks([]uint64{1, 2})
	if !p.HasRemoteBlocks() || !p.RemoteBlock(1) || !p.RemoteBlock(2) || p.RemoteBlock(3) {
		t.Fatal("remote blocks 1 and 2 not held as set")
	}
	p.SetRemoteBlocks([]uint64{3})
	if p.RemoteBlock(1) || !p.RemoteBlock(3) {
		t.Fatal("a setting did not replace the previous one")
	}
	p.SetRemoteBlocks(nil)
	if p.HasRemoteBlocks() {
		t.Fatal("an empty setting left blocks")
	}
}

func TestFreeingCapacityHoldsFreesUntilTheObserversHeardOfIt(t *testing.T) {
	var frees sync.RWMutex
	l, err := New(Config{TTL: time.Minute, Frees: &frees})
	if err != nil {
		t.Fatal(err)
	}
	pod := NewPodLoad("ns/p")
	var heard []string
	held := func(what string) func(*Handle) {
		return func(*Handle) {
			// A reader of the pods' load cannot look while capacity is
			// freed: the pod's counts and this news come together.
			if frees.TryRLock() {
				frees.RUnlock()
				t.Errorf("%s: Frees is not held while the observers run", what)
			}
			heard = append(heard, fmt.Sprintf("%s running=%d prefills=%d", what, pod.Running(), l.prefills.Load()))
		}
	}
	l.Observe(Observer{FirstToken: held("first token"), Closed: held("closed"),
		Opened: func(*Handle) {
			if !frees.TryRLock() {
				t.Error("Frees is held while an attempt opens, which frees nothing")
				return
			}
			frees.RUnlock()
		}})
	h := l.Admit("r", "m").Route(Route{Pod: pod, UncachedTokens: 10, PrefillSeconds: 0.001})
	h.FirstToken()
	h.Close(Done, "")
	if want := []string{"first token running=1 prefills=0", "closed running=0 prefills=0"}; !slices.Equal(heard, want) {
		t.Errorf("observers heard %q, want %q", heard, want)
	}
	if !frees.TryLock() {
		t.Fatal("Frees is still held after the attempt closed")
	}
}
