// Package kvtest holds what the tests of the KV-event packages share: a
// vLLM-faithful publisher on loopback ports, numbered test batches, a
// handler that records what it receives, and raw ZeroMQ sockets. Only
// tests import it.
package kvtest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
)

// BindEndpoint is a loopback-only endpoint a vLLM-style publisher binds
// (the "::" makes it bind rather than connect).
func BindEndpoint(port int) string { return fmt.Sprintf("tcp://[::ffff:127.0.0.1]:%d", port) }

// Ports are the PUB and ROUTER ports of one test publisher.
type Ports struct{ Pub, Router int }

// NewPorts returns two free consecutive ports.
func NewPorts(t testing.TB) Ports {
	p := testsupport.ConsecutivePorts(t, 2)
	return Ports{Pub: p[0], Router: p[1]}
}

// PublisherConfig configures a publisher on ports with replay, answering
// replay requests quickly.
func PublisherConfig(ports Ports) publisher.PublisherConfig {
	cfg := publisher.DefaultPublisherConfig()
	cfg.Endpoint = BindEndpoint(ports.Pub)
	cfg.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports.Router)
	cfg.ReplayPollInterval = 5 * time.Millisecond
	cfg.Logger = klog.Background().V(4)
	return cfg
}

// NewPublisher starts a publisher of PublisherConfig(ports); adjust may
// change its configuration first. It is closed at cleanup.
func NewPublisher(t testing.TB, ports Ports, adjust func(*publisher.PublisherConfig)) *publisher.Publisher {
	t.Helper()
	cfg := PublisherConfig(ports)
	if adjust != nil {
		adjust(&cfg)
	}
	p, err := publisher.NewPublisher(cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// Batch is batch i of a test stream: one BlockStored event whose first
// hash is tag*1e6+i, so batches of different publishers differ.
func Batch(tag, i int) *kvevent.EventBatch {
	h := uint64(tag*1_000_000 + i)
	return &kvevent.EventBatch{
		TS:               1757500000 + float64(i),
		DataParallelRank: kvevent.NoRank,
		Events: []kvevent.KVEvent{&kvevent.BlockStoredEvent{
			BlockHashes: []kvevent.BlockHash{h, h + 500_000},
			TokenIDs:    make([]uint32, 32),
			BlockSize:   16,
		}},
	}
}

// Payload is Batch(tag, i) as vLLM v0.24 and later encode it.
func Payload(t testing.TB, tag, i int) []byte {
	t.Helper()
	p, err := kvevent.EncodeEventBatch(Batch(tag, i))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Publish publishes Batch(tag, i) for i in [from, to).
func Publish(t testing.TB, p *publisher.Publisher, tag, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := p.Publish(Batch(tag, i)); err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
	}
}

// Delivered is one batch a handler received.
type Delivered struct {
	Seq   uint64
	First kvevent.BlockHash // first hash of the first event
	Rank  int
}

// Summarize is what a Recorder keeps of a batch.
func Summarize(seq uint64, b *kvevent.EventBatch) Delivered {
	d := Delivered{Seq: seq, Rank: b.DataParallelRank}
	if len(b.Events) > 0 {
		if ev, ok := b.Events[0].(*kvevent.BlockStoredEvent); ok && len(ev.BlockHashes) > 0 {
			d.First = ev.BlockHashes[0]
		}
	}
	return d
}

// Recorder is a BatchHandler and ResetHandler that records what it gets.
type Recorder struct {
	mu      sync.Mutex
	batches []Delivered
	resets  []kvevent.StreamReset
}

// HandleEvent panics: a Recorder handles batches.
func (r *Recorder) HandleEvent(kvevent.KVEvent) error { panic("Recorder handles batches") }

// HandleBatch records the batch.
func (r *Recorder) HandleBatch(seq uint64, b *kvevent.EventBatch) error {
	r.mu.Lock()
	r.batches = append(r.batches, Summarize(seq, b))
	r.mu.Unlock()
	return nil
}

// HandleReset records the reset.
func (r *Recorder) HandleReset(rs kvevent.StreamReset) {
	r.mu.Lock()
	r.resets = append(r.resets, rs)
	r.mu.Unlock()
}

// Snapshot returns the batches and resets recorded so far.
func (r *Recorder) Snapshot() ([]Delivered, []kvevent.StreamReset) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Delivered(nil), r.batches...), append([]kvevent.StreamReset(nil), r.resets...)
}

// Count returns how many batches were recorded.
func (r *Recorder) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.batches)
}

