package transport

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
)

// blockCounter counts the blocks of the BlockStored events it receives.
type blockCounter struct {
	batches atomic.Uint64
	blocks  atomic.Uint64
}

func (h *blockCounter) HandleEvent(ev kvevent.KVEvent) error {
	if s, ok := ev.(*kvevent.BlockStoredEvent); ok {
		h.blocks.Add(uint64(len(s.BlockHashes)))
	}
	return nil
}

func (h *blockCounter) HandleBatch(_ uint64, b *kvevent.EventBatch) error {
	for _, ev := range b.Events {
		h.HandleEvent(ev)
	}
	h.batches.Add(1)
	return nil
}

// sixteenBlockBatch is what vLLM publishes for a 256-token prefill with
// 16-token blocks: one BlockStored event of 16 chained hashes.
func sixteenBlockBatch(b testing.TB) []byte {
	hashes := make([]kvevent.BlockHash, 16)
	for i := range hashes {
		hashes[i] = 0x9e3779b97f4a7c15 * uint64(i+1)
	}
	tokens := make([]uint32, 16*16)
	for i := range tokens {
		tokens[i] = uint32(1000 + i*7)
	}
	batch := &kvevent.EventBatch{TS: 1757500000.25, DataParallelRank: 0, Events: []kvevent.KVEvent{&kvevent.BlockStoredEvent{
		BlockHashes: hashes, ParentBlockHash: 0x1234, HasParent: true, TokenIDs: tokens, BlockSize: 16,
		Medium: kvevent.MediumGPU, GroupIdx: 0,
	}}}
	payload, err := kvevent.EncodeEventBatch(batch)
	if err != nil {
		b.Fatal(err)
	}
	return payload
}

// loopbackWindow bounds the batches published but not yet handled in
// BenchmarkLoopback: far below the high-water marks (100000 each side) and
// the replay buffer (10000 is the default; the benchmark's publisher keeps
// as many), so the publisher runs as fast as the client sustains without
// libzmq dropping messages at a high-water mark.
const loopbackWindow = 8000

// BenchmarkLoopback measures one publisher -> ZMQ client -> counting
// handler over 127.0.0.1, in 16-block batches: the blocks/s the client
// sustains end to end, the batches that never reached the handler, and the
// ones that needed a replay.
func BenchmarkLoopback(b *testing.B) {
	ports := kvtest.NewPorts(b)
	pub := kvtest.NewPublisher(b, ports, nil)
	h := &blockCounter{}
	cfg := testClientConfig(ports)
	cfg.Logger = klog.Background().V(1) // errors only
	cfg.ReconnectDelay, cfg.MaxReconnectDelay = DefaultReconnectInterval, MaxReconnectInterval
	c := startClient(b, cfg, h)
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		b.Fatal(err)
	}
	payload := sixteenBlockBatch(b)
	// Until a first batch arrives the subscription may not be in place;
	// every warm-up batch arrives in the end, live or replayed.
	var warm uint64
	testsupport.Eventually(b, "a first batch", func() bool {
		if err := pub.PublishRaw(payload); err != nil {
			b.Fatal(err)
		}
		warm++
		return h.batches.Load() > 0
	})
	testsupport.Eventually(b, "the warm-up batches", func() bool { return h.batches.Load() == warm })
	before := c.Stats()

	b.ResetTimer()
	start := time.Now()
	for i := range uint64(b.N) {
		for warm+i-h.batches.Load() >= loopbackWindow {
			time.Sleep(50 * time.Microsecond)
		}
		if err := pub.PublishRaw(payload); err != nil {
			b.Fatal(err)
		}
	}
	want := warm + uint64(b.N)
	last, lastChange := h.batches.Load(), time.Now()
	for h.batches.Load() < want && time.Since(lastChange) < 2*time.Second {
		time.Sleep(100 * time.Microsecond)
		if n := h.batches.Load(); n != last {
			last, lastChange = n, time.Now()
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()

	got := h.batches.Load() - warm
	after := c.Stats()
	b.ReportMetric(float64(got*16)/elapsed.Seconds(), "blocks/s")
	b.ReportMetric(float64(uint64(b.N)-got), "lost_batches")
	b.ReportMetric(float64(after.ReplayedBatches-before.ReplayedBatches), "replayed_batches")
	if got != uint64(b.N) || after.MissedBatches != before.MissedBatches {
		b.Errorf("delivered %d of %d batches (%d missed for good)", got, b.N, after.MissedBatches-before.MissedBatches)
	}
}

// BenchmarkClientDeliver measures a stream's work per batch once it is
// off the socket: decode, count, metrics and the handler call.
func BenchmarkClientDeliver(b *testing.B) {
	m, err := NewKVCacheMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultZMQClientConfig("ns/pod", "127.0.0.1", "m")
	cfg.Metrics = m
	c, err := NewZMQClient(cfg, &blockCounter{})
	if err != nil {
		b.Fatal(err)
	}
	payload := sixteenBlockBatch(b)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	s := c.idle.s
	var seq uint64
	for b.Loop() {
		s.deliver(seq, payload, false)
		seq++
	}
	b.ReportMetric(float64(b.N*16)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkSequencerInOrder measures the sequencer's cost per live batch
// on an exact stream.
func BenchmarkSequencerInOrder(b *testing.B) {
	s := newSequencer(discardSink{}, DefaultMaxPendingBatches, DefaultMaxPendingBytes)
	payload := []byte{1}
	b.ReportAllocs()
	var seq uint64
	for b.Loop() {
		s.onLive(seq, payload)
		seq++
	}
}

type discardSink struct{}

func (discardSink) deliver(uint64, []byte, bool)  {}
func (discardSink) reset(kvevent.StreamReset)     {}
func (discardSink) joined(uint64, uint64)         {}
func (discardSink) startReplay(uint64, bool) bool { return false }
func (discardSink) abortReplay()                  {}
func (discardSink) pendingOverflow()              {}
