package kvevent

import (
	"fmt"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// bindEndpoint is a loopback-only endpoint a vLLM-style publisher binds
// (the "::" makes it bind rather than connect).
func bindEndpoint(port int) string { return fmt.Sprintf("tcp://[::ffff:127.0.0.1]:%d", port) }

// testPorts are the PUB and ROUTER ports of one test publisher.
type testPorts struct{ pub, router int }

func newTestPorts(t testing.TB) testPorts {
	p := testsupport.ConsecutivePorts(t, 2)
	return testPorts{pub: p[0], router: p[1]}
}

// newTestPublisher starts a publisher on ports with replay, answering
// replay requests quickly.
func newTestPublisher(t testing.TB, ports testPorts, adjust func(*PublisherConfig)) *Publisher {
	t.Helper()
	cfg := DefaultPublisherConfig()
	cfg.Endpoint = bindEndpoint(ports.pub)
	cfg.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports.router)
	cfg.ReplayPollInterval = 5 * time.Millisecond
	cfg.Logger = klog.Background().V(4)
	if adjust != nil {
		adjust(&cfg)
	}
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// testBatch is batch i of a test stream: one BlockStored event whose first
// hash is tag*1e6+i, so batches of different publishers differ.
func testBatch(tag, i int) *EventBatch {
	h := uint64(tag*1_000_000 + i)
	return &EventBatch{
		TS:               1757500000 + float64(i),
		DataParallelRank: NoRank,
		Events: []KVEvent{&BlockStoredEvent{
			BlockHashes: []BlockHash{h, h + 500_000},
			TokenIDs:    make([]uint32, 32),
			BlockSize:   16,
		}},
	}
}

// publish publishes testBatch(tag, i) for i in [from, to).
func publish(t testing.TB, p *Publisher, tag, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := p.Publish(testBatch(tag, i)); err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
	}
}

// delivered is one batch a handler received.
type delivered struct {
	seq   uint64
	first BlockHash // first hash of the first event
	rank  int
}

// summarize is what a recorder keeps of a batch.
func summarize(seq uint64, b *EventBatch) delivered {
	d := delivered{seq: seq, rank: b.DataParallelRank}
	if len(b.Events) > 0 {
		if ev, ok := b.Events[0].(*BlockStoredEvent); ok && len(ev.BlockHashes) > 0 {
			d.first = ev.BlockHashes[0]
		}
	}
	return d
}

func (r *recorder) HandleReset(rs StreamReset) {
	r.mu.Lock()
	r.resets = append(r.resets, rs)
	r.mu.Unlock()
}

func (r *recorder) snapshot() ([]delivered, []StreamReset) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivered(nil), r.batches...), append([]StreamReset(nil), r.resets...)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.batches)
}

// awaitBuffered waits until the publisher on ports has sent batch seq: its
// replay buffer holds it. It asks with a raw DEALER, independent of the
// client.
func awaitBuffered(t testing.TB, ports testPorts, seq uint64) {
	t.Helper()
	d := rawSocket(t, zmq.DEALER)
	defer d.close()
	if err := d.Connect(fmt.Sprintf("tcp://127.0.0.1:%d", ports.router)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testsupport.WaitTimeout)
	for time.Now().Before(deadline) {
		if _, err := d.SendMessage("", seqFrame(seq)); err != nil {
			t.Fatal(err)
		}
		found := false
		for {
			msg, err := d.RecvMessageBytes(0)
			if err != nil {
				t.Fatalf("replay reply: %v", err)
			}
			s, _ := parseSeqFrame(msg[len(msg)-2])
			if s == endOfReplay {
				break
			}
			found = found || s == seq
		}
		if found {
			return
		}
	}
	t.Fatalf("publisher never buffered seq %d", seq)
}

// testSocket is a raw ZeroMQ socket in a context of its own, so that closing
// it frees its descriptors before close returns.
type testSocket struct {
	*zmq.Socket
	ctx  *zmq.Context
	once sync.Once
}

// rawSocket opens a socket of type ty, closed at cleanup if not before.
func rawSocket(t testing.TB, ty zmq.Type) *testSocket {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewSocket(ty)
	if err != nil {
		t.Fatal(err)
	}
	s.SetLinger(0)
	s.SetRcvtimeo(testsupport.WaitTimeout)
	ts := &testSocket{Socket: s, ctx: ctx}
	t.Cleanup(ts.close)
	return ts
}

func (s *testSocket) close() {
	s.once.Do(func() {
		s.Socket.Close()
		s.ctx.Term()
	})
}
