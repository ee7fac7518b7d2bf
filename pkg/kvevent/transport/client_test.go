package transport

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
)

func TestClientLateSubscriberGetsEverythingThroughReplay(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	kvtest.Publish(t, pub, 1, 0, 50)
	kvtest.AwaitBuffered(t, ports, 49) // sent while nobody subscribed: the PUB dropped them

	rec := &kvtest.Recorder{}
	c := startClient(t, testClientConfig(ports), rec)
	testsupport.Eventually(t, "the 50 published batches", func() bool { return rec.Count() >= 50 })
	kvtest.Publish(t, pub, 1, 50, 60)
	testsupport.Eventually(t, "60 batches", func() bool { return rec.Count() >= 60 })

	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got, 1, 0, 60)
	if len(resets) != 0 {
		t.Errorf("resets %v, want none", resets)
	}
	st := c.Stats()
	if !st.Connected || st.ReplayedBatches < 50 || st.LastSeq != 59 {
		t.Errorf("stats %+v: want connected, >= 50 replayed, last seq 59", st)
	}
}

func TestClientRecoversBatchesDroppedFromTheLiveStream(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, func(c *publisher.PublisherConfig) {
		c.DropLive = func(seq uint64) bool { return seq%7 == 3 || (seq >= 40 && seq < 45) }
	})
	rec := &kvtest.Recorder{}
	c := startClient(t, testClientConfig(ports), rec)
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	kvtest.Publish(t, pub, 1, 0, 100)
	testsupport.Eventually(t, "100 batches", func() bool { return rec.Count() >= 100 })

	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got, 1, 0, 100)
	if len(resets) != 0 {
		t.Errorf("resets %v, want none", resets)
	}
	if st := c.Stats(); st.ReplayedBatches < 19 {
		t.Errorf("%d batches came from replays, want at least the 19 withheld", st.ReplayedBatches)
	}
}

func TestClientRecoversBatchesLostJustBeforeTheEngineWentQuiet(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	// Everything after seq 4 is lost live, and nothing follows to reveal it.
	pub := kvtest.NewPublisher(t, ports, func(c *publisher.PublisherConfig) {
		c.DropLive = func(seq uint64) bool { return seq > 4 }
	})
	rec := &kvtest.Recorder{}
	c := startClient(t, testClientConfig(ports), rec)
	testsupport.Eventually(t, "the connection's replay to end", func() bool { return c.Stats().ReplaySuccesses >= 1 })
	kvtest.Publish(t, pub, 1, 0, 12)
	testsupport.Eventually(t, "the lost tail", func() bool { return rec.Count() >= 12 })
	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got, 1, 0, 12)
	if len(resets) != 0 {
		t.Errorf("resets %v, want none", resets)
	}
}

func TestClientJoinsAtTheOldestBatchTheEngineStillBuffers(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, func(c *publisher.PublisherConfig) { c.BufferSteps = 5 })
	kvtest.Publish(t, pub, 1, 0, 20)
	kvtest.AwaitBuffered(t, ports, 19) // only 15..19 stay buffered

	rec := &kvtest.Recorder{}
	c := startClient(t, testClientConfig(ports), rec)
	testsupport.Eventually(t, "the buffered batches", func() bool { return rec.Count() >= 5 })
	kvtest.Publish(t, pub, 1, 20, 25)
	testsupport.Eventually(t, "the live batches", func() bool { return rec.Count() >= 10 })

	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got, 1, 15, 25)
	if len(resets) != 0 {
		t.Fatalf("resets %v, want none: nothing was delivered that the missing batches could make inexact", resets)
	}
	if st := c.Stats(); st.UnrecoverableGaps != 0 || st.MissedBatches != 0 || st.JoinedAtSeq != 15 {
		t.Errorf("stats report %d gaps, %d missed batches, joined at %d; want 0, 0, 15", st.UnrecoverableGaps, st.MissedBatches, st.JoinedAtSeq)
	}
}

