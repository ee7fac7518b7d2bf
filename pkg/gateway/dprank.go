package gateway

import (
	"net/http"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
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

// The bound on the requests pinned to one rank of a pod. A rank takes
// another unless either rule refuses it:
//
//   - the pins this gateway holds: the rank runs at least minRankPins
//     attempts this gateway pinned to it, and at least rankPinFactor times
//     the mean of the pod's other ranks';
//   - the rank's load as last scraped from the engine (cache.RankLoad),
//     which counts every request the rank runs, those the engine's own
//     balancer placed and those other gateway replicas pinned included:
//     the rank has at least minRankPins requests waiting (a queue: one
//     waiting request is often only one that arrived between two engine
//     steps), and its score is at least rankPinFactor times the mean of
//     the pod's other ranks' scores. A rank's score is vLLM's
//     data-parallel balancer's, waiting×4 + running (see rankScore), plus
//     the attempts this gateway pinned to it since that scrape began,
//     which the scrape could not see.
//
// The first rule holds between scrapes and without them; the second needs
// the pod's latest scrape to have succeeded and to have broken its load
// down by rank.
const (
	minRankPins   = 2
	rankPinFactor = 2
)

// rankScore is the load vLLM's data-parallel balancer weighs a rank by:
// its waiting requests count four times its running ones.
func rankScore(l cache.RankLoad) float64 { return 4*l.Waiting + l.Running }

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

// podPins are one pod's pinned attempts in flight, total and by rank, and
// by rank the attempts pinned since the scrape that began at scrapedAt,
// ended or not.
type podPins struct {
	total     int
	ranks     []int
	scrapedAt time.Time
	since     []int
}

// scrapedRanks is what the latest scrape of a pod said of its ranks: when
// it began, and the load of each rank (nil when it did not break the load
// down by rank, or failed).
type scrapedRanks struct {
	at    time.Time
	loads []cache.RankLoad
}

// take counts an attempt pinned to rank of pod, whose engine serves size
// ranks and was last scraped as sc, and reports true, unless the bound
// (see minRankPins) refuses it: it then counts nothing and reports false.
func (p *rankPins) take(pod string, rank, size int, sc scrapedRanks) bool {
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
	if len(pp.ranks) < size || len(pp.since) < size {
		// One allocation holds both counts.
		n := max(size, len(pp.ranks), len(pp.since))
		buf := make([]int, 2*n)
		copy(buf, pp.ranks)
		copy(buf[n:], pp.since)
		pp.ranks, pp.since = buf[:n:n], buf[n:]
	}
	if sc.at.After(pp.scrapedAt) {
		pp.scrapedAt = sc.at
		clear(pp.since)
	}
	n, others := pp.ranks[rank], pp.total-pp.ranks[rank]
	if n >= minRankPins && n*(size-1) >= rankPinFactor*others || pp.queued(rank, size, sc.loads) {
		if pp.total == 0 {
			delete(p.pods, pod)
		}
		return false
	}
	pp.ranks[rank]++
	pp.since[rank]++
	pp.total++
	return true
}

// queued reports whether the scraped loads refuse rank another pin: the
// rank has at least minRankPins requests waiting and a score of at least
// rankPinFactor times the mean of the other ranks of the size the pod
// serves. A rank the loads leave out scores only its pins since the
// scrape.
func (pp *podPins) queued(rank, size int, loads []cache.RankLoad) bool {
	if rank >= len(loads) || !(loads[rank].Waiting >= minRankPins) {
		return false
	}
	score := func(r int) float64 {
		s := float64(pp.since[r])
		if r < len(loads) {
			s += rankScore(loads[r])
		}
		return s
	}
	own, others := score(rank), 0.0
	for r := range size {
		if r != rank {
			others += score(r)
		}
	}
	return own*float64(size-1) >= rankPinFactor*others
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
// is already too busy (see minRankPins), by the attempts this gateway
// pinned to it or by its load in the pod's snapshot among x.snaps; it
// counts the outcome in kvgate_gateway_dp_rank_requests_total.
func (g *Gateway) pinRank(x *exchange, route *inflight.Route) {
	rank := x.d.DPRank
	if rank < 0 || x.ownRank || g.cfg.DisableDPRankRouting || route.Endpoint == nil {
		return
	}
	if !g.pins.take(route.Endpoint.ID, rank, route.Endpoint.DPSize, scrapedRanksOf(x.snaps, route.Endpoint)) {
		g.metrics.dpRanks.WithLabelValues(dpRankBalanced).Inc()
		return
	}
	route.DPRank, route.DPPinned = rank, true
	g.metrics.dpRanks.WithLabelValues(dpRankPinned).Inc()
}

// scrapedRanksOf returns what the snapshot of pod among snaps says of its
// ranks: nothing unless its latest scrape succeeded.
func scrapedRanksOf(snaps []cache.PodSnapshot, pod *endpoint.Endpoint) scrapedRanks {
	for i := range snaps {
		if s := &snaps[i]; s.Endpoint == pod {
			if s.Scrape != cache.ScrapeFresh {
				break
			}
			return scrapedRanks{at: s.Metrics.At, loads: s.Metrics.Ranks}
		}
	}
	return scrapedRanks{}
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
