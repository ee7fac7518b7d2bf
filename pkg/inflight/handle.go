package inflight

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// Outcome says how an attempt ended.
type Outcome string

// Outcomes of an attempt.
const (
	// Done: the pod answered and its response was relayed to the end,
	// whatever its status.
	Done Outcome = "done"
	// Failed: the pod could not be reached, failed before answering, or
	// its response broke off.
	Failed Outcome = "failed"
	// Cancelled: the client went away, or the request ended with the
	// attempt still open.
	Cancelled Outcome = "cancelled"
	// Expired: the request was reaped after the ledger's TTL.
	Expired Outcome = "expired"
)

// Route says where an attempt goes and what routing predicted of it; the
// routing package's Decision.Route builds one.
type Route struct {
	// Pod is the load record of the pod the attempt is sent to. It is
	// required.
	Pod *PodLoad
	// Endpoint is the pod, nil when the caller has none (a simulation).
	Endpoint *endpoint.Endpoint
	// PromptTokens is the prompt's length in tokens, 0 when unknown.
	PromptTokens int
	// UncachedTokens is the prefill work predicted for the prompt on the
	// pod, in tokens (the prompt less its cached prefix), and
	// PrefillSeconds the time that work takes at the pod's prefill speed.
	UncachedTokens float64
	PrefillSeconds float64
	// PredictedTTFTSeconds is the predicted time to first token, 0 when
	// the decision predicted none.
	PredictedTTFTSeconds float64
	// PendingLoad is the share of the pod's capacity the request takes by
	// its GPU profile (see cache.PendingLoadProvider), 0 without a
	// profile.
	PendingLoad float64
	// PromptBlocks are the keys the router gave the prompt's whole blocks,
	// for the router to count them as held on the pod while the attempt is
	// open; nil when the router keeps none. The ledger does not read them.
	PromptBlocks []uint64
	// DPRank is the data-parallel rank of the pod the attempt was sent to
	// run on, when DPPinned: the gateway named it in the request (vLLM's
	// X-data-parallel-rank) and counts the attempt on that rank until it
	// closes. The ledger does not read them.
	DPRank   int
	DPPinned bool
}

// Usage is the token usage an engine reported for a request.
type Usage struct {
	PromptTokens, CompletionTokens int64
	// CachedTokens is how many of the prompt's tokens the engine found in
	// its prefix cache (vLLM's prompt_tokens_details.cached_tokens), when
	// CachedReported says the engine reported it.
	CachedTokens   int64
	CachedReported bool
}

// Handle is one attempt to serve a request on a pod, from Request.Route to
// Handle.Close. Its methods are safe for concurrent use.
type Handle struct {
	req    *Request
	route  Route
	tokens int // route.UncachedTokens, rounded
	opened time.Time

	closed atomic.Bool

	// prev, next and prefilling are guarded by route.Pod.mu: the handle's
	// place in its pod's prefill queue.
	prev, next *Handle
	prefilling bool

	mu         sync.Mutex
	outcome    Outcome // set once closed, before the Closed observers run
	reason     string
	firstToken time.Time
	usage      Usage
	hasUsage   bool
}

// Request returns the request the attempt serves.
func (h *Handle) Request() *Request { return h.req }

// Route returns the attempt's route.
func (h *Handle) Route() Route { return h.route }

// Opened returns when the attempt was opened, on the ledger's clock.
func (h *Handle) Opened() time.Time { return h.opened }

// FirstTokenAt returns when the attempt reported its first token, the zero
// time before.
func (h *Handle) FirstTokenAt() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.firstToken
}

// Usage returns the usage the attempt reported, and whether it did.
func (h *Handle) Usage() (Usage, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.usage, h.hasUsage
}

// Outcome returns how the attempt ended and why, "" while it is open.
func (h *Handle) Outcome() (Outcome, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.outcome, h.reason
}

// open counts the attempt on its pod and queues its prefill.
func (h *Handle) open(now time.Time) {
	h.opened = now
	h.tokens = int(math.Round(h.route.UncachedTokens))
	h.route.Pod.open(h.req.ledger, h, now)
}

// FirstToken records that the attempt's first generated token came back:
// its prefill, and that of every attempt sent to the pod before it, is
// done. Only the first call counts, and none after Close.
func (h *Handle) FirstToken() {
	l := h.req.ledger
	now := l.now()
	h.mu.Lock()
	if !h.firstToken.IsZero() || h.closed.Load() {
		h.mu.Unlock()
		return
	}
	h.firstToken = now
	h.mu.Unlock()
	if f := l.frees; f != nil {
		f.Lock()
		defer f.Unlock()
	}
	h.route.Pod.endPrefill(l, h, now, true)
	for _, o := range *l.observers.Load() {
		if o.FirstToken != nil {
			o.FirstToken(h)
		}
	}
}

// ReportUsage records the token usage the engine reported for the attempt.
// The last report before Close counts.
func (h *Handle) ReportUsage(u Usage) {
	h.mu.Lock()
	h.usage, h.hasUsage = u, true
	h.mu.Unlock()
}

// Close ends the attempt with outcome, reason saying more for logs (a
// failure's cause, for one): it stops counting on its pod, and its prefill,
// if no first token came, leaves the pod's queue. It reports whether this
// call closed the attempt: only the first Close counts, the others are
// ignored and counted (kvgate_cache_request_done_ignored_total).
func (h *Handle) Close(outcome Outcome, reason string) bool {
	l := h.req.ledger
	if !h.closed.CompareAndSwap(false, true) {
		why := "closed"
		if o, _ := h.Outcome(); o == Expired {
			why = "expired"
		}
		l.metrics.closesIgnored.WithLabelValues(why).Inc()
		return false
	}
	h.mu.Lock()
	h.outcome, h.reason = outcome, reason
	h.mu.Unlock()
	if f := l.frees; f != nil {
		f.Lock()
		defer f.Unlock()
	}
	if h.route.Pod != nil {
		h.route.Pod.close(l, h, l.now())
	}
	h.req.detach(h)
	for _, o := range *l.observers.Load() {
		if o.Closed != nil {
			o.Closed(h)
		}
	}
	return true
}
