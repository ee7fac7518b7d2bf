package routing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/types"
)

// BenchmarkRoute measures one decision after tokenization, the candidates'
// snapshots and MatchPrefix included, for an 8,192-token prompt among 16
// pods: the real Store (pod metrics scraped from fake engines, and their
// scrape states) and a warm index where pod i holds the first 512·i tokens
// of the prompt among 80,000 blocks of other prompts, with four prefills in
// flight per pod. The SLO-aware algorithms judge a time-to-first-token
// objective every pod meets.
func BenchmarkRoute(b *testing.B) {
	bench := newRouteBench(b)
	for _, alg := range []string{KVAware, SLOLeastLoad, SLOPackLoad, PrefixCache, LeastRequest, Random} {
		b.Run(alg, func(b *testing.B) {
			r, ctx := bench.router(b, alg, 4)
			var d Decision
			var snaps []cache.PodSnapshot
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				bench.decide(b, r, ctx, &d, &snaps)
			}
		})
	}
}

// BenchmarkRouteAttempt measures what routing costs a request that is
// sent: BenchmarkRoute's kv-aware decision, then its attempt opened and
// closed in the request ledger, with the Router remembering the prompt's
// blocks as in flight on the chosen pod meanwhile.
func BenchmarkRouteAttempt(b *testing.B) {
	bench := newRouteBench(b)
	r, ctx := bench.router(b, KVAware, 4)
	var d Decision
	var snaps []cache.PodSnapshot
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		bench.decide(b, r, ctx, &d, &snaps)
		startPrefill(r, &d).Close(inflight.Done, "")
	}
}

// BenchmarkRouteBusy measures BenchmarkRoute's kv-aware decision with 64
// attempts in flight per pod, as busy engines have: 1,024 in all, a
// quarter of them sharing the prompt's first 512·i tokens on pod i, the
// others prompts of their own.
func BenchmarkRouteBusy(b *testing.B) {
	bench := newRouteBench(b)
	r, ctx := bench.router(b, KVAware, 16)
	var d Decision
	var snaps []cache.PodSnapshot
	for i := range len(bench.pods) * 48 {
		bench.occupy(b, r, request("other", KVAware, prompt(2_000_000+i*8192, 1024)), i%len(bench.pods), &d, &snaps)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		bench.decide(b, r, ctx, &d, &snaps)
	}
}

// routeBench is the fleet, index and prompt of the route benchmarks.
type routeBench struct {
	fleet *storeFleet
	idx   *indexer.SyncPrefixHashTable
	pods  []*endpoint.Endpoint
	p     []uint32
}

func newRouteBench(b *testing.B) *routeBench {
	const pods, promptTokens, otherBlocksPerPod = 16, 8192, 5000
	rb := &routeBench{fleet: newStoreFleetScraping(b, pods, time.Second), idx: newTestIndex(b), p: prompt(0, promptTokens)}
	for i := range pods {
		pod := fmt.Sprintf("p%d", i)
		if i > 0 {
			holds(b, rb.idx, pod, rb.p[:512*i], kvevent.MediumGPU)
		}
		for j := range otherBlocksPerPod / 64 {
			holds(b, rb.idx, pod, prompt(1_000_000*(i+1)+j*4096, 64*testBlockSize), kvevent.MediumGPU)
		}
	}
	rb.pods = rb.fleet.pods(b)
	return rb
}

// router returns a Router over the bench's fleet, with perPod prefills of
// the prompt in flight per pod, and a request for the prompt under alg.
func (rb *routeBench) router(b *testing.B, alg string, perPod int) (*Router, *types.RoutingContext) {
	r, _ := newTestRouter(b, rb.fleet.store, rb.idx)
	ctx := request("bench", alg, rb.p)
	ctx.SLO = types.SLO{TTFT: time.Minute}
	ctx.ReceivedAt = time.Now()
	var d Decision
	var snaps []cache.PodSnapshot
	for i := range len(rb.pods) * perPod {
		rb.occupy(b, r, ctx, i%len(rb.pods), &d, &snaps)
	}
	return r, ctx
}

// decide routes rc among the bench's pods into d; snaps is scratch.
func (rb *routeBench) decide(b *testing.B, r *Router, rc *types.RoutingContext, d *Decision, snaps *[]cache.PodSnapshot) {
	*snaps = rb.fleet.store.Snapshots(rb.pods, (*snaps)[:0])
	if err := r.Route(context.Background(), rc, *snaps, d); err != nil {
		b.Fatal(err)
	}
}

// occupy routes rc and opens its attempt on pod i, whichever pod the
// decision chose, leaving it in flight.
func (rb *routeBench) occupy(b *testing.B, r *Router, rc *types.RoutingContext, i int, d *Decision, snaps *[]cache.PodSnapshot) {
	rb.decide(b, r, rc, d, snaps)
	d.chosen, d.Endpoint = i, rb.pods[i]
	startPrefill(r, d)
}
