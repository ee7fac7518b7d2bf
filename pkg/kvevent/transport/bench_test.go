package transport

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
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
	payload, err := sixteenBlockPayload()
	if err != nil {
		b.Fatal(err)
	}
	return payload
}

func sixteenBlockPayload() ([]byte, error) {
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
	return kvevent.EncodeEventBatch(batch)
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
// ones that needed a replay. The client paces its reads by default, so the
// last batches reach the handler up to DefaultReadInterval after they were
// published: a run much shorter than a second understates the rate.
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

// pacedPublisherEnv, set in the test binary's environment to
// "pubPort,routerPort,period", makes it a publisher of sixteen-block
// batches, one every period, until it is killed (see TestMain). With a
// fourth field, "pubPort,routerPort,period,topic", it connects to a
// receiver bound at 127.0.0.1:pubPort and publishes with that topic.
const pacedPublisherEnv = "KVGATE_TEST_PACED_PUBLISHER"

// pacedPeriod is the time between BenchmarkPacedBatches's batches: vLLM
// publishes a batch per scheduler step, milliseconds apart or more.
const pacedPeriod = 2 * time.Millisecond

// runPacedPublisher publishes as pacedPublisherEnv's value spec says.
func runPacedPublisher(spec string) error {
	var pub, router int
	var period time.Duration
	parts := strings.Split(spec, ",")
	if len(parts) != 3 && len(parts) != 4 {
		return fmt.Errorf("%s=%q: want pubPort,routerPort,period[,topic]", pacedPublisherEnv, spec)
	}
	var errs [3]error
	pub, errs[0] = strconv.Atoi(parts[0])
	router, errs[1] = strconv.Atoi(parts[1])
	period, errs[2] = time.ParseDuration(parts[2])
	if err := errors.Join(errs[:]...); err != nil {
		return err
	}
	cfg := kvtest.PublisherConfig(kvtest.Ports{Pub: pub, Router: router})
	if len(parts) == 4 {
		cfg.Endpoint, cfg.Topic = fmt.Sprintf("tcp://127.0.0.1:%d", pub), parts[3]
	}
	p, err := publisher.NewPublisher(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	payload, err := sixteenBlockPayload()
	if err != nil {
		return err
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	for range tick.C {
		if err := p.PublishRaw(payload); err != nil {
			return err
		}
	}
	return nil
}

// pacedCounter counts the batches it handles, and signals once when the
// count reaches a mark, so that no goroutine wakes for each batch but the
// client's own.
type pacedCounter struct {
	// interval is the mean time between batches over all publishers.
	interval time.Duration
	handled  atomic.Uint64
	mark     atomic.Uint64
	armed    atomic.Bool
	reached  chan struct{}
}

func (h *pacedCounter) HandleEvent(kvevent.KVEvent) error { return nil }

func (h *pacedCounter) HandleBatch(uint64, *kvevent.EventBatch) error {
	if h.handled.Add(1) >= h.mark.Load() && h.armed.CompareAndSwap(true, false) {
		h.reached <- struct{}{}
	}
	return nil
}

// await waits until n more batches were handled. A batch handled while
// the mark is being set may go unsignalled; the next one signals.
func (h *pacedCounter) await(b *testing.B, n int) {
	h.mark.Store(h.handled.Load() + uint64(n))
	h.armed.Store(true)
	select {
	case <-h.reached:
	case <-time.After(testsupport.WaitTimeout + time.Duration(n)*h.interval):
		b.Fatalf("%d batches handled, short of %d", h.handled.Load(), h.mark.Load())
	}
}

// BenchmarkPacedBatches measures what receiving a batch costs when batches
// come one at a time, as from an engine: a publisher in another process
// sends a sixteen-block batch every pacedPeriod, and cpu-ns/batch is this
// process's CPU time per batch handled, over all its threads (libzmq's
// too). Between batches the client waits on its sockets, so each batch
// pays the wake-ups a batch costs a gateway following engines at their
// pace: reading each batch as it comes (at-once), or those that come
// within DefaultReadInterval of a read together (default).
func BenchmarkPacedBatches(b *testing.B) {
	for _, tc := range readIntervals {
		b.Run(tc.name, func(b *testing.B) { benchmarkPacedBatches(b, 1, pacedPeriod, tc.interval) })
	}
}

// readIntervals are the read intervals the paced benchmarks compare:
// every message read as it comes, and the default.
var readIntervals = []struct {
	name     string
	interval time.Duration
}{{"at-once", 0}, {"default", DefaultReadInterval}}

// BenchmarkPacedBatchesFleet is BenchmarkPacedBatches for a gateway
// following a fleet: 16 engines, each in a process of its own publishing
// a batch every fleetPeriod, followed by 16 clients sharing a ZeroMQ
// context, as a KVEventManager's clients do. An engine's batches come
// further apart than the read interval: pacing them must cost nothing.
func BenchmarkPacedBatchesFleet(b *testing.B) {
	for _, tc := range readIntervals {
		b.Run(tc.name, func(b *testing.B) { benchmarkPacedBatches(b, 16, fleetPeriod, tc.interval) })
	}
}

// fleetPeriod is the time between an engine's batches in
// BenchmarkPacedBatchesFleet: a busy engine's scheduler step.
const fleetPeriod = 20 * time.Millisecond

// BenchmarkPacedBatchesFleetBound is BenchmarkPacedBatchesFleet with the
// engines dialling into a BindReceiver: one socket and one goroutine
// receive every engine's batches, reading them as they come (at-once) or
// at most once per DefaultReadInterval (default).
func BenchmarkPacedBatchesFleetBound(b *testing.B) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
	}{{"at-once", -1}, {"default", 0}} {
		b.Run(tc.name, func(b *testing.B) { benchmarkPacedBatchesFleetBound(b, tc.interval) })
	}
}

func benchmarkPacedBatchesFleetBound(b *testing.B, readInterval time.Duration) {
	zctx := newBenchContext(b)
	h := &pacedCounter{reached: make(chan struct{}, 1), interval: fleetPeriod / 16}
	port := testsupport.FreePorts(b, 1)[0]
	recv, err := NewBindReceiver(BindConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port), Context: zctx,
		Logger: klog.Background().V(1), ReadInterval: readInterval})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(recv.Close)
	streams := make([]*BoundStream, 16)
	for i := range streams {
		cfg, ports := pacedEngineConfig(b, i)
		cfg.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports.Router)
		enginePort := 8000 + i
		followed, err := recv.Follow(BoundStreamConfig{Config: cfg, EnginePort: enginePort, Handler: h})
		if err != nil {
			b.Fatal(err)
		}
		streams[i] = followed[0]
		startPacedPublisher(b, fmt.Sprintf("%d,%d,%v,%s", port, ports.Router, fleetPeriod,
			BindTopic("127.0.0.1", enginePort, cfg.ModelName)))
	}
	testsupport.Eventually(b, "every engine heard", func() bool {
		for _, s := range streams {
			if !s.Stats().Connected {
				return false
			}
		}
		return true
	})
	measurePacedBatches(b, h, len(streams))
}

