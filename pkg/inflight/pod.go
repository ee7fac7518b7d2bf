package inflight

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// PodLoad is what the ledger counts on one pod: the attempts running on it,
// their pending load, and its prefill queue (see the package
// documentation). Its methods are safe for concurrent use. The zero value
// is not usable: call NewPodLoad.
type PodLoad struct {
	id string
	// running counts the attempts open on the pod.
	running atomic.Int64
	remote  atomic.Pointer[remoteLoad]
	// remoteWork is the pending load and prefill work of other replicas.
	remoteWork atomic.Pointer[RemoteWork]
	// remoteBlocks is the set of prompt block keys other replicas' attempts
	// hold on the pod.
	remoteBlocks atomic.Pointer[map[uint64]struct{}]

	mu      sync.Mutex
	models  map[string]int64 // open attempts per requested model
	pending float64
	// head and tail are the queued prefills, oldest first; n and tokens
	// count them.
	head, tail *Handle
	n, tokens  int
	// finish is when the queued prefills are predicted to be done.
	finish time.Time
	// prefilled remembers the prefills that left the queue.
	prefilled prefilledLog
}

// remoteLoad is what other gateway replicas run on a pod.
type remoteLoad struct {
	total  int64
	models map[string]int64
}

// NewPodLoad returns the empty load record of the pod named id (its
// "namespace/name").
func NewPodLoad(id string) *PodLoad {
	return &PodLoad{id: id, models: map[string]int64{}}
}

// ID returns the pod's "namespace/name".
func (p *PodLoad) ID() string { return p.id }

// Running returns the attempts running on the pod: this gateway's, and the
// other replicas' as last set with SetRemote.
func (p *PodLoad) Running() int64 {
	n := p.running.Load()
	if r := p.remote.Load(); r != nil {
		n += r.total
	}
	return n
}

// RunningModel returns the attempts for model running on the pod, this
// gateway's and the other replicas'.
func (p *PodLoad) RunningModel(model string) int64 {
	p.mu.Lock()
	n := p.models[model]
	p.mu.Unlock()
	if r := p.remote.Load(); r != nil {
		n += r.models[model]
	}
	return n
}

// Local returns a copy of this gateway's attempts running on the pod, per
// requested model.
func (p *PodLoad) Local() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int64, len(p.models))
	for m, n := range p.models {
		out[m] = n
	}
	return out
}

// SetRemote sets what other gateway replicas run on the pod: total
// attempts, and per model; it replaces the previous setting. perModel is
// kept as given: do not modify it afterwards, and give only models the pod
// serves (as redisstate does), which bounds it.
func (p *PodLoad) SetRemote(total int64, perModel map[string]int64) {
	if total == 0 && len(perModel) == 0 {
		p.remote.Store(nil)
		return
	}
	p.remote.Store(&remoteLoad{total: total, models: perModel})
}

// RemoteWork is what other gateway replicas' attempts on a pod add to
// its load: their pending load, and when the prefills they sent there are
// predicted done.
type RemoteWork struct {
	PendingLoad float64
	// PrefillDone is the zero time when they have no prefill queued.
	PrefillDone time.Time
}

// SetRemoteWork sets what other gateway replicas' attempts add to the
// pod's pending load and prefill queue, replacing the previous setting.
func (p *PodLoad) SetRemoteWork(w RemoteWork) {
	if w == (RemoteWork{}) {
		p.remoteWork.Store(nil)
		return
	}
	p.remoteWork.Store(&w)
}

// SetRemoteBlocks sets the keys of the prompt blocks that other gateway
// replicas' attempts hold on the pod, replacing the previous setting. The
// keys are the routing package's (routing.Router.InFlightBlocks); the
// record only answers RemoteBlock with them.
func (p *PodLoad) SetRemoteBlocks(keys []uint64) {
	if len(keys) == 0 {
		p.remoteBlocks.Store(nil)
		return
	}
	set := make(map[uint64]struct{}, len(keys))
	for _, k := range keys {
		set[k] = struct{}{}
	}
	p.remoteBlocks.Store(&set)
}

// HasRemoteBlocks reports whether other replicas hold prompt blocks on the
// pod, as last set with SetRemoteBlocks.
func (p *PodLoad) HasRemoteBlocks() bool { return p.remoteBlocks.Load() != nil }

// RemoteBlock reports whether an attempt of another replica holds the
// prompt block of key on the pod, as last set with SetRemoteBlocks.
func (p *PodLoad) RemoteBlock(key uint64) bool {
	set := p.remoteBlocks.Load()
	if set == nil {
		return false
	}
	_, ok := (*set)[key]
	return ok
}

// LocalWork returns this gateway's share of the pod's pending load and of
// its prefill queue at now: the prefill work of its attempts that is
// predicted left.
func (p *PodLoad) LocalWork(now time.Time) (pending float64, prefill time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n > 0 && p.finish.After(now) {
		prefill = p.finish.Sub(now)
	}
	return p.pending, prefill
}

// PendingLoad returns the sum of the pending loads of the attempts
// running on the pod (Route.PendingLoad), this gateway's and, as last set
// with SetRemoteWork, the other replicas': 1 is the pod's capacity.
func (p *PodLoad) PendingLoad() float64 {
	p.mu.Lock()
	pending := p.pending
	p.mu.Unlock()
	if w := p.remoteWork.Load(); w != nil {
		pending += w.PendingLoad
	}
	return pending
}

