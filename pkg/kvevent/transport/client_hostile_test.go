package transport

import (
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
)

func TestClientJoinsAStreamThatCountsFromOne(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	eng := kvtest.NewEngine(t, ports)
	for i := 1; i <= 5; i++ {
		eng.Buffer(uint64(i), kvtest.Payload(t, 1, i))
	}
	rec := &kvtest.Recorder{}
	c := startClient(t, testClientConfig(ports), rec)
	testsupport.Eventually(t, "the first engine's batches", func() bool { return rec.Count() >= 5 })

	// The engine restarts and counts from 1 again.
	eng.Forget()
	kvtest.RepeatUntil(t, "the restarted engine's batches", func() {
		for i := 1; i <= 3; i++ {
			if !rec.Has(2, i) {
				eng.Publish(t, uint64(i), kvtest.Payload(t, 2, i))
			}
		}
	}, func() bool { return rec.Has(2, 3) })

	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got[:5], 1, 1, 6)
	if len(resets) != 1 || resets[0].Reason != kvevent.ResetPublisherRestart {
		t.Fatalf("resets %v, want one publisher restart and no gap", resets)
	}
	st := c.Stats()
	if st.UnrecoverableGaps != 0 || st.MissedBatches != 0 || st.JoinedAtSeq != 1 {
		t.Errorf("stats report %d gaps, %d missed batches, joined at %d; want none, none, 1",
			st.UnrecoverableGaps, st.MissedBatches, st.JoinedAtSeq)
	}
}
