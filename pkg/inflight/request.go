package inflight

import (
	"sync"
	"time"
)

// Request is the record of one admitted request, from Ledger.Admit to
// Request.End. Its methods are safe for concurrent use; a front end drives
// it from one goroutine, the reaper may end it from another.
type Request struct {
	ledger   *Ledger
	id       string
	model    string
	admitted time.Time

	// home is the shard whose list holds the request while linked; prev,
	// next and linked are guarded by home.mu.
	home       *requestShard
	prev, next *Request
	linked     bool

	mu      sync.Mutex
	attempt *Handle // the open attempt, nil between attempts
	routed  bool    // routed at least once
	ended   bool
}

// ID returns the id the request was admitted with.
func (r *Request) ID() string { return r.id }

// Model returns the model the request asks for: a base model or a LoRA
// adapter.
func (r *Request) Model() string { return r.model }

// Admitted returns when the request was admitted, on the ledger's clock.
func (r *Request) Admitted() time.Time { return r.admitted }

// Route opens the attempt that sends the request to the pod rt names, and
// returns its handle: from now on the attempt counts as running on the pod,
// with rt.PendingLoad, and its prefill as work queued on the pod until its
// FirstToken or Close. An attempt still open is closed first, as Failed
// with reason "rerouted". Routing a request that has ended (it was reaped,
// or End was called, before or while its previous attempt closed) opens
// nothing: the handle returned is closed already. An End racing with Route
// closes the new attempt only once it is open and its Opened observers
// have run.
func (r *Request) Route(rt Route) *Handle {
	l := r.ledger
	h := &Handle{req: r, route: rt}
	r.mu.Lock()
	if prev := r.attempt; prev != nil && !r.ended {
		r.attempt = nil
		r.mu.Unlock()
		prev.Close(Failed, "rerouted")
		r.mu.Lock()
	}
	defer r.mu.Unlock()
	if r.ended {
		h.closed.Store(true)
		h.outcome, h.reason = Expired, "request ended before routing"
		return h
	}
	r.attempt = h
	if !r.routed {
		r.routed = true
		l.adjustModel(r.model, 0, 1)
	}
	// Under r.mu, so that end, which closes the open attempt, finds h
	// counted on its pod and announced.
	h.open(l.now())
	for _, o := range *l.observers.Load() {
		if o.Opened != nil {
			o.Opened(h)
		}
	}
	return h
}

// End records that the request is over: it stops counting for its model.
// An attempt still open is closed as Cancelled. Only the first End counts.
func (r *Request) End() {
	if r.end(Cancelled, "request ended") {
		s := r.home
		s.mu.Lock()
		s.unlinkLocked(r)
		s.mu.Unlock()
	}
}

// end ends the request, closing its open attempt with outcome and reason,
// and reports whether this call ended it.
func (r *Request) end(outcome Outcome, reason string) bool {
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		return false
	}
	r.ended = true
	attempt, routed := r.attempt, r.routed
	r.attempt = nil
	r.mu.Unlock()
	if attempt != nil {
		attempt.Close(outcome, reason)
	}
	l := r.ledger
	l.tracked.Add(-1)
	var routedDelta int64
	if routed {
		routedDelta = -1
	}
	l.adjustModel(r.model, -1, routedDelta)
	return true
}

// detach forgets h as the request's open attempt once it is closed.
func (r *Request) detach(h *Handle) {
	r.mu.Lock()
	if r.attempt == h {
		r.attempt = nil
	}
	r.mu.Unlock()
}