// Queue is what a routing decision reads of a pod's prefill queue.
type Queue struct {
	// Prefills and Tokens count the queued prefills and their predicted
	// uncached tokens.
	Prefills, Tokens int
	// Seconds is the prefill work predicted ahead of an attempt sent now:
	// this gateway's queue and, as last set with SetRemoteWork, the other
	// replicas'.
	Seconds float64
	// WaitingEnded estimates how many of the requests a scrape counted as
	// waiting were this gateway's prefills that have left the queue since.
	WaitingEnded int
}

// Queue returns the pod's prefill queue at now: the queued prefills and
// the work predicted ahead of an attempt sent now, and how many of the
// waiting requests a scrape at scrapedAt counted are prefills that have
// left the queue since (none when scrapedAt is zero). The engine prefills
// in the order requests arrive, so of the prefills queued at the scrape,
// the oldest were running and at most the newest waiting ones were
// waiting; prefills leave the queue in the same order.
func (p *PodLoad) Queue(now, scrapedAt time.Time, waiting float64) Queue {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := Queue{Prefills: p.n, Tokens: p.tokens}
	if p.n > 0 && p.finish.After(now) {
		q.Seconds = p.finish.Sub(now).Seconds()
	}
	if w := p.remoteWork.Load(); w != nil && w.PrefillDone.After(now) {
		q.Seconds += w.PrefillDone.Sub(now).Seconds()
	}
	if !scrapedAt.IsZero() {
		ended := p.prefilled.since(scrapedAt)
		queued := ended
		for e := p.head; e != nil && e.opened.Before(scrapedAt); e = e.next {
			queued++
		}
		running := max(queued-int(math.Round(waiting)), 0)
		q.WaitingEnded = max(ended-running, 0)
	}
	return q
}

// PrefillsSince returns how many of this gateway's attempts on the pod
// opened at or after t still have their prefill queued (no first token
// yet): a scrape of the engine that began at t could not count them among
// its waiting requests. It counts from the newest queued prefill back, in
// the order the attempts opened, so it costs no more than the prefills it
// counts.
func (p *PodLoad) PrefillsSince(t time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for e := p.tail; e != nil && !e.opened.Before(t); e = e.prev {
		n++
	}
	return n
}

// open counts h on the pod and queues its prefill behind the others.
func (p *PodLoad) open(l *Ledger, h *Handle, now time.Time) {
	p.running.Add(1)
	p.mu.Lock()
	p.models[h.req.model]++
	p.pending += h.route.PendingLoad
	if p.tail == nil {
		p.head = h
	} else {
		p.tail.next, h.prev = h, p.tail
	}
	p.tail = h
	h.prefilling = true
	p.n++
	p.tokens += h.tokens
	p.finish = later(p.finish, now).Add(seconds(h.route.PrefillSeconds))
	p.mu.Unlock()
	l.prefills.Add(1)
	l.prefillTokens.Add(int64(h.tokens))
}

// close stops counting h on the pod and ends its prefill, if queued: an
// expired attempt only leaves the queue, any other proves its prefill and
// the ones before it ended (see endPrefill).
func (p *PodLoad) close(l *Ledger, h *Handle, now time.Time) {
	p.running.Add(-1)
	p.mu.Lock()
	model := h.req.model
	if p.models[model]--; p.models[model] <= 0 {
		delete(p.models, model)
	}
	p.pending -= h.route.PendingLoad
	if p.running.Load() == 0 {
		p.pending = 0 // drop the rounding left by the add/subtract pairs
	}
	o, _ := h.Outcome()
	expired := o == Expired && h.prefilling
	if expired {
		p.unlinkLocked(l, h)
	}
	p.mu.Unlock()
	if expired {
		l.metrics.prefillsExpired.Inc()
		return
	}
	p.endPrefill(l, h, now, false)
}

// endPrefill removes h's prefill and the prefills queued before it, which
// vLLM's first-come first-served scheduling prefills first. timed reports
// that h's prefill ended just now (its first token), so that the prefills
// after it, queued behind it, are predicted done their own work from now.
// Otherwise h's prefill ended some time before now and the prediction only
// gets no later than that. A prefill no longer queued is left alone.
func (p *PodLoad) endPrefill(l *Ledger, h *Handle, now time.Time, timed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !h.prefilling {
		return
	}
	for {
		e := p.head
		p.unlinkLocked(l, e)
		p.prefilled.add(e.opened, now)
		if e == h {
			break
		}
	}
	remaining := 0.0
	for e := p.head; e != nil; e = e.next {
		remaining += e.route.PrefillSeconds
	}
	finish := now.Add(seconds(remaining))
	if timed {
		p.finish = finish
	} else {
		p.finish = earlier(p.finish, finish)
	}
}

// unlinkLocked removes queued prefill e; p.mu is held.
func (p *PodLoad) unlinkLocked(l *Ledger, e *Handle) {
	if e.prev == nil {
		p.head = e.next
	} else {
		e.prev.next = e.next
	}
	if e.next == nil {
		p.tail = e.prev
	} else {
		e.next.prev = e.prev
	}
	e.prev, e.next, e.prefilling = nil, nil, false
	p.n--
	p.tokens -= e.tokens
	l.prefills.Add(-1)
	l.prefillTokens.Add(-int64(e.tokens))
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
