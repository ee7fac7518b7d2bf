package slo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/types"
)

// contendedFor is how long a queue counts as contended after a request
// last waited in it or was refused for want of capacity (see
// types.RoutingContext's SLOContended): a queue that just emptied is
// likely to fill again.
const contendedFor = 2 * time.Second

// maxWaitsPerPass bounds how many waiting requests one pass tries, in
// queue order, after the last it could route: a pass that finds the
// fleet full stops trying instead of predicting for every request queued.
const maxWaitsPerPass = 8

// maxRestartsPerPass bounds how many times one Dispatch goes back to the
// first waiting request because capacity may have freed while it tried
// the ones after it (see Dispatch).
const maxRestartsPerPass = 4

// Entry is one request in a QueueRouter: its priority and deadline, and how
// to route it.
type Entry struct {
	// Request is the request's routing context, for logs and the debug
	// API; the queue reads its ID, its arrival, its prompt's length and
	// its Priority, which orders the queue before Deadline: higher first.
	// The queue reads Priority once, when the request is submitted.
	Request *types.RoutingContext
	// Deadline orders the requests of equal priority, earliest first: when
	// the request's SLO expires (see DeadlineOf).
	Deadline time.Time
	// Try routes the request now. It returns nil when it routed it (the
	// request's attempt is open), an error wrapping
	// cache.ErrLoadCapacityReached (an *routing.SLOError says how long the
	// request can still wait) when no pod can take it yet, and any other
	// error when it can never be routed. The queue calls it with no lock
	// of its own held but one decision at a time per model, so that each
	// sees the load the previous one added; it must not block.
	Try func() error
	// Done, when set, is called once the request left the queue: routed
	// (nil), refused or expired (an *Error), or with Try's own error when
	// Try found it could never be routed (no pod is left to route to). It
	// is not called for a request its caller cancelled (see Cancel).
	Done func(error)
	// Waiting, when set, is called by Route once the request waits in the
	// queue, on Route's goroutine before it waits, with the latest time it
	// leaves the queue: routed, refused or expired.
	Waiting func(until time.Time)

	priority int    // Request.Priority as submitted
	flow     string // Request.FairnessID as submitted
	// counted is e's flow in its queue's band, with FairnessRoundRobin,
	// while e waits; guarded by the QueueRouter's mu.
	counted *flowCount

	// guarded by the QueueRouter's mu
	queued    bool
	trying    bool
	cancelled bool
	closing   string // Close's reason, for an entry a pass was trying
	enqueued  time.Time
	latest    time.Time // when it can no longer meet its SLO
	drain     time.Duration
	tries     int

	done chan struct{}
	err  error
}

// DeadlineOf returns when rc's SLO expires: its arrival plus its
// time-to-first-token target, else its end-to-end target, else maxWait.
func DeadlineOf(rc *types.RoutingContext, maxWait time.Duration) time.Time {
	switch {
	case rc.SLO.TTFTFor(rc.InputTokens()) > 0:
		return rc.ReceivedAt.Add(rc.SLO.TTFTFor(rc.InputTokens()))
	case rc.SLO.E2E > 0:
		return rc.ReceivedAt.Add(rc.SLO.E2E)
	}
	return rc.ReceivedAt.Add(maxWait)
}

// Reasons a request is refused or leaves a queue without a pod.
const (
	// ReasonQueueFull: the model's queue holds its maximum.
	ReasonQueueFull = "queue_full"
	// ReasonUnmeetable: no pod could meet the request's SLO even idle.
	ReasonUnmeetable = "slo_unmeetable"
	// ReasonNoCapacity: no pod can take the request within its SLO now,
	// and its algorithm does not wait (slo-least-load).
	ReasonNoCapacity = "no_capacity"
	// ReasonSheddable: the request is sheddable (a negative priority) and
	// would have had to wait: no pod could take it within its SLO, or
	// requests of its model were waiting already.
	ReasonSheddable = "sheddable"
	// ReasonExpired: the request waited until it could no longer meet its
	// SLO, or for the longest wait allowed.
	ReasonExpired = "expired"
	// ReasonDisplaced: the request waited in a full queue and a request
	// of a higher priority took its place, or, with FairnessRoundRobin,
	// one of a flow with fewer requests waiting (see QueueRouter.Submit).
	ReasonDisplaced = "displaced"
	// ReasonModelGone: the model left the fleet while the request waited.
	ReasonModelGone = "model_gone"
	// ReasonStopped: the gateway is shutting down.
	ReasonStopped = "stopped"
)

