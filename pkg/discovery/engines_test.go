package discovery

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

// testModel is the base model every test engine serves.
const testModel = "llama"

// testBlockSize is the test engines' block size, in tokens.
const testBlockSize = 16

// Each test engine publishes one chain of blocks, named by its tag: batch i
// stores block i, whose parent is block i-1, so that a pod holds the blocks
// of batches 0..n-1 exactly when the index matches the chain's first n
// blocks and holds no other block of the pod.

// batchHash is the engine hash of block i of chain tag.
func batchHash(tag, i int) kvevent.BlockHash { return kvevent.BlockHash(tag*1_000_000 + i) }

// blockTokens are the tokens of block i of chain tag, distinct for every
// tag and block.
func blockTokens(tag, i int) []uint32 {
	toks := make([]uint32, testBlockSize)
	for j := range toks {
		toks[j] = uint32(tag*10_000_000 + i*testBlockSize + j)
	}
	return toks
}

// chainTokens are the tokens of the first n blocks of chain tag.
func chainTokens(tag, n int) []uint32 {
	var toks []uint32
	for i := range n {
		toks = append(toks, blockTokens(tag, i)...)
	}
	return toks
}

// chainBatch is batch i of chain tag: one BlockStored of block i, computed
// with adapter lora ("" for the base model).
func chainBatch(tag, i int, lora string) *kvevent.EventBatch {
	ev := &kvevent.BlockStoredEvent{BlockHashes: []kvevent.BlockHash{batchHash(tag, i)}, TokenIDs: blockTokens(tag, i),
		BlockSize: testBlockSize, Medium: kvevent.MediumGPU, GroupIdx: kvevent.NoGroup, LoraName: lora}
	if i > 0 {
		ev.ParentBlockHash, ev.HasParent = batchHash(tag, i-1), true
	}
	return &kvevent.EventBatch{TS: float64(i), DataParallelRank: kvevent.NoRank, Events: []kvevent.KVEvent{ev}}
}

// publishBatches publishes batches from..to-1 of chain tag.
func publishBatches(t testing.TB, p *publisher.Publisher, tag, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := p.Publish(chainBatch(tag, i, "")); err != nil {
			t.Fatal(err)
		}
	}
}

// enginePublisher is a vLLM-style publisher at ip: PUB bound on pub,
// replay ROUTER on pub+1.
func enginePublisher(t testing.TB, ip string, pub int) *publisher.Publisher {
	t.Helper()
	return rankPublisher(t, ip, pub, pub+1)
}

// rankPublisher is a vLLM-style publisher at ip with its PUB socket on pub
// and its replay ROUTER on replay.
func rankPublisher(t testing.TB, ip string, pub, replay int) *publisher.Publisher {
	t.Helper()
	return newPublisher(t, ip, pub, replay, publisher.DefaultPublisherConfig().BufferSteps)
}

// bufferedPublisher is enginePublisher with a replay buffer of the latest
// steps batches (vLLM's buffer_steps, which a busy engine rolls over in
// minutes).
func bufferedPublisher(t testing.TB, ip string, pub, steps int) *publisher.Publisher {
	t.Helper()
	return newPublisher(t, ip, pub, pub+1, steps)
}

