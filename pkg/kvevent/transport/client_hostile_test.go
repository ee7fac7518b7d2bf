package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

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

// publishWithAHole has eng publish seqs 0, 1, 2 and 4 of tag 1, buffered
// and live, once the client's subscription is in place: seq 3 never
// existed, so replays of the hole answer everything but it.
func publishWithAHole(t *testing.T, eng *kvtest.Engine, rec *kvtest.Recorder) {
	t.Helper()
	seqs := []int{0, 1, 2, 4}
	for _, i := range seqs {
		eng.Buffer(uint64(i), kvtest.Payload(t, 1, i))
	}
	kvtest.RepeatUntil(t, "the live batches", func() {
		for _, i := range seqs {
			eng.Live(t, uint64(i), kvtest.Payload(t, 1, i))
		}
	}, func() bool { return rec.Has(1, 4) })
}

func TestClientTakesNoStaleReplyForTheAnswerToALaterReplay(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		after func(w *kvtest.ReplayWriter) // what the engine sends after its end marker
	}{
		{"second end marker", func(w *kvtest.ReplayWriter) { w.End() }},
		{"batch with the end marker's seq", func(w *kvtest.ReplayWriter) { w.Batch(math.MaxUint64, []byte{0x90}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ports := kvtest.NewPorts(t)
			eng := kvtest.NewEngine(t, ports)
			eng.SetReplay(func(start uint64, buffered []kvtest.Buffered, w *kvtest.ReplayWriter) {
				kvtest.VLLMReplay(start, buffered, w)
				tc.after(w)
			})
			rec := &kvtest.Recorder{}
			c := startClient(t, testClientConfig(ports), rec)
			publishWithAHole(t, eng, rec)
			// The hole is replayed and followed up, then declared lost; the
			// quiet-stream probes that follow are answered the same way.
			// The stale marker of one replay must not end the next.
			requests := eng.Requests()
			testsupport.Eventually(t, "ten more replays", func() bool { return eng.Requests() >= requests+10 })

			got, resets := rec.Snapshot()
			if len(got) != 4 || got[3].Seq != 4 || !rec.Has(1, 0) || !rec.Has(1, 2) {
				t.Fatalf("delivered %d batches (%v...), want seqs 0, 1, 2 and 4 once each", len(got), got[:min(len(got), 8)])
			}
			want := kvevent.StreamReset{Reason: kvevent.ResetUnrecoverableGap, PodKey: "default/vllm-0", NextSeq: 4, FirstMissing: 3, LastMissing: 3}
			if len(resets) != 1 || resets[0] != want {
				t.Fatalf("resets %v, want only the hole declared lost: %v", resets, want)
			}
			if st := c.Stats(); st.PublisherRestarts != 0 || st.ReplayFailures != 0 {
				t.Errorf("stats report %d publisher restarts and %d failed replays, want none", st.PublisherRestarts, st.ReplayFailures)
			}
		})
	}
}

func TestClientSuspendsAStreamThatKeepsResetting(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	eng := kvtest.NewEngine(t, ports)
	rec := &kvtest.Recorder{}
	cfg := testClientConfig(ports)
	cfg.MaxResets = 3
	c := startClient(t, cfg, rec)
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	// An engine whose seq keeps going back: every other message restarts
	// the stream.
	const flood = 2000
	kvtest.RepeatUntil(t, "a first restart", func() {
		for i := range 10 {
			eng.Live(t, uint64(5-i%2), kvtest.Payload(t, 1, 5-i%2))
		}
	}, func() bool { return c.Stats().PublisherRestarts > 0 })
	for i := range flood {
		eng.Live(t, uint64(5-i%2), kvtest.Payload(t, 1, 5-i%2))
	}
	testsupport.Eventually(t, "a suspension", func() bool { return c.Stats().Suspensions > 0 })
	st := c.Stats()
	if st.PublisherRestarts > 20 || st.ReplayRequests > 40 {
		t.Errorf("%d restarts and %d replay requests for %d messages that go back: want them bounded",
			st.PublisherRestarts, st.ReplayRequests, flood)
	}

	// A sane engine afterwards is followed again once the suspension ends.
	eng.Forget()
	for i := range 3 {
		eng.Buffer(uint64(i), kvtest.Payload(t, 2, i))
	}
	testsupport.Eventually(t, "the sane engine's batches", func() bool { return rec.Has(2, 2) && !c.Stats().Suspended })
}