// Error reports a request that a queue refused or that left it without a
// pod. Front ends answer it with 429 and a Retry-After of RetryAfter,
// except ReasonModelGone and ReasonStopped (503).
type Error struct {
	Model  string
	Reason string
	// RetryAfter estimates when a pod could take a request again, in
	// whole seconds, from one second to the queue's MaxWait.
	RetryAfter time.Duration
	// Waited is how long the request was queued.
	Waited time.Duration
	// Err is the routing error that decided, if any.
	Err error
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("model %q: ", e.Model)
	switch e.Reason {
	case ReasonQueueFull:
		msg += "the queue of requests waiting for capacity is full"
	case ReasonUnmeetable:
		msg += "no pod can serve the request within its service-level objective"
	case ReasonNoCapacity:
		msg += "no pod can serve the request within its service-level objective now"
	case ReasonSheddable:
		msg += "the request is sheddable and would have to wait for a pod to serve it within its service-level objective"
	case ReasonExpired:
		msg += fmt.Sprintf("no pod could serve the request within its service-level objective after waiting %v",
			e.Waited.Round(time.Millisecond))
	case ReasonDisplaced:
		msg += "a request of a higher priority, or of a flow with fewer requests waiting, took the request's place in the full queue"
	case ReasonModelGone:
		msg += "the model left the fleet while the request waited"
	default:
		msg += "the gateway is shutting down"
	}
	return msg
}

// Unwrap returns the routing error that decided, if any.
func (e *Error) Unwrap() error { return e.Err }

// QueueConfig bounds one QueueRouter.
type QueueConfig struct {
	// MaxLength bounds the requests waiting (default 1024).
	MaxLength int
	// MaxWait bounds how long a request waits (default 60 s), and the
	// Retry-After of the requests the queue refuses or lets go.
	MaxWait time.Duration
	// Now is the queue's clock (default time.Now); a simulation passes its
	// virtual clock.
	Now func() time.Time
	// Capacity, when set, is held for reading while a pass checks for a
	// Trigger and tries a request (see Config.Capacity).
	Capacity *sync.RWMutex
	// Fairness orders the flows waiting at one priority (see
	// Config.Fairness): FairnessDeadline when "".
	Fairness string
}

// Fairness policies: how a queue orders the requests of one priority
// that belong to different flows (types.RoutingContext.FairnessID).
const (
	// FairnessDeadline orders them earliest deadline first, whatever
	// their flows, and a full queue makes room only for a higher
	// priority.
	FairnessDeadline = "deadline"
	// FairnessRoundRobin has the flows take turns, each flow's own
	// requests earliest deadline first, and makes a full queue's flow
	// with the most requests waiting give up its own (see the package
	// doc).
	FairnessRoundRobin = "round-robin"
)

// FairnessPolicies lists the fairness policies, the default first.
var FairnessPolicies = []string{FairnessDeadline, FairnessRoundRobin}

// band is what a queue with FairnessRoundRobin keeps of one priority
// while requests of it wait.
type band struct {
	// flows counts the requests waiting by flow; a flow is dropped with
	// its last request.
	flows map[string]*flowCount
	// last is the flow of the request a pass last routed at this
	// priority, set once served: the next pass starts with the flow after
	// it, in the order of the flows' ids.
	last   string
	served bool
}

// flowCount is one flow of a band.
type flowCount struct {
	waiting int // its requests waiting
	turn    int // its turn in the pass being ordered: 0 for the first
}

// namedFlow is a flow of a band and its id.
type namedFlow struct {
	id string
	*flowCount
}

// interleaving holds what ordering a pass with FairnessRoundRobin reuses
// from pass to pass.
type interleaving struct {
	flows   []namedFlow
	starts  []int
	ends    []int
	next    []int
	active  []int
	grouped []*Entry
}