func TestClientReportsUnrecoverableGapWhenReplayBufferIsExhausted(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, func(c *publisher.PublisherConfig) { c.BufferSteps = 5 })
	rec := &kvtest.Recorder{}
	c := startClient(t, testClientConfig(ports), rec)
	kvtest.Publish(t, pub, 1, 0, 5)
	testsupport.Eventually(t, "the first batches", func() bool { return rec.Count() >= 5 })

	// While the client is away the engine publishes more than it buffers.
	c.Stop()
	kvtest.Publish(t, pub, 1, 5, 20)
	kvtest.AwaitBuffered(t, ports, 19) // only 15..19 stay buffered
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the buffered batches", func() bool { return rec.Count() >= 10 })

	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got[:5], 1, 0, 5)
	kvtest.CheckSequence(t, got[5:], 1, 15, 20)
	want := kvevent.StreamReset{Reason: kvevent.ResetUnrecoverableGap, PodKey: "default/vllm-0", NextSeq: 15, FirstMissing: 5, LastMissing: 14}
	if len(resets) != 1 || resets[0] != want {
		t.Fatalf("resets %v, want [%v]", resets, want)
	}
	if st := c.Stats(); st.UnrecoverableGaps != 1 || st.MissedBatches != 10 {
		t.Errorf("stats report %d gaps, %d missed batches; want 1 and 10", st.UnrecoverableGaps, st.MissedBatches)
	}
}

func TestClientDropsOnlyTheUndecodableBatch(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	rec := &kvtest.Recorder{}
	c := startClient(t, testClientConfig(ports), rec)
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	// 0xc1 is the one byte msgpack never uses.
	if err := pub.PublishRaw([]byte{0xc1, 0xff, 0x00}); err != nil {
		t.Fatal(err)
	}
	kvtest.Publish(t, pub, 1, 1, 11)
	testsupport.Eventually(t, "10 good batches", func() bool { return rec.Count() >= 10 })

	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got, 1, 1, 11)
	if len(resets) != 0 {
		t.Errorf("resets %v, want none", resets)
	}
	st := c.Stats()
	if st.DecodeErrors != 1 || st.BatchesReceived != 11 {
		t.Errorf("stats report %d decode errors of %d batches, want 1 of 11", st.DecodeErrors, st.BatchesReceived)
	}
}

func TestClientDetectsPublisherRestart(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	rec := &kvtest.Recorder{}
	c := startClient(t, testClientConfig(ports), rec)
	kvtest.Publish(t, pub, 1, 0, 10)
	testsupport.Eventually(t, "the first publisher's batches", func() bool { return rec.Count() >= 10 })

	pub.Close()
	pub = kvtest.NewPublisher(t, ports, nil)
	testsupport.Eventually(t, "the reconnection", func() bool { return c.Stats().Connections >= 2 })
	kvtest.Publish(t, pub, 2, 0, 3)
	testsupport.Eventually(t, "the second publisher's batches", func() bool { return rec.Has(2, 2) })

	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got[:10], 1, 0, 10)
	kvtest.CheckSequence(t, got[10:], 2, 0, 3)
	if len(resets) != 1 || resets[0].Reason != kvevent.ResetPublisherRestart {
		t.Fatalf("resets %v, want one publisher restart", resets)
	}
}

func TestClientDetectsRestartedPublisherThatGotAhead(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	rec := &kvtest.Recorder{}
	cfg := testClientConfig(ports)
	c := startClient(t, cfg, rec)
	kvtest.Publish(t, pub, 1, 0, 5)
	testsupport.Eventually(t, "the first publisher's batches", func() bool { return rec.Count() >= 5 })

	// The new engine publishes past the old one's seq before the client
	// is back: only the replayed anchor batch can tell them apart.
	c.Stop()
	pub.Close()
	pub = kvtest.NewPublisher(t, ports, nil)
	kvtest.Publish(t, pub, 2, 0, 12)
	kvtest.AwaitBuffered(t, ports, 11)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the second publisher's batches", func() bool { return rec.Has(2, 11) })

	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got[:5], 1, 0, 5)
	kvtest.CheckSequence(t, got[5:], 2, 0, 12)
	if len(resets) != 1 || resets[0].Reason != kvevent.ResetPublisherRestart {
		t.Fatalf("resets %v, want one publisher restart", resets)
	}
}

