package routing

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Prefill is a prefill this gateway started on a pod: a request sent with
// its predicted uncached prompt tokens, counted as queued work on the pod
// until its first token comes back. Its methods are safe for concurrent use
// and on a nil *Prefill, where they do nothing.
type Prefill struct {
	ledger *podLedger
	book   *inflight

	tokens int
	// work is the predicted prefill time in seconds, start the time the
	// prefill was started.
	work  float64
	start time.Time
	// predicted is the predicted time to first token in seconds, 0 when
	// the decision did not predict one.
	predicted float64

	// prev, next and pending are guarded by ledger.mu.
	prev, next *Prefill
	pending    bool
	ended      atomic.Bool
}

// FirstToken reports that the request's first token came back: its
// prefill, and that of every request started on the pod before it, is done.
// The time since StartPrefill is compared with the predicted time to first
// token in kvgate_routing_ttft_prediction_ratio. Only the first call of
// FirstToken or Done counts.
func (p *Prefill) FirstToken() {
	if p == nil || !p.ended.CompareAndSwap(false, true) {
		return
	}
	now := p.book.now()
	if p.predicted > 0 && p.book.observeTTFT != nil {
		p.book.observeTTFT(now.Sub(p.start).Seconds() / p.predicted)
	}
	p.book.end(p, now, true)
}

// Done reports that the request ended (completed, failed or was cancelled)
// or that the gateway cannot tell when its first token came, as for a
// response it does not stream: the prefill stops counting. Calling it after
// FirstToken, or again, does nothing, so a handler may defer it.
func (p *Prefill) Done() {
	if p == nil || !p.ended.CompareAndSwap(false, true) {
		return
	}
	p.book.end(p, p.book.now(), false)
}

// inflight accounts for the prefills this gateway started, per pod. Each
// pod's prefills form a FIFO queue drained at the speed predicted when each
// was started; see the package documentation for the model.
type inflight struct {
	now         func() time.Time
	ttl         time.Duration
	observeTTFT func(ratio float64)
	onExpire    func(n int)

	pods      sync.Map // pod key -> *podLedger
	count     atomic.Int64
	tokens    atomic.Int64
	nextSweep atomic.Int64 // unix nanoseconds
}

// podLedger is the queue of one pod's pending prefills, oldest first.
type podLedger struct {
	key        string
	mu         sync.Mutex
	head, tail *Prefill
	n, tokens  int
	// finish is when the pending prefills are predicted to be done.
	finish time.Time
	// prefilled remembers the prefills that ended.
	prefilled prefilledLog
	// dead marks a ledger removed from inflight.pods; a start that finds
	// it looks the pod up again.
	dead bool
}

// podQueue is what a decision reads of a pod's in-flight prefills.
type podQueue struct {
	prefills, tokens int
	seconds          float64
	// waitingEnded estimates how many of the requests a scrape counted as
	// waiting were prefills of this book that have ended since.
	waitingEnded int
}

// start records a prefill of tokens on pod key, predicted to take work
// seconds and to produce its first token predicted seconds from now.
func (in *inflight) start(key string, tokens int, work, predicted float64) *Prefill {
	now := in.now()
	in.maybeSweep(now)
	p := &Prefill{book: in, tokens: tokens, work: work, start: now, predicted: predicted, pending: true}
	for {
		l := in.ledger(key)
		l.mu.Lock()
		if l.dead {
			l.mu.Unlock()
			continue
		}
		l.expire(in, now)
		p.ledger = l
		if l.tail == nil {
			l.head = p
		} else {
			l.tail.next, p.prev = p, l.tail
		}
		l.tail = p
		l.n++
		l.tokens += tokens
		l.finish = later(l.finish, now).Add(seconds(work))
		l.mu.Unlock()
		break
	}
	in.count.Add(1)
	in.tokens.Add(int64(tokens))
	return p
}

// ledger returns the live ledger of pod key, creating it.
func (in *inflight) ledger(key string) *podLedger {
	if v, ok := in.pods.Load(key); ok {
		return v.(*podLedger)
	}
	v, _ := in.pods.LoadOrStore(key, &podLedger{key: key})
	return v.(*podLedger)
}