// QueueRouter routes the requests of one model that use an SLO-aware
// algorithm: a request no pod can take within its SLO waits in the queue,
// highest priority first (types.RoutingContext's Priority), then earliest
// deadline (with FairnessRoundRobin, each priority's flows taking turns:
// see the package doc), and is routed by a later pass as soon as a pod
// can (Dispatch: on a first token, a completion, a scrape, an arrival),
// or leaves it when it can no longer meet its SLO, after MaxWait, or when
// its caller gives up. A request that does not wait (Route without hold:
// slo-least-load) is tried at once even while others wait, and may take
// capacity freed for them before their pass (see the package doc). Its
// methods are safe for concurrent use.
type QueueRouter struct {
	model   string
	cfg     QueueConfig
	metrics *modelMetrics

	// routeMu serializes the model's decisions; mu guards the entries.
	routeMu sync.Mutex
	mu      sync.Mutex
	entries []*Entry // by priority (highest first), deadline, arrival
	closed  string   // the reason, once closed
	lastTry time.Time
	// busy is when a request last waited, or was refused for want of
	// capacity.
	busy time.Time

	// With FairnessRoundRobin (roundRobin), bands holds each priority
	// with requests waiting; flows counts their flows. Guarded by mu.
	roundRobin bool
	bands      map[int]*band
	flows      int
	// scratch is the passes' ordering; guarded by routeMu.
	scratch interleaving

	wake chan struct{}
	// triggers counts Trigger's calls: a pass that sees it move knows
	// capacity may have freed since it tried the requests before.
	triggers atomic.Uint64
}

// NewQueueRouter returns the empty queue of model. metrics may be nil.
func NewQueueRouter(model string, cfg QueueConfig, metrics *Metrics) *QueueRouter {
	if cfg.MaxLength <= 0 {
		cfg.MaxLength = DefaultMaxQueueLength
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Fairness == "" {
		cfg.Fairness = FairnessDeadline
	}
	q := &QueueRouter{model: model, cfg: cfg, metrics: metrics.forModel(model), wake: make(chan struct{}, 1)}
	if cfg.Fairness == FairnessRoundRobin {
		q.roundRobin, q.bands = true, map[int]*band{}
	}
	return q
}

// Model returns the queue's model.
func (q *QueueRouter) Model() string { return q.model }

// Len returns the number of requests waiting.
func (q *QueueRouter) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.entries)
}

// Route routes e: at once when no request of the model waits and a pod can
// take it, else after waiting in the queue (hold) until a pass routes it.
// It returns nil once e.Try routed it, an *Error when it was refused or
// left the queue, or ctx's error when ctx ended first: the request then
// left the queue at once. A request Try routed just as ctx ended counts as
// routed: Route returns nil and the caller closes the attempt. Without
// hold (slo-least-load) a request no pod can take now is refused at once.
func (q *QueueRouter) Route(ctx context.Context, e *Entry, hold bool) error {
	e.done = make(chan struct{})
	queued, err := q.Submit(e, hold)
	if !queued {
		return err
	}
	if e.Waiting != nil {
		e.Waiting(e.enqueued.Add(q.cfg.MaxWait))
	}
	select {
	case <-e.done:
		return e.err
	case <-ctx.Done():
		if q.Cancel(e) {
			return ctx.Err()
		}
		<-e.done
		return e.err
	}
}

