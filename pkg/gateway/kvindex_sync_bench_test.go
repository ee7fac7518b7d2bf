package gateway

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
	"github.com/kvgate/kvgate/pkg/routingbench"
	"github.com/kvgate/kvgate/pkg/sim"
)

// syncStream is the stream of the benchmarked engine.
var syncStream = kvevent.StreamID{PodKey: "bench/vllm-0", Model: "sim"}

// indexSink delivers a client's batches to a KVIndex, counting the
// batches and blocks applied.
type indexSink struct {
	index   kvIndex
	batches atomic.Uint64
	blocks  atomic.Uint64
}

func (s *indexSink) HandleEvent(ev kvevent.KVEvent) error {
	return s.HandleBatch(0, &kvevent.EventBatch{Events: []kvevent.KVEvent{ev}})
}

func (s *indexSink) HandleBatch(_ uint64, b *kvevent.EventBatch) error {
	err := s.index.ApplyBatch(syncStream, b)
	s.blocks.Add(uint64(batchBlocks(b)))
	s.batches.Add(1)
	return err
}

func (s *indexSink) HandleReset(kvevent.StreamReset) { s.index.ResetStream(syncStream) }

// batchBlocks counts the blocks a batch stores or removes.
func batchBlocks(b *kvevent.EventBatch) int {
	n := 0
	for _, ev := range b.Events {
		switch e := ev.(type) {
		case *kvevent.BlockStoredEvent:
			n += len(e.BlockHashes)
		case *kvevent.BlockRemovedEvent:
			n += len(e.BlockHashes)
		}
	}
	return n
}

var (
	engineBatchesOnce sync.Once
	engineBatches     []*kvevent.EventBatch
	engineBatchesErr  error
)

// simulatedBatches returns the event batches of a simulated engine (vLLM's
// scheduler and paged KV cache, 4,096 blocks of 16 tokens) serving a
// shared-prefix chat workload in virtual time, step after step: prefills
// of whole prompts and of their new turns, decode-filled blocks and
// evictions. The last batch clears the cache, so that the batches can be
// published over and over as one valid stream.
func simulatedBatches(b *testing.B) []*kvevent.EventBatch {
	engineBatchesOnce.Do(func() { engineBatches, engineBatchesErr = runEngine() })
	if engineBatchesErr != nil {
		b.Fatal(engineBatchesErr)
	}
	return engineBatches
}

func runEngine() ([]*kvevent.EventBatch, error) {
	w, err := routingbench.GenerateSharedPrefix(routingbench.SharedPrefixConfig{
		Groups: 8, SystemPromptTokens: 2048, Conversations: 200, Turns: 4,
		MinUserTokens: 50, MaxUserTokens: 300, MinAnswerTokens: 16, MaxAnswerTokens: 64,
		ConversationsPerSecond: 20, MeanTurnGap: time.Second, Seed: 1,
	})
	if err != nil {
		return nil, err
	}
	e, err := sim.NewEngine(sim.EngineConfig{NumGPUBlocks: 4096, HashSeed: "bench", Events: true,
		Latency: routingbench.DefaultLatency})
	if err != nil {
		return nil, err
	}
	var batches []*kvevent.EventBatch
	start := time.Unix(1_800_000_000, 0)
	now := start
	for next := 0; next < len(w.Requests) || e.HasWork(); {
		for ; next < len(w.Requests) && !start.Add(w.Requests[next].Arrival).After(now); next++ {
			r := w.Requests[next]
			if err := e.Add(sim.RequestSpec{ID: r.ID, Prompt: r.Prompt, MaxTokens: r.OutputTokens}, now); err != nil {
				return nil, fmt.Errorf("request %s: %w", r.ID, err)
			}
		}
		end, ok := e.BeginStep(now)
		switch {
		case !ok && next == len(w.Requests):
			return nil, fmt.Errorf("the engine cannot schedule its %d requests left", e.QueueState().Waiting)
		case !ok:
			now = start.Add(w.Requests[next].Arrival)
			continue
		}
		if res := e.EndStep(); res.Batch != nil {
			batches = append(batches, res.Batch)
		}
		now = end
	}
	clear, err := e.ResetPrefixCache(now)
	if err != nil {
		return nil, err
	}
	return append(batches, clear), nil
}

// syncWindow bounds the batches published but not yet applied: far below
// the publisher's replay buffer and both high-water marks, so that the
// publisher runs as fast as the client and the index sustain without
// libzmq dropping messages.
const syncWindow = 4000