// bigPayload is a batch of tag 1 at seq i that encodes to about size bytes:
// one BlockStored with that many token ids.
func bigPayload(t testing.TB, i, size int) []byte {
	t.Helper()
	b := kvtest.Batch(1, i)
	b.Events[0].(*kvevent.BlockStoredEvent).TokenIDs = make([]uint32, size)
	p, err := kvevent.EncodeEventBatch(b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestClientBoundsThePendingBufferInBytes(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	eng := kvtest.NewEngine(t, ports)
	var hold atomic.Bool
	release := make(chan struct{})
	eng.SetReplay(func(start uint64, buffered []kvtest.Buffered, w *kvtest.ReplayWriter) {
		if hold.Load() {
			<-release // the gap's replay stays silent while live batches pile up
		}
		kvtest.VLLMReplay(start, buffered, w)
	})
	defer close(release)
	eng.Buffer(0, kvtest.Payload(t, 1, 0))
	rec := &kvtest.Recorder{}
	cfg := testClientConfig(ports)
	cfg.ReplayTimeout = time.Minute // only the pending buffer may end the wait
	cfg.MaxMessageBytes, cfg.MaxPendingBytes = 2<<20, 8<<20
	c := startClient(t, cfg, rec)
	eng.AwaitSubscriber(t)
	testsupport.Eventually(t, "the first batch", func() bool { return rec.Count() > 0 })
	hold.Store(true)

	// Seq 1 never comes; 1 MiB batches from seq 2 on wait for it.
	const n = 20
	for i := 2; i < 2+n; i++ {
		eng.Live(t, uint64(i), bigPayload(t, i, 1<<20))
	}
	testsupport.Eventually(t, "every batch after the hole", func() bool { return rec.Has(1, 1+n) })
	_, resets := rec.Snapshot()
	want := kvevent.StreamReset{Reason: kvevent.ResetUnrecoverableGap, PodKey: "default/vllm-0", NextSeq: 2, FirstMissing: 1, LastMissing: 1}
	if len(resets) != 1 || resets[0] != want {
		t.Fatalf("resets %v, want the hole declared lost when 8 MiB were pending: %v", resets, want)
	}
	if st := c.Stats(); st.PendingOverflows != 1 {
		t.Errorf("%d pending buffer overflows, want 1", st.PendingOverflows)
	}
}

func TestClientCutsShortAReplayThatAnswersForever(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		adjust func(*ZMQClientConfig)
		every  time.Duration // between replies
		limit  string
	}{
		{"too many replies", func(c *ZMQClientConfig) { c.MaxReplayBatches = 500 }, 0, LimitReplayBatches},
		{"too long", func(c *ZMQClientConfig) { c.MaxReplayDuration = c.ReplayTimeout }, 20 * time.Millisecond, LimitReplayDuration},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ports := kvtest.NewPorts(t)
			eng := kvtest.NewEngine(t, ports)
			// Every reply is a batch already delivered, so the replay never
			// makes progress and never ends.
			eng.SetReplay(func(start uint64, _ []kvtest.Buffered, w *kvtest.ReplayWriter) {
				payload := kvtest.Payload(t, 1, 0)
				for w.Batch(0, payload) {
					time.Sleep(tc.every)
				}
			})
			eng.Buffer(0, kvtest.Payload(t, 1, 0))
			reg, metrics := newTestMetrics(t)
			cfg := testClientConfig(ports)
			cfg.Metrics = metrics
			tc.adjust(cfg)
			c := startClient(t, cfg, &kvtest.Recorder{})
			testsupport.Eventually(t, "two replays cut short", func() bool { return c.Stats().ReplaysCut >= 2 })
			labels := "dp_rank=0,limit=" + tc.limit + ",pod_key=" + cfg.PodKey
			if got := series(t, reg, "limit_hits_total")[labels]; got < 2 {
				t.Errorf("limit_hits_total{%s} = %v, want every cut counted", labels, got)
			}
		})
	}
}