// Submit tries e at once when no request of the model waits (or without
// hold); when e has to wait, it queues it and wakes the queue's loop for a
// pass. A full queue (QueueConfig.MaxLength) refuses e (ReasonQueueFull)
// unless e's priority is higher than that of a waiting request: the
// waiting request of the lowest priority, and among those the latest
// deadline, then leaves (ReasonDisplaced) for e to wait. With
// FairnessRoundRobin, the one leaving is the latest deadline of the flow
// with the most requests waiting at the lowest priority, and e may also
// take its place when e is of that priority and its own flow holds at
// least two fewer requests of it. With hold, a
// sheddable e (a negative priority) never waits: it is refused
// (ReasonSheddable) where it would have been queued, without a try while
// other requests wait. Submit reports whether e was queued: its outcome
// is then told by e.Done (and Route's wait). When it was not queued, the error is nil when
// e was routed, an *Error when it was refused (with Close's reason when
// the queue was closed, even while e was tried), and Try's own error when
// that is neither (no pod to route to, an unknown algorithm).
func (q *QueueRouter) Submit(e *Entry, hold bool) (queued bool, err error) {
	q.routeMu.Lock()
	defer q.routeMu.Unlock()
	now := q.cfg.Now()
	q.mu.Lock()
	closed, waiting := q.closed, len(q.entries)
	q.mu.Unlock()
	if closed != "" {
		return false, q.refuse(e, closed, 0, nil)
	}
	e.enqueued, e.latest = now, now.Add(q.cfg.MaxWait)
	e.priority, e.flow = e.Request.Priority, e.Request.FairnessID
	sheddable := hold && e.priority < 0
	if sheddable && waiting > 0 {
		// Tried now, it could take capacity the waiting requests, all of
		// a higher priority than its own, are owed.
		q.mu.Lock()
		retry := q.retryAfterLocked(now)
		q.mu.Unlock()
		return false, q.refuse(e, ReasonSheddable, retry, nil)
	}
	if waiting == 0 || !hold {
		err := q.try(e, now)
		switch {
		case err == nil:
			q.metrics.outcome(outcomeAdmitted)
			return false, nil
		case errors.Is(err, cache.ErrSLOFailureRequest):
			return false, q.refuse(e, ReasonUnmeetable, e.drain, err)
		case !errors.Is(err, cache.ErrLoadCapacityReached):
			e.err = err
			return false, err
		case !hold:
			return false, q.refuse(e, ReasonNoCapacity, e.drain, err)
		case sheddable:
			return false, q.refuse(e, ReasonSheddable, e.drain, err)
		}
	}
	q.mu.Lock()
	// Close may have run while e was tried: nothing would pass over, expire
	// or close the queue again, and e would wait for its caller to give up.
	if q.closed != "" {
		closed := q.closed
		q.mu.Unlock()
		return false, q.refuse(e, closed, 0, nil)
	}
	var displaced *Entry
	var retry time.Duration
	if len(q.entries) >= q.cfg.MaxLength {
		retry = q.retryAfterLocked(now)
		// No pass is trying the victim: q.routeMu is held.
		displaced = q.victimLocked(e)
		if displaced == nil {
			q.mu.Unlock()
			return false, q.refuse(e, ReasonQueueFull, retry, nil)
		}
		q.removeLocked(displaced)
	}
	e.queued = true
	i, _ := slices.BinarySearchFunc(q.entries, e, compareEntries)
	q.entries = slices.Insert(q.entries, i, e)
	if q.roundRobin {
		q.addFlowLocked(e)
	}
	n := len(q.entries)
	q.metrics.queued(n)
	q.mu.Unlock()
	if displaced != nil {
		q.leave(displaced, ReasonDisplaced, retry, n, nil)
	}
	// A pass, even when e is the only request waiting: capacity freed
	// since e was tried woke no loop (Routers.Trigger passes over empty
	// queues), and the loop must arm its timer for e's expiry.
	q.Trigger()
	return true, nil
}

// victimLocked returns the waiting request that leaves a full queue for
// e to wait, nil when e is refused (see Submit); q.mu is held.
func (q *QueueRouter) victimLocked(e *Entry) *Entry {
	// The last entry is of the lowest priority and, among those, the
	// latest deadline.
	last := q.entries[len(q.entries)-1]
	if !q.roundRobin {
		if last.priority >= e.priority {
			return nil
		}
		return last
	}
	if last.priority > e.priority {
		return nil
	}
	b := q.bands[last.priority]
	most := 0
	for _, f := range b.flows {
		most = max(most, f.waiting)
	}
	if last.priority == e.priority {
		// e's flow must stay smaller than the largest once e waits: a flow
		// one request short of it would only trade places with it, at the
		// cost of a request that waited.
		own := 0
		if f := b.flows[e.flow]; f != nil {
			own = f.waiting
		}
		if own+1 >= most {
			return nil
		}
	}
	for i := len(q.entries) - 1; i >= 0 && q.entries[i].priority == last.priority; i-- {
		if v := q.entries[i]; v.counted.waiting == most {
			return v
		}
	}
	return nil
}

// addFlowLocked counts queued e in its priority's flows; q.mu is held.
func (q *QueueRouter) addFlowLocked(e *Entry) {
	b := q.bands[e.priority]
	if b == nil {
		b = &band{flows: map[string]*flowCount{}}
		q.bands[e.priority] = b
	}
	f := b.flows[e.flow]
	if f == nil {
		f = &flowCount{}
		b.flows[e.flow] = f
		q.flows++
	}
	f.waiting++
	e.counted = f
}

// dropFlowLocked undoes addFlowLocked for e, leaving the queue: a flow
// goes with its last request, a priority's band with its last flow.
func (q *QueueRouter) dropFlowLocked(e *Entry) {
	f := e.counted
	e.counted = nil
	if f.waiting--; f.waiting > 0 {
		return
	}
	b := q.bands[e.priority]
	delete(b.flows, e.flow)
	q.flows--
	if len(b.flows) == 0 {
		delete(q.bands, e.priority)
	}
}