// BenchmarkEventSyncEndToEnd measures KV event sync as the gateway runs
// it, from a simulated engine's batches to the prefix index: Publisher
// (vLLM's wire format, encoded per batch) -> ZeroMQ PUB/SUB over 127.0.0.1
// -> ZMQClient (sequencing, replay on a gap, decoding) -> the gateway's kvIndex ->
// indexer.SyncPrefixHashTable. An op is one batch; blocks/s counts the
// blocks stored and removed that the index applied per second, and
// lost_batches the batches that never reached it (the client replays any
// that libzmq drops, so it must be 0).
func BenchmarkEventSyncEndToEnd(b *testing.B) {
	batches := simulatedBatches(b)
	table, err := indexer.NewSyncPrefixHashTable(indexer.Config{}, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	sink := &indexSink{index: kvIndex{table: table}}
	pub, client := startSyncPair(b, sink)
	// Until a first batch arrives the subscription may not be in place;
	// every warm-up batch arrives in the end, live or replayed.
	var published uint64
	deadline := time.Now().Add(time.Minute)
	for sink.batches.Load() == 0 {
		publish(b, pub, batches[published%uint64(len(batches))])
		published++
		if time.Now().After(deadline) {
			b.Fatal("no batch reached the index within a minute")
		}
		time.Sleep(time.Millisecond)
	}
	waitApplied(b, sink, published)
	before, blocks0 := client.Stats(), sink.blocks.Load()

	b.ResetTimer()
	start := time.Now()
	for range b.N {
		for published-sink.batches.Load() >= syncWindow {
			time.Sleep(20 * time.Microsecond)
		}
		publish(b, pub, batches[published%uint64(len(batches))])
		published++
	}
	waitApplied(b, sink, published)
	elapsed := time.Since(start)
	b.StopTimer()

	after := client.Stats()
	lost := published - sink.batches.Load()
	b.ReportMetric(float64(sink.blocks.Load()-blocks0)/elapsed.Seconds(), "blocks/s")
	b.ReportMetric(float64(lost), "lost_batches")
	b.ReportMetric(float64(after.ReplayedBatches-before.ReplayedBatches), "replayed_batches")
	if lost != 0 || after.MissedBatches != 0 || after.HandlerErrors != 0 {
		b.Errorf("%d batches lost, %d missed for good, %d the index refused", lost, after.MissedBatches, after.HandlerErrors)
	}
}

func publish(b *testing.B, p *publisher.Publisher, batch *kvevent.EventBatch) {
	if err := p.Publish(batch); err != nil {
		b.Fatal(err)
	}
}

// waitApplied waits until the index applied n batches, or until none
// arrived for 5 s (the rest are lost).
func waitApplied(b *testing.B, sink *indexSink, n uint64) {
	last, lastChange := sink.batches.Load(), time.Now()
	for last < n && time.Since(lastChange) < 5*time.Second {
		time.Sleep(50 * time.Microsecond)
		if cur := sink.batches.Load(); cur != last {
			last, lastChange = cur, time.Now()
		}
	}
}

// startSyncPair starts a publisher bound on loopback and a client
// following it into sink, both closed when the benchmark ends.
func startSyncPair(b *testing.B, sink *indexSink) (*publisher.Publisher, *transport.ZMQClient) {
	ports := testsupport.FreePorts(b, 2)
	pubPort, replayPort := ports[0], ports[1]
	pc := publisher.DefaultPublisherConfig()
	pc.Endpoint = fmt.Sprintf("tcp://[::ffff:127.0.0.1]:%d", pubPort)
	pc.ReplayEndpoint = fmt.Sprintf("tcp://[::ffff:127.0.0.1]:%d", replayPort)
	pub, err := publisher.NewPublisher(pc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = pub.Close() })
	cfg := transport.DefaultZMQClientConfig(syncStream.PodKey, "127.0.0.1", syncStream.Model)
	cfg.PubPort, cfg.RouterPort = pubPort, replayPort
	cfg.Logger = klog.Background().V(1) // errors only
	client, err := transport.NewZMQClient(cfg, sink)
	if err != nil {
		b.Fatal(err)
	}
	if err := client.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(client.Close)
	if err := client.WaitForConnection(time.Minute); err != nil {
		b.Fatal(err)
	}
	return pub, client
}