func TestClientDropsTheConnectionOfAnEngineSendingOversizedMessages(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	eng := kvtest.NewEngine(t, ports)
	rec := &kvtest.Recorder{}
	cfg := testClientConfig(ports)
	cfg.MaxMessageBytes, cfg.ConnectTimeout = 1<<20, 300*time.Millisecond
	cfg.ReplayTimeout, cfg.MaxReplayDuration = 300*time.Millisecond, time.Second
	c := startClient(t, cfg, rec)
	eng.AwaitSubscriber(t)
	eng.Publish(t, 0, kvtest.Payload(t, 1, 0))
	testsupport.Eventually(t, "the first batch", func() bool { return rec.Count() > 0 })

	eng.Publish(t, 1, bigPayload(t, 1, 3<<20)) // 3 MiB: live and replayed, it never arrives
	testsupport.Eventually(t, "the disconnection", func() bool { return c.Stats().Disconnections > 0 })
	eng.AwaitSubscriber(t) // again, after the reconnection
	eng.Publish(t, 2, kvtest.Payload(t, 1, 2))
	testsupport.Eventually(t, "the batch after the oversized one", func() bool { return rec.Has(1, 2) })

	got, resets := rec.Snapshot()
	if len(got) != 2 || got[0].Seq != 0 || got[1].Seq != 2 {
		t.Fatalf("delivered %v, want seqs 0 and 2", got)
	}
	want := kvevent.StreamReset{Reason: kvevent.ResetUnrecoverableGap, PodKey: "default/vllm-0", NextSeq: 2, FirstMissing: 1, LastMissing: 1}
	if len(resets) != 1 || resets[0] != want {
		t.Fatalf("resets %v, want the oversized batch lost: %v", resets, want)
	}
}

// slowHandler records batches after a pause, like an index that falls
// behind.
type slowHandler struct {
	kvtest.Recorder
	pause time.Duration
}

func (h *slowHandler) HandleBatch(seq uint64, b *kvevent.EventBatch) error {
	time.Sleep(h.pause)
	return h.Recorder.HandleBatch(seq, b)
}

func TestClientFloodedBeyondItsReceiveBufferDropsAndReplays(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	eng := kvtest.NewEngine(t, ports)
	h := &slowHandler{pause: 2 * time.Millisecond}
	cfg := testClientConfig(ports)
	cfg.MaxMessageBytes, cfg.ReceiveBufferBytes = 1<<20, 2<<20
	c := startClient(t, cfg, h)
	eng.AwaitSubscriber(t)
	const n = 40
	for i := range n {
		eng.Publish(t, uint64(i), bigPayload(t, i, 512<<10))
	}
	testsupport.Eventually(t, "every batch", func() bool { return h.Has(1, n-1) })

	got, resets := h.Snapshot()
	kvtest.CheckSequence(t, got, 1, 0, n)
	if len(resets) != 0 {
		t.Fatalf("resets %v, want none: the engine still buffers every batch", resets)
	}
	if st := c.Stats(); st.DroppedMessages == 0 || st.ReplayedBatches == 0 {
		t.Errorf("stats report %d dropped messages and %d replayed batches; want the flood dropped at 2 MiB and replayed",
			st.DroppedMessages, st.ReplayedBatches)
	}
}

func TestClientDisconnectsAnEngineThatFloodsIt(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	eng := kvtest.NewEngine(t, ports)
	reg, metrics := newTestMetrics(t)
	h := &slowHandler{pause: 5 * time.Millisecond}
	cfg := testClientConfig(ports)
	cfg.Metrics = metrics
	cfg.MaxMessageBytes, cfg.ReceiveBufferBytes = 512<<10, 1<<20
	c := startClient(t, cfg, h)
	eng.AwaitSubscriber(t)

	payload := bigPayload(t, 0, 256<<10)
	floods := func() float64 {
		return series(t, reg, "limit_hits_total")["dp_rank=0,limit=flood,pod_key="+cfg.PodKey]
	}
	seq := uint64(0)
	kvtest.RepeatUntil(t, "the flood noticed", func() {
		for range 200 {
			eng.Live(t, seq, payload)
			seq++
		}
	}, func() bool { return floods() > 0 })

	// Once the engine behaves, the stream is followed again.
	eng.Forget()
	eng.Buffer(seq, kvtest.Payload(t, 2, int(seq)))
	testsupport.Eventually(t, "the well-behaved engine's batch", func() bool { return h.Has(2, int(seq)) })
	if st := c.Stats(); st.Connections < 2 {
		t.Errorf("%d connections, want the flooding engine redialled", st.Connections)
	}
}

// expandingPayload is a batch of about size bytes that would decode to some
// 40 times its size: one BlockStored whose extra_keys are size nils.
func expandingPayload(size int) []byte {
	p := []byte{0x92, 0xcb, 0x41, 0xda, 0x30, 0x54, 0x98, 0x10, 0, 0, 0x91, 0x99, 0xab}
	p = append(p, "BlockStored"...)
	p = append(p, 0x90, 0xc0, 0x90, 0x10, 0xc0, 0xc0, 0xc0, 0xdd)
	p = binary.BigEndian.AppendUint32(p, uint32(size))
	return append(p, bytes.Repeat([]byte{0xc0}, size)...)
}