// Has reports whether batch seq of publisher tag was delivered.
func (r *Recorder) Has(tag, seq int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.batches {
		if d.Seq == uint64(seq) && d.First == uint64(tag*1_000_000+seq) {
			return true
		}
	}
	return false
}

// CheckSequence fails unless got holds publisher tag's batches from..to-1,
// in order, each once.
func CheckSequence(t testing.TB, got []Delivered, tag, from, to int) {
	t.Helper()
	if len(got) != to-from {
		t.Fatalf("got %d batches %v, want seqs %d..%d", len(got), got, from, to-1)
	}
	for i, d := range got {
		want := from + i
		if d.Seq != uint64(want) || d.First != uint64(tag*1_000_000+want) {
			t.Fatalf("batch %d is seq %d first hash %d, want seq %d of publisher %d", i, d.Seq, d.First, want, tag)
		}
	}
}

// AwaitBuffered waits until the publisher on ports has sent batch seq: its
// replay buffer holds it. It asks with a raw DEALER, independent of any
// client. A request left without its whole reply for awaitReplyTimeout is
// asked again on a new connection, as a client's follow-up replay would be:
// on a loaded machine a reply can be late or lost, which must not fail a
// test that only waits for the publisher.
func AwaitBuffered(t testing.TB, ports Ports, seq uint64) {
	t.Helper()
	var d *Socket
	defer func() {
		if d != nil {
			d.Close()
		}
	}()
	deadline := time.Now().Add(testsupport.WaitTimeout)
	for time.Now().Before(deadline) {
		if d == nil {
			d = replayDealer(t, ports)
		}
		found, answered := askBuffered(t, d, seq)
		if found {
			return
		}
		if !answered {
			t.Logf("replay request for seq %d unanswered for %v: asking again on a new connection", seq, awaitReplyTimeout)
			d.Close()
			d = nil
		}
	}
	t.Fatalf("publisher never buffered seq %d", seq)
}

// awaitReplyTimeout bounds AwaitBuffered's wait for one reply.
const awaitReplyTimeout = 3 * time.Second

// replayDealer returns a DEALER connected to the replay socket on ports,
// whose receives wait at most awaitReplyTimeout.
func replayDealer(t testing.TB, ports Ports) *Socket {
	t.Helper()
	d := RawSocket(t, zmq.DEALER)
	if err := d.SetRcvtimeo(awaitReplyTimeout); err != nil {
		t.Fatal(err)
	}
	if err := d.Connect(fmt.Sprintf("tcp://127.0.0.1:%d", ports.Router)); err != nil {
		t.Fatal(err)
	}
	return d
}

// askBuffered asks for a replay from seq on d and reports whether the
// reply held seq, and whether it came whole within awaitReplyTimeout.
func askBuffered(t testing.TB, d *Socket, seq uint64) (found, answered bool) {
	t.Helper()
	if _, err := d.SendMessage("", zmqwire.SeqFrame(seq)); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := d.RecvMessageBytes(0)
		if zmqwire.IsAgain(err) {
			return false, false
		}
		if err != nil {
			t.Fatalf("replay reply: %v", err)
		}
		s, _ := zmqwire.ParseSeqFrame(msg[len(msg)-2])
		if s == zmqwire.EndOfReplay {
			return found, true
		}
		found = found || s == seq
	}
}

// Socket is a raw ZeroMQ socket in a context of its own, so that closing
// it frees its descriptors before Close returns.
type Socket struct {
	*zmq.Socket
	ctx  *zmq.Context
	once sync.Once
}

// RawSocket opens a socket of type ty, closed at cleanup if not before.
func RawSocket(t testing.TB, ty zmq.Type) *Socket {
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
	ts := &Socket{Socket: s, ctx: ctx}
	t.Cleanup(ts.Close)
	return ts
}

// Close closes the socket and terminates its context; it is idempotent.
func (s *Socket) Close() {
	s.once.Do(func() {
		s.Socket.Close()
		s.ctx.Term()
	})
}

// LogLines captures the lines of a funcr logger: pass its Add to
// funcr.New.
type LogLines = testsupport.LogLines

// RepeatUntil repeats act until cond holds, giving each round a moment to
// take effect, and fails after testsupport.WaitTimeout.
func RepeatUntil(t testing.TB, what string, act func(), cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testsupport.WaitTimeout)
	for time.Now().Before(deadline) {
		act()
		round := time.Now().Add(200 * time.Millisecond)
		for time.Now().Before(round) {
			if cond() {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	t.Fatalf("timed out after %v waiting for %s", testsupport.WaitTimeout, what)
}