// compareEntries orders entries by priority, highest first, then
// deadline, then arrival.
func compareEntries(a, b *Entry) int {
	if c := cmp.Compare(b.priority, a.priority); c != 0 {
		return c
	}
	if c := a.Deadline.Compare(b.Deadline); c != 0 {
		return c
	}
	return a.Request.ReceivedAt.Compare(b.Request.ReceivedAt)
}

// Cancel takes e out of the queue, for a caller that no longer waits for
// it, and reports whether it did. It fails when a pass is routing e or has
// finished with it; its outcome (and Route's) is then about to be told.
func (q *QueueRouter) Cancel(e *Entry) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !e.queued {
		return false
	}
	if e.trying {
		e.cancelled = true
		return false
	}
	q.removeLocked(e)
	q.metrics.left(outcomeCancelled, q.cfg.Now().Sub(e.enqueued), len(q.entries))
	return true
}

// removeLocked takes queued e out of the entries; q.mu is held.
func (q *QueueRouter) removeLocked(e *Entry) {
	if i := slices.Index(q.entries, e); i >= 0 {
		q.entries = slices.Delete(q.entries, i, i+1)
		if q.roundRobin {
			q.dropFlowLocked(e)
		}
	}
	e.queued = false
}

// interleaveLocked reorders pass, the waiting requests in the entries'
// order, into the order a pass tries them with FairnessRoundRobin: within
// each priority that has requests of several flows waiting, the flows
// take turns, starting with the one after the flow last routed at that
// priority in the order of the flows' ids (before any was, with the flow
// of the priority's earliest deadline), each flow's own requests in the
// entries' order. s is reused across calls; q.mu is held.
func (q *QueueRouter) interleaveLocked(pass []*Entry, s *interleaving) {
	if q.flows == len(q.bands) {
		return // one flow per priority: the entries' order
	}
	for i := 0; i < len(pass); {
		j := i + 1
		for j < len(pass) && pass[j].priority == pass[i].priority {
			j++
		}
		if b := q.bands[pass[i].priority]; b != nil && len(b.flows) > 1 {
			s.interleave(pass[i:j], b)
		}
		i = j
	}
}

// interleave reorders run, the requests of b's priority in the entries'
// order, for the flows to take turns (see interleaveLocked).
func (s *interleaving) interleave(run []*Entry, b *band) {
	flows := s.flows[:0]
	for id, f := range b.flows {
		flows = append(flows, namedFlow{id, f})
	}
	slices.SortFunc(flows, func(a, b namedFlow) int { return cmp.Compare(a.id, b.id) })
	n := len(flows)
	byID := func(f namedFlow, id string) int { return cmp.Compare(f.id, id) }
	// Before any request of the priority was routed, the flow of its
	// earliest deadline goes first.
	first, _ := slices.BinarySearchFunc(flows, run[0].flow, byID)
	if b.served {
		i, found := slices.BinarySearchFunc(flows, b.last, byID)
		if found {
			i++
		}
		first = i % n
	}
	// Each flow's turn, and its requests' place once grouped by turn:
	// from starts[turn] to ends[turn].
	starts, ends := slices.Grow(s.starts[:0], n)[:n], slices.Grow(s.ends[:0], n)[:n]
	for i, f := range flows {
		f.turn = (i - first + n) % n
		ends[f.turn] = f.waiting
	}
	total := 0
	for t, k := range ends {
		starts[t] = total
		total += k
		ends[t] = total
	}
	// Group the requests by turn, each flow's in the entries' order.
	grouped := slices.Grow(s.grouped[:0], len(run))[:len(run)]
	next := slices.Grow(s.next[:0], n)[:n]
	copy(next, starts)
	for _, e := range run {
		grouped[next[e.counted.turn]] = e
		next[e.counted.turn]++
	}
	// One request of each flow that has any left, turn after turn.
	active := s.active[:0]
	for t := range n {
		active = append(active, t)
	}
	out := 0
	for round := 0; len(active) > 0; round++ {
		keep := active[:0]
		for _, t := range active {
			run[out] = grouped[starts[t]+round]
			out++
			if starts[t]+round+1 < ends[t] {
				keep = append(keep, t)
			}
		}
		active = keep
	}
	clear(grouped)
	clear(flows)
	s.flows, s.starts, s.ends, s.next, s.active, s.grouped = flows[:0], starts, ends, next, active, grouped[:0]
}