func newPublisher(t testing.TB, ip string, pub, replay, steps int) *publisher.Publisher {
	t.Helper()
	cfg := publisher.DefaultPublisherConfig()
	cfg.BufferSteps = steps
	cfg.Endpoint = fmt.Sprintf("tcp://[::ffff:%s]:%d", ip, pub)
	cfg.ReplayEndpoint = fmt.Sprintf("tcp://%s:%d", ip, replay)
	cfg.ReplayPollInterval = 5 * time.Millisecond
	cfg.Logger = klog.Background().V(4)
	p, err := publisher.NewPublisher(cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// freePortPair returns a port p such that p and p+1 were free on both
// loopback addresses the tests use.
func freePortPair(t testing.TB) int {
	t.Helper()
	return testsupport.ConsecutivePorts(t, 2, "127.0.0.1", "127.0.0.2")[0]
}

func testClientTemplate() *transport.ZMQClientConfig {
	c := transport.DefaultZMQClientConfig("", "", "")
	c.PollTimeout = 20 * time.Millisecond
	c.ReplayTimeout = 2 * time.Second
	c.ReconnectDelay = 50 * time.Millisecond
	c.MaxReconnectDelay = 200 * time.Millisecond
	c.Logger = klog.Background().V(4)
	return c
}

// testIndex is the gateway's prefix index, fed by a KV event manager as
// the gateway feeds it (it is the manager's kvevent.KVIndex), with the
// queries the tests assert on.
type testIndex struct {
	table *indexer.SyncPrefixHashTable
}

var _ kvevent.KVIndex = (*testIndex)(nil)

// ApplyBatch applies the stream's batch, indexed under its pod, rank and
// base model.
func (x *testIndex) ApplyBatch(s kvevent.StreamID, b *kvevent.EventBatch) error {
	return x.table.ApplyBatch(indexer.Stream{Pod: s.PodKey, Rank: s.DPRank, Model: s.Model}, b)
}

// ResetStream drops the stream's blocks.
func (x *testIndex) ResetStream(s kvevent.StreamID) {
	x.table.ResetStream(indexer.Stream{Pod: s.PodKey, Rank: s.DPRank, Model: s.Model})
}

// PurgePod drops the pod's blocks.
func (x *testIndex) PurgePod(pod string) { x.table.PurgePod(pod) }

func newTestIndex(t testing.TB) *testIndex {
	t.Helper()
	table, err := indexer.NewSyncPrefixHashTable(indexer.Config{}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return &testIndex{table: table}
}

// newManager returns a KV event manager writing to x.
func (x *testIndex) newManager(t testing.TB) *manager.KVEventManager {
	t.Helper()
	m, err := manager.NewKVEventManager(manager.ManagerConfig{Index: x, Client: testClientTemplate(),
		Registerer: prometheus.NewRegistry(), Logger: klog.Background().V(4)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// blocks returns, per pod, the blocks the index holds for it over every
// model, rank, medium and group.
func (x *testIndex) blocks() map[string]int {
	out := map[string]int{}
	for _, m := range x.table.Stats() {
		for _, p := range m.Pods {
			for _, s := range p.Streams {
				for _, l := range s.Lanes {
					out[p.Pod] += l.Blocks
				}
			}
		}
	}
	return out
}

// ranks returns the ranks of the pod's streams that hold blocks, sorted.
func (x *testIndex) ranks(pod string) []int {
	var out []int
	for _, m := range x.table.Stats() {
		for _, p := range m.Pods {
			for _, s := range p.Streams {
				if p.Pod == pod && len(s.Lanes) > 0 && !slices.Contains(out, s.Rank) {
					out = append(out, s.Rank)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// pods lists the pods the index holds blocks of, sorted.
func (x *testIndex) pods() []string {
	var out []string
	for pod, n := range x.blocks() {
		if n > 0 {
			out = append(out, pod)
		}
	}
	slices.Sort(out)
	return out
}

// entries returns the number of distinct blocks the index holds.
func (x *testIndex) entries() int {
	n := 0
	for _, m := range x.table.Stats() {
		n += m.Entries
	}
	return n
}

// matched returns how many leading blocks of the first n blocks of chain
// tag the pod holds, computed with adapter lora.
func (x *testIndex) matched(pod, lora string, tag, n int) int {
	var res indexer.MatchResult
	x.table.MatchPrefix(testModel, lora, chainTokens(tag, n), []string{pod}, &res)
	return res.Pods[0].Blocks
}

// holds reports whether the index holds, for pod, exactly the blocks of
// batches 0..n-1 of chain tag.
func (x *testIndex) holds(pod string, tag, n int) bool {
	return x.blocks()[pod] == n && x.matched(pod, "", tag, n+1) == n
}