func TestClientReconnectsAfterPublisherDiesAndResumes(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	rec := &kvtest.Recorder{}
	c := startClient(t, testClientConfig(ports), rec)
	kvtest.Publish(t, pub, 1, 0, 5)
	testsupport.Eventually(t, "the first batches", func() bool { return rec.Count() >= 5 })
	if st := c.Stats(); !st.Connected || !st.DisconnectedSince.IsZero() {
		t.Fatalf("connected stream: Connected %v, DisconnectedSince %v: want true and zero", st.Connected, st.DisconnectedSince)
	}

	closed := time.Now()
	pub.Close()
	testsupport.Eventually(t, "the disconnection", func() bool { connected, _ := c.GetStats(); return !connected })
	if since := c.Stats().DisconnectedSince; since.Before(closed) || since.After(time.Now()) {
		t.Fatalf("DisconnectedSince %v: want the disconnection, after %v", since, closed)
	}
	pub = kvtest.NewPublisher(t, ports, nil)
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	if since := c.Stats().DisconnectedSince; !since.IsZero() {
		t.Fatalf("reconnected stream: DisconnectedSince %v, want zero", since)
	}
	kvtest.Publish(t, pub, 2, 0, 5)
	testsupport.Eventually(t, "the restarted publisher's batches", func() bool { return rec.Has(2, 4) })

	st := c.Stats()
	if st.Disconnections < 1 || st.Connections < 2 || st.ReconnectAttempts < 1 {
		t.Errorf("stats %+v: want a disconnection, a reconnection and its attempts", st)
	}
}

func TestClientWithoutReplayDeliversLiveBatchesAndReportsTheGap(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	var withheld atomic.Uint64 // a seq lost live once the stream began
	withheld.Store(math.MaxUint64)
	pub := kvtest.NewPublisher(t, ports, func(c *publisher.PublisherConfig) {
		c.ReplayEndpoint = ""
		c.DropLive = func(seq uint64) bool { return seq < 5 || seq == withheld.Load() }
	})
	kvtest.Publish(t, pub, 1, 0, 5) // lost for good: withheld, and no replay

	rec := &kvtest.Recorder{}
	cfg := testClientConfig(ports) // dials a replay port nobody listens on
	cfg.ReplayTimeout = 200 * time.Millisecond
	c := startClient(t, cfg, rec)
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	// The subscription reaches the PUB a moment after the connection: keep
	// publishing until a batch arrives.
	next := 5
	testsupport.Eventually(t, "a first live batch", func() bool {
		kvtest.Publish(t, pub, 1, next, next+1)
		next++
		return rec.Count() > 0
	})
	first, _ := rec.Snapshot()
	start := int(first[0].Seq)
	testsupport.Eventually(t, "the batches published so far", func() bool { return rec.Has(1, next-1) })
	withheld.Store(uint64(next))
	kvtest.Publish(t, pub, 1, next, next+5)
	testsupport.Eventually(t, "the following batches", func() bool { return rec.Has(1, next+4) })

	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got[:next-start], 1, start, next)
	kvtest.CheckSequence(t, got[next-start:], 1, next+1, next+5)
	want := kvevent.StreamReset{Reason: kvevent.ResetUnrecoverableGap, PodKey: "default/vllm-0", NextSeq: uint64(next + 1),
		FirstMissing: uint64(next), LastMissing: uint64(next)}
	if len(resets) != 1 || resets[0] != want {
		t.Fatalf("resets %v, want only the gap of the batch withheld after the stream began: %v", resets, want)
	}
	if st := c.Stats(); st.ReplayFailures < 1 || st.JoinedAtSeq != uint64(start) {
		t.Errorf("stats %+v: want the failed replay counted and the stream joined at %d", st, start)
	}
}

func TestClientFollowsEachDataParallelRankOnItsOwnPorts(t *testing.T) {
	t.Parallel()
	p := testsupport.ConsecutivePorts(t, 4) // PUB 0, PUB 1, ROUTER 0, ROUTER 1
	base := kvtest.Ports{Pub: p[0], Router: p[2]}
	recs := []*kvtest.Recorder{{}, {}}
	for rank := range 2 {
		pub := kvtest.NewPublisher(t, base, func(c *publisher.PublisherConfig) { c.DataParallelRank = rank })
		kvtest.Publish(t, pub, 10+rank, 0, 3+rank)
		cfg := testClientConfig(base)
		cfg.DPRank = rank
		startClient(t, cfg, recs[rank])
	}
	for rank, rec := range recs {
		testsupport.Eventually(t, "the rank's batches", func() bool { return rec.Count() >= 3+rank })
		got, _ := rec.Snapshot()
		kvtest.CheckSequence(t, got, 10+rank, 0, 3+rank)
		for _, d := range got {
			if d.Rank != rank {
				t.Fatalf("rank %d client got a batch stamped rank %d", rank, d.Rank)
			}
		}
	}
}