// benchmarkPacedBatches follows the given number of engines, each a
// publisher in another process sending a batch every period, and reports
// this process's CPU time per batch handled.
func benchmarkPacedBatches(b *testing.B, engines int, period, readInterval time.Duration) {
	zctx := newBenchContext(b)
	h := &pacedCounter{reached: make(chan struct{}, 1), interval: period / time.Duration(engines)}
	clients := make([]*ZMQClient, engines)
	for i := range clients {
		cfg, ports := pacedEngineConfig(b, i)
		cfg.Context, cfg.ReadInterval = zctx, readInterval
		clients[i] = startClient(b, cfg, h)
		startPacedPublisher(b, fmt.Sprintf("%d,%d,%v", ports.Pub, ports.Router, period))
	}
	for _, c := range clients {
		if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
			b.Fatal(err)
		}
	}
	measurePacedBatches(b, h, engines)
}

// pacedEngineConfig returns the configuration of the stream of engine i of
// a paced benchmark, and the ports of its publisher.
func pacedEngineConfig(b *testing.B, i int) (*ZMQClientConfig, kvtest.Ports) {
	ports := kvtest.NewPorts(b)
	cfg := testClientConfig(ports)
	cfg.PodKey = fmt.Sprintf("default/vllm-%d", i)
	cfg.Logger = klog.Background().V(1) // errors only
	cfg.PollTimeout = DefaultPollTimeout
	return cfg, ports
}

