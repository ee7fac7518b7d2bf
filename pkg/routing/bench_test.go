package routing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
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
	const pods, promptTokens, otherBlocksPerPod = 16, 8192, 5000
	fleet := newStoreFleetScraping(b, pods, time.Second)
	idx := newTestIndex(b)
	p := prompt(0, promptTokens)
	for i := range pods {
		pod := fmt.Sprintf("p%d", i)
		if i > 0 {
			holds(b, idx, pod, p[:512*i], kvevent.MediumGPU)
		}
		for j := range otherBlocksPerPod / 64 {
			holds(b, idx, pod, prompt(1_000_000*(i+1)+j*4096, 64*testBlockSize), kvevent.MediumGPU)
		}
	}
	for _, alg := range []string{KVAware, SLOLeastLoad, SLOPackLoad, PrefixCache, LeastRequest, Random} {
		b.Run(alg, func(b *testing.B) {
			r, _ := newTestRouter(b, fleet.store, idx)
			podList := fleet.pods(b)
			ctx := request("bench", alg, p)
			ctx.SLO = types.SLO{TTFT: time.Minute}
			ctx.ReceivedAt = time.Now()
			var d Decision
			var snaps []cache.PodSnapshot
			for i := range pods * 4 {
				snaps = fleet.store.Snapshots(podList, snaps[:0])
				if err := r.Route(context.Background(), ctx, snaps, &d); err != nil {
					b.Fatal(err)
				}
				d.chosen, d.Endpoint = i%pods, podList[i%pods]
				startPrefill(r, &d)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				snaps = fleet.store.Snapshots(podList, snaps[:0])
				if err := r.Route(context.Background(), ctx, snaps, &d); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
