package inflight

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// DefaultTTL is how long a request may stay admitted without ending before
// it is reaped.
const DefaultTTL = time.Hour

// Config configures a Ledger.
type Config struct {
	// TTL is how long a request may stay in flight without Request.End
	// before the ledger reaps it (KVGATE_REQUEST_TTL_SECONDS, default
	// DefaultTTL). It bounds what a lost end costs: a request counted as
	// running on a pod, or a prefill counted as queued, for that long.
	TTL time.Duration
	// Now is the ledger's clock (default time.Now); a simulation passes
	// its virtual clock.
	Now func() time.Time
	// Registerer receives the ledger's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives the ledger's logs (default klog.Background()).
	Logger klog.Logger
	// Frees, when set, is locked while an attempt frees capacity (its
	// first token ends its prefill, its close ends it) and the observers
	// hear of it, so that a reader holding it sees a pod's load and the
	// news of its change together (the SLO queues do, see slo.Config).
	Frees sync.Locker
}

// Observer is told of the requests and attempts of a ledger; any of its
// functions may be nil. They are called synchronously, from the goroutine
// driving the request (or the reaper's, for an expired request), and must
// return quickly; they may read what they are given but not drive it.
type Observer struct {
	// Admitted is called when a request is admitted.
	Admitted func(*Request)
	// Opened is called when an attempt is opened.
	Opened func(*Handle)
	// FirstToken is called when an attempt reports its first token.
	FirstToken func(*Handle)
	// Closed is called when an attempt is closed, with its outcome and,
	// when reported, its usage.
	Closed func(*Handle)
}

// ModelCounts counts the requests in flight for one model: Pending were
// admitted and have not ended, Routed is the part of them routed at least
// once. Pending - Routed are queueing.
type ModelCounts struct {
	Pending, Routed int64
}

// requestShards spreads admitted requests over lists with locks of their
// own, so that concurrent requests rarely share one.
const requestShards = 32

// Ledger is the ledger of the requests in flight (see the package
// documentation). All its methods are safe for concurrent use.
type Ledger struct {
	ttl     time.Duration
	now     func() time.Time
	log     klog.Logger
	frees   sync.Locker
	metrics *ledgerMetrics

	observers atomic.Pointer[[]Observer]

	nextShard atomic.Uint32
	shards    [requestShards]requestShard
	tracked   atomic.Int64

	// prefills and prefillTokens count the queued prefills of every pod.
	prefills, prefillTokens atomic.Int64

	modelsMu sync.Mutex
	models   map[string]ModelCounts
}

// requestShard holds some of the requests in flight, oldest first.
type requestShard struct {
	mu         sync.Mutex
	head, tail *Request
}

// New returns an empty ledger with its metrics registered. It fails when
// cfg.TTL is negative or the metrics cannot be registered.
func New(cfg Config) (*Ledger, error) {
	if cfg.TTL < 0 {
		return nil, fmt.Errorf("invalid request ledger config: TTL %v is negative", cfg.TTL)
	}
	l := &Ledger{
		ttl:    cmp.Or(cfg.TTL, DefaultTTL),
		now:    cfg.Now,
		log:    cfg.Logger,
		frees:  cfg.Frees,
		models: map[string]ModelCounts{},
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.log.GetSink() == nil {
		l.log = klog.Background()
	}
	l.log = l.log.WithName("inflight")
	l.observers.Store(&[]Observer{})
	m, err := newLedgerMetrics(cfg.Registerer, l)
	if err != nil {
		return nil, err
	}
	l.metrics = m
	return l, nil
}

// Observe adds o to the ledger's observers; it sees the requests admitted
// and the attempts opened from then on.
func (l *Ledger) Observe(o Observer) {
	for {
		cur := l.observers.Load()
		next := append(append(make([]Observer, 0, len(*cur)+1), *cur...), o)
		if l.observers.CompareAndSwap(cur, &next) {
			return
		}
	}
}

// Run reaps the requests in flight for longer than the TTL, every quarter
// of the TTL (between 10 ms and a minute), until ctx ends; it then returns
// nil.
func (l *Ledger) Run(ctx context.Context) error {
	t := time.NewTicker(max(min(l.ttl/4, time.Minute), 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			l.reap(l.now())
		}
	}
}

// Admit records that request id asking for model arrived, and returns its
// record: it counts as queued for model until it is routed. ids are for
// logs and observers; the ledger does not require them to be unique.
func (l *Ledger) Admit(id, model string) *Request {
	s := &l.shards[l.nextShard.Add(1)%requestShards]
	r := &Request{ledger: l, id: id, model: model, home: s}
	s.mu.Lock()
	r.admitted = l.now()
	r.linked = true
	if s.tail == nil {
		s.head = r
	} else {
		s.tail.next, r.prev = r, s.tail
	}
	s.tail = r
	s.mu.Unlock()
	l.tracked.Add(1)
	l.adjustModel(model, 1, 0)
	for _, o := range *l.observers.Load() {
		if o.Admitted != nil {
			o.Admitted(r)
		}
	}
	return r
}

// Models returns the counts of every model with requests in flight.
func (l *Ledger) Models() map[string]ModelCounts {
	l.modelsMu.Lock()
	defer l.modelsMu.Unlock()
	return maps.Clone(l.models)
}

// Model returns the counts of model.
func (l *Ledger) Model(model string) ModelCounts {
	l.modelsMu.Lock()
	defer l.modelsMu.Unlock()
	return l.models[model]
}

// Tracked returns the number of requests in flight.
func (l *Ledger) Tracked() int { return int(l.tracked.Load()) }

func (l *Ledger) adjustModel(model string, pending, routed int64) {
	l.modelsMu.Lock()
	defer l.modelsMu.Unlock()
	m := l.models[model]
	m.Pending += pending
	m.Routed += routed
	if m.Pending <= 0 {
		delete(l.models, model)
		return
	}
	l.models[model] = m
}

// reap ends the requests admitted more than the TTL before now, closing
// their attempts as Expired, and counts them.
func (l *Ledger) reap(now time.Time) {
	cutoff := now.Add(-l.ttl)
	var expired []*Request
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		for s.head != nil && s.head.admitted.Before(cutoff) {
			r := s.head
			s.unlinkLocked(r)
			expired = append(expired, r)
		}
		s.mu.Unlock()
	}
	n := 0
	for _, r := range expired {
		if r.end(Expired, "ttl") {
			n++
		}
	}
	if n > 0 {
		l.metrics.requestsExpired.Add(float64(n))
		l.log.Info("Dropped requests in flight without an end", "count", n, "ttl", l.ttl)
	}
}

// unlinkLocked removes r, one of the shard's requests, from its list if it
// is still there; s.mu is held.
func (s *requestShard) unlinkLocked(r *Request) {
	if !r.linked {
		return
	}
	if r.prev == nil {
		s.head = r.next
	} else {
		r.prev.next = r.next
	}
	if r.next == nil {
		s.tail = r.prev
	} else {
		r.next.prev = r.prev
	}
	r.prev, r.next, r.linked = nil, nil, false
}