// newBenchContext returns a ZeroMQ context terminated at cleanup.
func newBenchContext(b *testing.B) *zmq.Context {
	zctx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = zctx.Term() })
	return zctx
}

// startPacedPublisher runs this test binary as a publisher of spec (see
// pacedPublisherEnv) until cleanup.
func startPacedPublisher(b *testing.B, spec string) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), pacedPublisherEnv+"="+spec)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}

// measurePacedBatches waits past the replays of what the engines
// published before they were followed, then reports this process's CPU
// time per batch h handles.
func measurePacedBatches(b *testing.B, h *pacedCounter, engines int) {
	h.await(b, 100*engines)
	cpu0 := processCPU()
	b.ResetTimer()
	h.await(b, b.N)
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/batch")
}

// processCPU returns the CPU time the process has used, over its threads.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// replayingSink is discardSink with replays available.
type replayingSink struct{ discardSink }

func (replayingSink) startReplay(uint64, bool) bool { return true }

// BenchmarkSequencerGappyOverflow measures the sequencer's cost per live
// batch when a replay stays unanswered while the live stream skips every
// other seq: the buffer fills with batches that do not follow on from each
// other, and its overflow declares each gap lost. The cost per batch should
// not grow with the buffer's bound.
func BenchmarkSequencerGappyOverflow(b *testing.B) {
	for _, maxPending := range []int{1000, DefaultMaxPendingBatches} {
		b.Run(fmt.Sprintf("pending=%d", maxPending), func(b *testing.B) {
			s := newSequencer(replayingSink{}, maxPending, DefaultMaxPendingBytes)
			payload := []byte{1}
			s.onConnected()
			s.onReplayBatch(0, payload)
			s.onReplayEnd()
			seq := uint64(1)
			b.ReportAllocs()
			for b.Loop() {
				if !s.replay.active {
					s.requestReplay(false)
				}
				seq += 2
				s.onLive(seq, payload)
			}
		})
	}
}

// BenchmarkSequencerReplayFillsHoles measures the sequencer's cost per
// batch when the live stream lost every other batch (as a publisher's
// queue drops them once full) and a replay fills the holes in order: each
// replayed batch lets one buffered batch follow on. The cost per batch
// should not grow with the number buffered.
func BenchmarkSequencerReplayFillsHoles(b *testing.B) {
	for _, held := range []int{1000, DefaultMaxPendingBatches} {
		b.Run(fmt.Sprintf("pending=%d", held), func(b *testing.B) {
			s := newSequencer(replayingSink{}, DefaultMaxPendingBatches, DefaultMaxPendingBytes)
			payload := []byte{1}
			s.onConnected()
			s.onReplayBatch(0, payload)
			s.onReplayEnd()
			seq := uint64(0) // the last seq delivered or buffered
			b.ReportAllocs()
			for b.Loop() {
				if len(s.pending) == 0 {
					b.StopTimer()
					first := seq + 1
					for range held {
						seq += 2
						s.onLive(seq, payload)
					}
					s.onReplayBatch(first-1, payload)
					b.StartTimer()
				}
				s.onReplayBatch(s.next, payload)
			}
		})
	}
}