// end removes p and the pod's prefills started before it, which vLLM's
// first-come first-served scheduling prefills first. timed reports that p's
// prefill ended just now (its first token), so that the prefills after it,
// queued behind it, are predicted done their own work from now. Otherwise p
// ended some time before now and the prediction only gets no later than
// that.
func (in *inflight) end(p *Prefill, now time.Time, timed bool) {
	l := p.ledger
	l.mu.Lock()
	defer l.mu.Unlock()
	if !p.pending {
		return
	}
	for {
		e := l.head
		l.remove(in, e)
		l.prefilled.add(e.start, now)
		if e == p {
			break
		}
	}
	remaining := 0.0
	for e := l.head; e != nil; e = e.next {
		remaining += e.work
	}
	finish := now.Add(seconds(remaining))
	if timed {
		l.finish = finish
	} else {
		l.finish = earlier(l.finish, finish)
	}
	l.retireIfEmpty(in)
}

// queue returns the pod's pending prefills and the prefill work predicted
// ahead of a request started at now, and how many of the waiting requests a
// scrape at scrapedAt counted are prefills that have ended since (none when
// scrapedAt is zero).
func (in *inflight) queue(key string, now, scrapedAt time.Time, waiting float64) podQueue {
	v, ok := in.pods.Load(key)
	if !ok {
		return podQueue{}
	}
	l := v.(*podLedger)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(in, now)
	q := podQueue{prefills: l.n, tokens: l.tokens}
	if l.n > 0 && l.finish.After(now) {
		q.seconds = l.finish.Sub(now).Seconds()
	}
	if !scrapedAt.IsZero() {
		q.waitingEnded = l.waitingEnded(scrapedAt, waiting)
	}
	l.retireIfEmpty(in)
	return q
}

// waitingEnded estimates how many of the waiting requests a scrape at
// scrapedAt counted are prefills that have ended since; l.mu is held. The
// engine prefills in the order requests arrive, so of the prefills pending
// at the scrape, the oldest were running and at most the newest waiting
// ones were waiting; prefills end in the same order.
func (l *podLedger) waitingEnded(scrapedAt time.Time, waiting float64) int {
	ended := l.prefilled.since(scrapedAt)
	pending := ended
	for e := l.head; e != nil && e.start.Before(scrapedAt); e = e.next {
		pending++
	}
	running := max(pending-int(math.Round(waiting)), 0)
	return max(ended-running, 0)
}

// maybeSweep expires old prefills of every pod, at most every quarter of
// the TTL, so that the prefills of a pod nobody routes to any more do not
// stay forever.
func (in *inflight) maybeSweep(now time.Time) {
	next := in.nextSweep.Load()
	if now.UnixNano() < next || !in.nextSweep.CompareAndSwap(next, now.Add(in.ttl/4).UnixNano()) {
		return
	}
	in.pods.Range(func(_, v any) bool {
		l := v.(*podLedger)
		l.mu.Lock()
		l.expire(in, now)
		l.retireIfEmpty(in)
		l.mu.Unlock()
		return true
	})
}

// expire drops the prefills started more than the TTL before now, and
// forgets those that ended longer ago; l.mu is held.
func (l *podLedger) expire(in *inflight, now time.Time) {
	l.prefilled.expire(now.Add(-in.ttl))
	n := 0
	for l.head != nil && now.Sub(l.head.start) > in.ttl {
		l.remove(in, l.head)
		n++
	}
	if n > 0 && in.onExpire != nil {
		in.onExpire(n)
	}
}

// remove unlinks pending prefill e; l.mu is held.
func (l *podLedger) remove(in *inflight, e *Prefill) {
	if e.prev == nil {
		l.head = e.next
	} else {
		e.prev.next = e.next
	}
	if e.next == nil {
		l.tail = e.prev
	} else {
		e.next.prev = e.prev
	}
	e.prev, e.next, e.pending = nil, nil, false
	l.n--
	l.tokens -= e.tokens
	in.count.Add(-1)
	in.tokens.Add(-int64(e.tokens))
}

// retireIfEmpty removes a ledger with nothing pending or remembered from
// inflight.pods; l.mu is held.
func (l *podLedger) retireIfEmpty(in *inflight) {
	if l.head == nil && len(l.prefilled.entries) == 0 && !l.dead {
		l.dead = true
		in.pods.CompareAndDelete(l.key, l)
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