// Trigger wakes the queue's loop (Run) for a pass, unless one is pending.
// It never blocks.
func (q *QueueRouter) Trigger() {
	q.triggers.Add(1)
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Run makes a pass (Dispatch) whenever Trigger wakes it and when a waiting
// request can no longer meet its SLO (NextExpiry), until ctx ends; it then
// refuses the requests still waiting (ReasonStopped) and returns nil.
func (q *QueueRouter) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if at, ok := q.NextExpiry(); ok {
			timer.Reset(max(time.Until(at), 0))
		} else {
			timer.Reset(time.Hour)
		}
		select {
		case <-ctx.Done():
			q.Close(ReasonStopped)
			return nil
		case <-q.wake:
		case <-timer.C:
		}
		q.Dispatch()
	}
}

// NextExpiry returns the earliest time a waiting request will have to
// leave the queue, whatever its place in it, false when none waits.
func (q *QueueRouter) NextExpiry() (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var at time.Time
	for _, e := range q.entries {
		if at.IsZero() || e.latest.Before(at) {
			at = e.latest
		}
	}
	return at, !at.IsZero()
}

// Dispatch makes one pass over the waiting requests in queue order,
// highest priority first, then earliest deadline: it lets go of those that
// can no longer meet their SLO or waited the longest allowed, and routes
// those a pod can take now. After maxWaitsPerPass requests in a row that
// no pod can take, it only checks the rest for expiry. A request that no
// pod could take does not hold up the later ones, which may need less,
// even of a lower priority; but when Trigger reports, during the pass,
// that capacity may have freed, the pass starts again from the first
// waiting request (up to maxRestartsPerPass times; after that it stops,
// and Run makes the pass Trigger asked for), so that a later request does
// not take what an earlier one could now have. With QueueConfig.Capacity
// set, a request ending or producing its first token cannot slip between
// the check and the decision; a scrape that changes the predictions during
// the one decision in progress still can.
func (q *QueueRouter) Dispatch() {
	q.routeMu.Lock()
	defer q.routeMu.Unlock()
	for restarts := 0; ; restarts++ {
		if !q.pass(restarts < maxRestartsPerPass) {
			return
		}
	}
}

// pass makes one pass over the waiting requests (see Dispatch); q.routeMu
// is held. Once a request waited and Trigger was called since the pass
// began, it stops, and reports whether to start again: restartable.
func (q *QueueRouter) pass(restartable bool) (restart bool) {
	q.mu.Lock()
	pass := slices.Clone(q.entries)
	if q.roundRobin {
		q.interleaveLocked(pass, &q.scratch)
	}
	q.mu.Unlock()
	triggers := q.triggers.Load()
	now := q.cfg.Now()
	waits, waited := 0, false
	for _, e := range pass {
		// Capacity may have freed since a request waited: a later request
		// must not take it first. Without restarts left, the pass ends,
		// and the queue's loop makes the pass that Trigger asked for.
		if waited && q.triggers.Load() != triggers {
			return restartable
		}
		q.mu.Lock()
		if !e.queued {
			q.mu.Unlock()
			continue
		}
		if !now.Before(e.latest) {
			q.removeLocked(e)
			drain, n := e.drain, len(q.entries)
			q.mu.Unlock()
			q.leave(e, ReasonExpired, drain, n, nil)
			continue
		}
		if waits >= maxWaitsPerPass {
			q.mu.Unlock()
			continue
		}
		e.trying = true
		q.mu.Unlock()

		freed, err := q.tryUnlessFreed(e, now, waited, triggers)

		q.mu.Lock()
		e.trying = false
		if freed {
			q.mu.Unlock()
			return restartable
		}
		routed, waiting := err == nil, errors.Is(err, cache.ErrLoadCapacityReached)
		cancelled, closing := e.cancelled && !routed, e.closing
		if waiting && !cancelled && closing == "" {
			q.mu.Unlock()
			waits++
			waited = true
			continue
		}
		if routed && q.roundRobin {
			if b := q.bands[e.priority]; b != nil {
				b.last, b.served = e.flow, true
			}
		}
		q.removeLocked(e)
		n := len(q.entries)
		q.mu.Unlock()
		switch {
		case routed:
			waits = 0
			q.metrics.left(outcomeAdmitted, now.Sub(e.enqueued), n)
			e.finish(nil)
		case cancelled:
			q.metrics.left(outcomeCancelled, now.Sub(e.enqueued), n)
			e.finish(context.Canceled)
		case closing != "":
			q.leave(e, closing, 0, n, nil)
		case errors.Is(err, cache.ErrSLOFailureRequest):
			q.leave(e, ReasonExpired, e.drain, n, err)
		default:
			// Nothing to route to any more (the model's last pod left
			// before Forget closed the queue): Try's own error, as Submit
			// returns it.
			q.metrics.left(outcomeDropped, now.Sub(e.enqueued), n)
			e.finish(err)
		}
	}
	q.mu.Lock()
	q.lastTry = now
	q.mu.Unlock()
	return false
}

