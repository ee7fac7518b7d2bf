package kvtest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// Engine is a scripted KV-event engine on loopback ports: a PUB socket (an
// XPUB, to tell when a subscriber arrived) and a replay ROUTER whose every message the test decides. It plays the
// engines vLLM's publisher never is: one that counts from another seq, that
// answers replays with extra end markers or forever, or that sends huge or
// malformed messages.
//
// Buffer, Live and Publish build the stream; the replay ROUTER answers each
// request with the Engine's ReplayFunc (VLLMReplay unless SetReplay chose
// another), from its own goroutine. Methods are safe for concurrent use.
type Engine struct {
	Ports Ports
	// Topic is the topic frame of live messages and of replies.
	Topic string

	mu       sync.Mutex
	pub      *Socket
	buffered []Buffered
	replay   ReplayFunc

	requests atomic.Int64
	stop     chan struct{}
	done     chan struct{}
}

// Buffered is one batch in an Engine's replay buffer.
type Buffered struct {
	Seq     uint64
	Payload []byte
}

// ReplayFunc answers one replay request for the batches from start on,
// given the engine's buffer, through w. It runs on the engine's ROUTER
// goroutine; the next request waits until it returns.
type ReplayFunc func(start uint64, buffered []Buffered, w *ReplayWriter)

// ReplayWriter sends the replies to one replay request.
type ReplayWriter struct {
	router *zmq.Socket
	id     []byte
	topic  []byte
	stop   <-chan struct{}
	failed bool
}

// Frames sends one reply of frames after the requester's identity; it
// reports false once the engine is closing, or a send failed because the
// requester is gone.
func (w *ReplayWriter) Frames(frames ...[]byte) bool {
	select {
	case <-w.stop:
		return false
	default:
	}
	if w.failed {
		return false
	}
	if err := zmqwire.SendFrames(w.router, 0, append([][]byte{w.id}, frames...)...); err != nil {
		w.failed = true
	}
	return !w.failed
}

// Batch sends batch seq as vLLM v0.26 and later do: ["", topic, seq,
// payload].
func (w *ReplayWriter) Batch(seq uint64, payload []byte) bool {
	return w.Frames(nil, w.topic, zmqwire.SeqFrame(seq), payload)
}

// End sends vLLM's end marker ["", "", 0xffffffffffffffff, ""].
func (w *ReplayWriter) End() bool {
	return w.Frames(nil, nil, zmqwire.SeqFrame(zmqwire.EndOfReplay), nil)
}

// VLLMReplay answers as vLLM does: every buffered batch from start on, then
// the end marker.
func VLLMReplay(start uint64, buffered []Buffered, w *ReplayWriter) {
	for _, b := range buffered {
		if b.Seq >= start && !w.Batch(b.Seq, b.Payload) {
			return
		}
	}
	w.End()
}

// NewEngine binds an engine's PUB and replay ROUTER on ports (ROUTER on
// 127.0.0.1); it is closed at cleanup.
func NewEngine(t testing.TB, ports Ports) *Engine {
	t.Helper()
	e := &Engine{Ports: ports, pub: RawSocket(t, zmq.XPUB), replay: VLLMReplay,
		stop: make(chan struct{}), done: make(chan struct{})}
	if err := errors.Join(e.pub.SetSndhwm(0), e.pub.SetXpubVerbose(1)); err != nil {
		t.Fatal(err)
	}
	if err := e.pub.SetIpv6(true); err != nil {
		t.Fatal(err)
	}
	if err := e.pub.Bind(BindEndpoint(ports.Pub)); err != nil {
		t.Fatalf("bind the engine's PUB: %v", err)
	}
	// A reply to a requester that is gone fails, so that a ReplayFunc that
	// answers forever stops when its requester leaves.
	router := RawSocket(t, zmq.ROUTER)
	if err := errors.Join(router.SetSndhwm(0), router.SetRouterMandatory(1)); err != nil {
		t.Fatal(err)
	}
	if err := router.Bind(fmt.Sprintf("tcp://127.0.0.1:%d", ports.Router)); err != nil {
		t.Fatalf("bind the engine's ROUTER: %v", err)
	}
	go e.serve(router)
	t.Cleanup(e.Close)
	return e
}

