package gateway

import (
	"net/http"
	"sync"

	"github.com/kvgate/kvgate/pkg/inflight"
)

// HeaderDataParallelRank is vLLM's request header naming the data-parallel
// rank (the engine core) a request runs on, in the canonical form net/http
// keys it by; vLLM reads it case-insensitively.
const HeaderDataParallelRank = "X-Data-Parallel-Rank"

const headerDPRank = HeaderDataParallelRank

// Results of a decision that named a rank, in
// kvgate_gateway_dp_rank_requests_total.
const (
	dpRankPinned   = "pinned"
	dpRankBalanced = "balanced"
)

// The bound on the requests pinned to one rank of a pod: a rank takes
// another while it runs fewer than minRankPins pinned requests, or fewer
// than rankPinFactor times the mean of the pod's other ranks.
const (
	minRankPins   = 2
	rankPinFactor = 2
)

// rankPins counts, per pod and data-parallel rank, the attempts in flight
// this gateway pinned to the rank, so that a hot prefix held on one rank
// does not send that rank every request for it. Its methods are safe for
// concurrent use.
type rankPins struct {
	mu sync.Mutex
	// pods holds the counts of the pods with pinned attempts in flight,
	// by pod key; a pod whose last one ends is removed.
	pods map[string]*podPins
}

// podPins are one pod's pinned attempts in flight: total, and by rank.
type podPins struct {
	total int
	ranks []int
}

// take counts an attempt pinned to rank of pod, whose engine serves size
// ranks, and reports true, unless the rank has minRankPins or more pinned
// attempts in flight and at least rankPinFactor times the mean of the
// pod's other ranks: it then counts nothing and reports false.
func (p *rankPins) take(pod string, rank, size int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.pods[pod]
	if pp == nil {
		if p.pods == nil {
			p.pods = map[string]*podPins{}
		}
		pp = &podPins{}
		p.pods[pod] = pp
	}
	if len(pp.ranks) < size {
		pp.ranks = append(pp.ranks, make([]int, size-len(pp.ranks))...)
	}
	n, others := pp.ranks[rank], pp.total-pp.ranks[rank]
	if n >= minRankPins && n*(size-1) >= rankPinFactor*others {
		if pp.total == 0 {
			delete(p.pods, pod)
		}
		return false
	}
	pp.ranks[rank]++
	pp.total++
	return true
}

// give ends an attempt take counted.
func (p *rankPins) give(pod string, rank int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.pods[pod]
	if pp == nil || rank >= len(pp.ranks) || pp.ranks[rank] == 0 {
		return
	}
	pp.ranks[rank]--
	if pp.total--; pp.total == 0 {
		delete(p.pods, pod)
	}
}

// pinRank pins the attempt of route to the rank the decision x.d names,
// unless the client named one itself, DP-rank routing is off, or the rank
// already runs too many pinned requests (see rankPins.take); it counts the
// outcome in kvgate_gateway_dp_rank_requests_total.
func (g *Gateway) pinRank(x *exchange, route *inflight.Route) {
	rank := x.d.DPRank
	if rank < 0 || x.ownRank || g.cfg.DisableDPRankRouting || route.Endpoint == nil {
		return
	}
	if !g.pins.take(route.Endpoint.ID, rank, route.Endpoint.DPSize) {
		g.metrics.dpRanks.WithLabelValues(dpRankBalanced).Inc()
		return
	}
	route.DPRank, route.DPPinned = rank, true
	g.metrics.dpRanks.WithLabelValues(dpRankPinned).Inc()
}

// openAttempt opens the attempt of route as an attempt of req, pinned to
// the rank x.d names when pinRank allows. An attempt the ledger does not
// open, its request having ended, is closed without telling the observers:
// its pin ends at once.
func (g *Gateway) openAttempt(x *exchange, req *inflight.Request, route inflight.Route) *inflight.Handle {
	g.pinRank(x, &route)
	h := req.Route(route)
	if route.DPPinned && h.Opened().IsZero() {
		g.pins.give(route.Endpoint.ID, route.DPRank)
	}
	return h
}

// unpinRank ends the count of a pinned attempt, once it closed.
func (g *Gateway) unpinRank(h *inflight.Handle) {
	if rt := h.Route(); rt.DPPinned && rt.Endpoint != nil {
		g.pins.give(rt.Endpoint.ID, rt.DPRank)
	}
}

// pinnedRank returns the rank the attempt h is pinned to, -1 for none.
func pinnedRank(h *inflight.Handle) int {
	if rt := h.Route(); rt.DPPinned {
		return rt.DPRank
	}
	return -1
}

// namesRank reports whether the client's header h names a data-parallel
// rank itself.
func namesRank(h http.Header) bool { return len(h[headerDPRank]) > 0 }