func TestClientFollowsAnEngineOnIPv6(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, func(c *publisher.PublisherConfig) {
		c.Endpoint = fmt.Sprintf("tcp://[::1]:%d", ports.Pub)
		c.ReplayEndpoint = fmt.Sprintf("tcp://[::1]:%d", ports.Router)
	})
	kvtest.Publish(t, pub, 1, 0, 3)
	cfg := testClientConfig(ports)
	cfg.PodIP = "::1"
	rec := &kvtest.Recorder{}
	startClient(t, cfg, rec)
	testsupport.Eventually(t, "the batches", func() bool { return rec.Count() >= 3 })
	got, _ := rec.Snapshot()
	kvtest.CheckSequence(t, got, 1, 0, 3)
}

func TestParseReplayReply(t *testing.T) {
	t.Parallel()
	seq7, end := zmqwire.SeqFrame(7), zmqwire.SeqFrame(zmqwire.EndOfReplay)
	tests := []struct {
		name     string
		frames   [][]byte
		seq      uint64
		payload  string
		topic    string
		hasTopic bool
		end      bool
		err      bool
	}{
		{"v0.26 batch", [][]byte{{}, []byte("kv"), seq7, []byte("p")}, 7, "p", "kv", true, false, false},
		{"v0.26 end", [][]byte{{}, {}, end, {}}, zmqwire.EndOfReplay, "", "", true, true, false},
		{"v0.25 batch", [][]byte{{}, seq7, []byte("p")}, 7, "p", "", false, false, false},
		{"v0.25 end", [][]byte{{}, end, {}}, zmqwire.EndOfReplay, "", "", false, true, false},
		{"empty payload ends", [][]byte{{}, seq7, {}}, 7, "", "", false, true, false},
		{"no delimiter", [][]byte{seq7, []byte("p"), []byte("x")}, 0, "", "", false, false, true},
		{"too few frames", [][]byte{{}, seq7}, 0, "", "", false, false, true},
		{"too many frames", [][]byte{{}, {}, {}, seq7, []byte("p")}, 0, "", "", false, false, true},
		{"short seq", [][]byte{{}, []byte{1, 2}, []byte("p")}, 0, "", "", false, false, true},
	}
	for _, tt := range tests {
		r, err := parseReplayReply(tt.frames[:min(len(tt.frames), 4)], len(tt.frames))
		if (err != nil) != tt.err || r.seq != tt.seq || string(r.payload) != tt.payload || string(r.topic) != tt.topic ||
			r.hasTopic != tt.hasTopic || r.end != tt.end {
			t.Errorf("%s: got %+v, %v", tt.name, r, err)
		}
	}
}

func TestClientReplayFromRewindsTheStream(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	rec := &kvtest.Recorder{}
	c := startClient(t, testClientConfig(ports), rec)
	kvtest.Publish(t, pub, 1, 0, 6)
	testsupport.Eventually(t, "6 batches", func() bool { return rec.Count() >= 6 })

	if err := c.ReplayFrom(100); err == nil {
		t.Error("ReplayFrom beyond the stream succeeded")
	}
	if err := c.ReplayFrom(2); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the replayed batches", func() bool { return rec.Count() >= 10 })
	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got[6:], 1, 2, 6)
	if len(resets) != 1 || resets[0].Reason != kvevent.ResetRewind || resets[0].NextSeq != 2 {
		t.Fatalf("resets %v, want one rewind to 2", resets)
	}
}

func TestClientLifecycleErrors(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	c, err := NewZMQClient(testClientConfig(ports), &kvtest.Recorder{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Reconnect(); err != ErrClientNotRunning {
		t.Errorf("Reconnect before Start: %v, want ErrClientNotRunning", err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != ErrClientRunning {
		t.Errorf("second Start: %v, want ErrClientRunning", err)
	}
	if err := c.Connect(); err != nil {
		t.Errorf("Connect on a running client: %v", err)
	}
	if err := c.Reconnect(); err != nil {
		t.Errorf("Reconnect: %v", err)
	}
	if err := c.WaitForConnection(50 * time.Millisecond); err == nil {
		t.Error("WaitForConnection succeeded with no publisher")
	}
	if err := c.Subscribe(nil); err == nil {
		t.Error("Subscribe(nil) succeeded")
	}
	c.Close()
	c.Close()
	if err := c.Start(); err != ErrClientClosed {
		t.Errorf("Start after Close: %v, want ErrClientClosed", err)
	}
	if err := c.WaitForConnection(time.Second); err != ErrClientClosed {
		t.Errorf("WaitForConnection after Close: %v, want ErrClientClosed", err)
	}
	if _, err := NewZMQClient(testClientConfig(ports), nil); err == nil {
		t.Error("NewZMQClient accepted a nil handler")
	}
}