// tryUnlessFreed tries e (try), unless an earlier request waited in this
// pass (waited) and capacity may have freed since it began (Trigger was
// called since triggers): then it reports freed instead. The check and
// the try hold QueueConfig.Capacity for reading, so that nothing frees
// capacity between them.
func (q *QueueRouter) tryUnlessFreed(e *Entry, now time.Time, waited bool, triggers uint64) (freed bool, err error) {
	if c := q.cfg.Capacity; c != nil {
		c.RLock()
		defer c.RUnlock()
	}
	if waited && q.triggers.Load() != triggers {
		return true, nil
	}
	return false, q.try(e, now)
}

// try runs e.Try and records what it tells of e's wait: how long it can
// still wait, and when a pod could take it.
func (q *QueueRouter) try(e *Entry, now time.Time) error {
	q.mu.Lock()
	e.tries++
	if len(q.entries) > 0 {
		q.busy = now
	}
	e.Request.SLOContended = now.Sub(q.busy) < contendedFor
	q.mu.Unlock()
	err := e.Try()
	var se *routing.SLOError
	if errors.As(err, &se) {
		q.mu.Lock()
		if !se.Unmeetable {
			latest := now.Add(se.Slack)
			if se.Slack < 0 || latest.Before(now) { // overflow: no time target
				latest = e.enqueued.Add(q.cfg.MaxWait)
			}
			e.latest = earliest(e.enqueued.Add(q.cfg.MaxWait), latest)
		}
		e.drain = se.Drain
		q.mu.Unlock()
	}
	return err
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Close refuses every waiting request with reason (ReasonModelGone,
// ReasonStopped), and every request submitted from then on.
func (q *QueueRouter) Close(reason string) {
	q.mu.Lock()
	if q.closed == "" {
		q.closed = reason
	}
	left := q.entries
	q.entries = nil
	if q.roundRobin {
		clear(q.bands)
		q.flows = 0
	}
	var gone []*Entry
	for _, e := range left {
		if e.trying {
			e.closing = reason // the pass in progress tells it
			continue
		}
		e.queued = false
		gone = append(gone, e)
	}
	q.mu.Unlock()
	for _, e := range gone {
		q.leave(e, reason, 0, 0, nil)
	}
}

// refuse refuses e, which never waited, and returns the error it gets.
func (q *QueueRouter) refuse(e *Entry, reason string, retry time.Duration, cause error) error {
	if reason == ReasonSheddable {
		q.metrics.outcome(outcomeShed)
	} else {
		q.metrics.outcome(outcomeRejected)
	}
	if reason == ReasonNoCapacity || reason == ReasonQueueFull || reason == ReasonSheddable {
		q.mu.Lock()
		q.busy = q.cfg.Now()
		q.mu.Unlock()
	}
	err := &Error{Model: q.model, Reason: reason, RetryAfter: q.retryAfter(retry), Err: cause}
	e.err = err
	return err
}

// leave tells e, taken out of the queue, that it leaves without a pod.
func (q *QueueRouter) leave(e *Entry, reason string, retry time.Duration, left int, cause error) {
	waited := q.cfg.Now().Sub(e.enqueued)
	outcome := outcomeExpired
	switch reason {
	case ReasonModelGone, ReasonStopped:
		outcome = outcomeDropped
	case ReasonDisplaced:
		outcome = outcomeDisplaced
	}
	q.metrics.left(outcome, waited, left)
	e.finish(&Error{Model: q.model, Reason: reason, RetryAfter: q.retryAfter(retry), Waited: waited, Err: cause})
}

// finish records e's outcome and tells it.
func (e *Entry) finish(err error) {
	e.err = err
	if e.done != nil {
		close(e.done)
	}
	if e.Done != nil && !errors.Is(err, context.Canceled) {
		e.Done(err)
	}
}

// retryAfterLocked estimates when a pod frees up, from the waiting
// requests' last tries; q.mu is held.
func (q *QueueRouter) retryAfterLocked(now time.Time) time.Duration {
	var d time.Duration
	for _, e := range q.entries {
		if e.drain > 0 && (d == 0 || e.drain < d) {
			d = e.drain
		}
	}
	return d
}

// retryAfter turns an estimate of when a pod frees up (a Drain, which is
// time.Duration(math.MaxInt64) when routing found no pod to estimate from)
// into a Retry-After: rounded up to whole seconds, at least one second and
// at most the queue's MaxWait (rounded up), so that a client is never told
// to stay away longer than the queue would have held its request.
func (q *QueueRouter) retryAfter(d time.Duration) time.Duration {
	d = min(d, q.cfg.MaxWait)
	if d <= time.Second {
		return time.Second
	}
	r := d.Truncate(time.Second)
	if r < d && r <= math.MaxInt64-time.Second {
		r += time.Second
	}
	return r
}

// Status describes a queue for the debug API.
type Status struct {
	Model   string     `json:"model"`
	Closed  string     `json:"closed,omitempty"`
	Length  int        `json:"length"`
	MaxLen  int        `json:"maxLength"`
	MaxWait float64    `json:"maxWaitSeconds"`
	LastTry *time.Time `json:"lastPass,omitempty"`
	// Fairness is the queue's fairness policy (QueueConfig.Fairness).
	Fairness string `json:"fairness"`
	// Flows counts the flows waiting: the distinct pairs of priority and
	// fairness id of the waiting requests.
	Flows   int             `json:"flows"`
	Waiting []WaitingStatus `json:"waiting"`
}

// WaitingStatus describes one waiting request.
type WaitingStatus struct {
	RequestID string `json:"requestID"`
	// Priority is the request's priority (types.RoutingContext's
	// Priority), which orders the queue before its deadline.
	Priority int `json:"priority"`
	// ClientRequestID is the client's X-Request-Id as logs show it
	// (types.RoutingContext.LoggedClientRequestID), left out when it sent
	// none.
	ClientRequestID string `json:"clientRequestID,omitempty"`
	// FairnessID is the flow the request belongs to among those of its
	// priority (types.RoutingContext's FairnessID), left out for the
	// default flow.
	FairnessID     string  `json:"fairnessID,omitempty"`
	PromptTokens   int     `json:"promptTokens"`
	WaitedSeconds  float64 `json:"waitedSeconds"`
	DeadlineIn     float64 `json:"deadlineInSeconds"`
	LeavesIn       float64 `json:"leavesInSeconds"`
	SLO            string  `json:"slo"`
	Tries          int     `json:"tries"`
	DrainEstimateS float64 `json:"drainEstimateSeconds"`
}

// Status returns the queue's state, its waiting requests in the order
// the next pass tries them: highest priority first, then earliest
// deadline, or with FairnessRoundRobin each priority's flows taking
// turns.
func (q *QueueRouter) Status() Status {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.cfg.Now()
	s := Status{Model: q.model, Closed: q.closed, Length: len(q.entries), MaxLen: q.cfg.MaxLength,
		MaxWait: q.cfg.MaxWait.Seconds(), Fairness: q.cfg.Fairness, Waiting: []WaitingStatus{}}
	if !q.lastTry.IsZero() {
		t := q.lastTry
		s.LastTry = &t
	}
	waiting := q.entries
	if q.roundRobin {
		waiting = slices.Clone(waiting)
		q.interleaveLocked(waiting, &interleaving{})
		s.Flows = q.flows
	} else {
		type flow struct {
			priority int
			id       string
		}
		flows := map[flow]bool{}
		for _, e := range waiting {
			flows[flow{e.priority, e.flow}] = true
		}
		s.Flows = len(flows)
	}
	for _, e := range waiting {
		s.Waiting = append(s.Waiting, WaitingStatus{
			RequestID: e.Request.RequestID, Priority: e.priority, ClientRequestID: e.Request.LoggedClientRequestID(),
			FairnessID: e.flow, PromptTokens: e.Request.InputTokens(),
			WaitedSeconds: now.Sub(e.enqueued).Seconds(), DeadlineIn: e.Deadline.Sub(now).Seconds(),
			LeavesIn: e.latest.Sub(now).Seconds(), SLO: e.Request.SLO.String(), Tries: e.tries,
			DrainEstimateS: e.drain.Seconds(),
		})
	}
	return s
}