// Close stops the replay ROUTER's goroutine, waiting for it, and closes the
// sockets; it is idempotent.
func (e *Engine) Close() {
	e.mu.Lock()
	select {
	case <-e.stop:
	default:
		close(e.stop)
	}
	e.mu.Unlock()
	<-e.done
	e.mu.Lock()
	e.pub.Close()
	e.mu.Unlock()
}

// SetReplay makes f answer the replay requests from now on.
func (e *Engine) SetReplay(f ReplayFunc) {
	e.mu.Lock()
	e.replay = f
	e.mu.Unlock()
}

// Requests returns how many replay requests the engine received.
func (e *Engine) Requests() int { return int(e.requests.Load()) }

// Buffer adds batch seq to the replay buffer without sending it live.
func (e *Engine) Buffer(seq uint64, payload []byte) {
	e.mu.Lock()
	e.buffered = append(e.buffered, Buffered{seq, payload})
	e.mu.Unlock()
}

// AwaitSubscriber waits until a subscriber's subscription reaches the PUB,
// after which live messages reach that subscriber.
func (e *Engine) AwaitSubscriber(t testing.TB) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	deadline := time.Now().Add(testsupport.WaitTimeout)
	for time.Now().Before(deadline) {
		msg, err := e.pub.RecvBytes(zmq.DONTWAIT)
		if err == nil && len(msg) > 0 && msg[0] == 1 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no subscriber reached the engine's PUB within %v", testsupport.WaitTimeout)
}

// Forget empties the replay buffer, as a restarted engine's is.
func (e *Engine) Forget() {
	e.mu.Lock()
	e.buffered = nil
	e.mu.Unlock()
}

// Live sends batch seq on the PUB only: [topic, seq, payload].
func (e *Engine) Live(t testing.TB, seq uint64, payload []byte) {
	t.Helper()
	e.Frames(t, []byte(e.Topic), zmqwire.SeqFrame(seq), payload)
}

// Publish buffers batch seq and sends it live, as vLLM publishes.
func (e *Engine) Publish(t testing.TB, seq uint64, payload []byte) {
	t.Helper()
	e.Buffer(seq, payload)
	e.Live(t, seq, payload)
}

// Frames sends one raw live message.
func (e *Engine) Frames(t testing.TB, frames ...[]byte) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := zmqwire.SendFrames(e.pub.Socket, 0, frames...); err != nil {
		t.Fatalf("engine send: %v", err)
	}
}

// serve answers replay requests until Close.
func (e *Engine) serve(router *Socket) {
	defer close(e.done)
	defer router.Close()
	poller := zmq.NewPoller()
	poller.Add(router.Socket, zmq.POLLIN)
	var frames [][]byte
	for {
		select {
		case <-e.stop:
			return
		default:
		}
		if ready, err := poller.Poll(10 * time.Millisecond); err != nil || len(ready) == 0 {
			continue
		}
		var n int
		var err error
		frames, n, err = zmqwire.RecvFrames(router.Socket, zmq.DONTWAIT, frames, 3)
		if err != nil || n != 3 {
			continue
		}
		start, ok := zmqwire.ParseSeqFrame(frames[2])
		if !ok {
			continue
		}
		e.requests.Add(1)
		e.mu.Lock()
		replay, buffered := e.replay, append([]Buffered(nil), e.buffered...)
		e.mu.Unlock()
		replay(start, buffered, &ReplayWriter{router: router.Socket, id: append([]byte(nil), frames[0]...),
			topic: []byte(e.Topic), stop: e.stop})
	}
}