func TestClientDropsABatchThatWouldDecodeBeyondItsBudget(t *testing.T) {
	t.Parallel()
	payload := expandingPayload(1 << 20)
	if _, err := kvevent.DecodeEventBatch(payload); !errors.Is(err, kvevent.ErrBatchTooLarge) {
		t.Fatalf("the expanding payload decodes with error %v, want ErrBatchTooLarge", err)
	}
	reg, metrics := newTestMetrics(t)
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	cfg := testClientConfig(ports)
	cfg.Metrics = metrics
	rec := &kvtest.Recorder{}
	c := startClient(t, cfg, rec)
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	if err := pub.PublishRaw(payload); err != nil {
		t.Fatal(err)
	}
	kvtest.Publish(t, pub, 1, 1, 4)
	testsupport.Eventually(t, "the batches after the expanding one", func() bool { return rec.Count() >= 3 })

	got, _ := rec.Snapshot()
	kvtest.CheckSequence(t, got, 1, 1, 4)
	if st := c.Stats(); st.DecodeErrors != 1 || st.BatchesReceived != 4 {
		t.Errorf("stats report %d decode errors of %d batches, want 1 of 4", st.DecodeErrors, st.BatchesReceived)
	}
	stream := "dp_rank=0,"
	for labels, want := range map[string]float64{
		stream + "limit=" + LimitDecodedBatch + ",pod_key=" + cfg.PodKey:  1,
		stream + "limit=" + LimitReceiveBuffer + ",pod_key=" + cfg.PodKey: 0,
	} {
		if got := series(t, reg, "limit_hits_total")[labels]; got != want {
			t.Errorf("limit_hits_total{%s} = %v, want %v", labels, got, want)
		}
	}
	if got := series(t, reg, "errors_total")[stream+"error_type=decode,pod_key="+cfg.PodKey]; got != 1 {
		t.Errorf("errors_total{error_type=decode} = %v, want 1", got)
	}
}

// checkFrameSlice fails the test if frames, a driver's reused frame slice,
// grew for a message of many frames or still holds frames beyond its
// length.
func checkFrameSlice(t *testing.T, name string, frames [][]byte) {
	t.Helper()
	if cap(frames) > 8 {
		t.Errorf("%s has room for %d frames", name, cap(frames))
	}
	for i, f := range frames[len(frames):cap(frames)] {
		if f != nil {
			t.Errorf("%s holds a frame of %d bytes at %d, beyond its length %d", name, len(f), len(frames)+i, len(frames))
		}
	}
}

func TestClientKeepsNoFrameOfAMessageOfTooManyFrames(t *testing.T) {
	t.Parallel()
	many := make([][]byte, 1000)
	for i := range many {
		many[i] = make([]byte, 1024)
	}
	t.Run("live", func(t *testing.T) {
		t.Parallel()
		ports := kvtest.NewPorts(t)
		eng := kvtest.NewEngine(t, ports)
		rec := &kvtest.Recorder{}
		c := startClient(t, testClientConfig(ports), rec)
		eng.AwaitSubscriber(t)
		eng.Frames(t, many...)
		eng.Publish(t, 0, kvtest.Payload(t, 1, 0))
		testsupport.Eventually(t, "the batch after the malformed message", func() bool { return rec.Has(1, 0) })
		// The batch may come first through a replay on joining; the live
		// socket's malformed message is read before any later message.
		testsupport.Eventually(t, "the malformed message counted", func() bool { return c.Stats().MalformedMessages >= 1 })
		if st := c.Stats(); st.MalformedMessages != 1 {
			t.Errorf("stats report %d malformed messages, want 1", st.MalformedMessages)
		}
		if err := c.do(func(d *dialer) error {
			checkFrameSlice(t, "the live frame slice", d.frames)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("replay", func(t *testing.T) {
		t.Parallel()
		ports := kvtest.NewPorts(t)
		eng := kvtest.NewEngine(t, ports)
		eng.SetReplay(func(_ uint64, _ []kvtest.Buffered, w *kvtest.ReplayWriter) { w.Frames(many...) })
		c := startClient(t, testClientConfig(ports), &kvtest.Recorder{})
		testsupport.Eventually(t, "a failed replay", func() bool { return c.Stats().ReplayFailures > 0 })
		if err := c.do(func(d *dialer) error {
			checkFrameSlice(t, "the replay frame slice", d.s.replyFrames)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
}
