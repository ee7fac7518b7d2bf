package slo

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/types"
)

// BenchmarkQueuePass measures a pass over a full queue of a model whose
// pods can take none of its waiting requests, in one or several flows of
// one priority: the pass orders them, tries maxWaitsPerPass and checks
// the rest for expiry.
func BenchmarkQueuePass(b *testing.B) {
	const waiting = 1024
	for _, fairness := range FairnessPolicies {
		for _, flows := range []int{1, 50} {
			b.Run(fmt.Sprintf("%s/flows=%d", fairness, flows), func(b *testing.B) {
				now := time.Unix(1_800_000_000, 0)
				q := NewQueueRouter("m", QueueConfig{MaxLength: waiting, MaxWait: time.Hour, Fairness: fairness,
					Now: func() time.Time { return now }}, nil)
				full := &routing.SLOError{Model: "m", Slack: time.Hour, Drain: time.Second}
				for i := range waiting {
					rc := types.NewRoutingContext(fmt.Sprint("r", i), "m")
					rc.ReceivedAt = now
					rc.FairnessID = fmt.Sprint("tenant-", i%flows)
					e := &Entry{Request: rc, Deadline: now.Add(time.Duration(i) * time.Millisecond), Try: func() error { return full }}
					if queued, err := q.Submit(e, true); !queued {
						b.Fatalf("r%d was not queued: %v", i, err)
					}
				}
				b.ReportAllocs()
				for b.Loop() {
					q.Dispatch()
				}
				if q.Len() != waiting {
					b.Fatalf("%d waiting after the passes, want %d", q.Len(), waiting)
				}
			})
		}
	}
}
