package transport

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// handWrittenEngine plays a vLLM engine with raw ZeroMQ sockets, replying to
// replay requests exactly as spec'd for vLLM's ZmqEventPublisher, so that the
// client is not only ever tested against this package's Publisher.
type handWrittenEngine struct {
	t         *testing.T
	topic     string
	withTopic bool // vLLM >= v0.26 reply layout
	dropOnce  int  // seq whose reply the first replay leaves out; -1 for none
	pub       *kvtest.Socket
	router    *kvtest.Socket
	stop      chan struct{}
	done      chan struct{}

	mu       sync.Mutex
	history  [][]byte // payload of seq i
	requests [][][]byte
}

func startHandWrittenEngine(t *testing.T, ports kvtest.Ports, topic string, withTopic bool, dropOnce int) *handWrittenEngine {
	e := &handWrittenEngine{t: t, topic: topic, withTopic: withTopic, dropOnce: dropOnce,
		stop: make(chan struct{}), done: make(chan struct{})}
	e.pub, e.router = kvtest.RawSocket(t, zmq.PUB), kvtest.RawSocket(t, zmq.ROUTER)
	if err := e.pub.Bind(fmt.Sprintf("tcp://127.0.0.1:%d", ports.Pub)); err != nil {
		t.Fatal(err)
	}
	if err := e.router.Bind(fmt.Sprintf("tcp://127.0.0.1:%d", ports.Router)); err != nil {
		t.Fatal(err)
	}
	go e.serveReplay()
	t.Cleanup(func() {
		close(e.stop)
		<-e.done
	})
	return e
}

// publish records payload as the next seq and sends it live.
func (e *handWrittenEngine) publish(payload []byte) {
	e.mu.Lock()
	seq := uint64(len(e.history))
	e.history = append(e.history, payload)
	e.mu.Unlock()
	seqBytes := binary.BigEndian.AppendUint64(nil, seq)
	if _, err := e.pub.SendMessage(e.topic, seqBytes, payload); err != nil {
		e.t.Error(err)
	}
}

func (e *handWrittenEngine) serveReplay() {
	defer close(e.done)
	poller := zmq.NewPoller()
	poller.Add(e.router.Socket, zmq.POLLIN)
	for {
		select {
		case <-e.stop:
			return
		default:
		}
		ready, err := poller.Poll(10 * time.Millisecond)
		if err != nil || len(ready) == 0 {
			continue
		}
		req, err := e.router.RecvMessageBytes(0)
		if err != nil {
			e.t.Error(err)
			return
		}
		e.mu.Lock()
		e.requests = append(e.requests, req)
		first := len(e.requests) == 1
		history := slices.Clone(e.history)
		e.mu.Unlock()
		if len(req) != 3 || len(req[1]) != 0 {
			continue // vLLM ignores anything but [identity, "", start]
		}
		start := binary.BigEndian.Uint64(req[2])
		for seq := start; seq < uint64(len(history)); seq++ {
			if first && int(seq) == e.dropOnce {
				continue
			}
			seqBytes := binary.BigEndian.AppendUint64(nil, seq)
			if e.withTopic {
				e.router.SendMessage(req[0], "", e.topic, seqBytes, history[seq])
			} else {
				e.router.SendMessage(req[0], "", seqBytes, history[seq])
			}
		}
		end := binary.BigEndian.AppendUint64(nil, zmqwire.EndOfReplay)
		if e.withTopic {
			e.router.SendMessage(req[0], "", "", end, "")
		} else {
			e.router.SendMessage(req[0], "", end, "")
		}
	}
}

func (e *handWrittenEngine) replayRequests() [][][]byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.requests)
}

// goldenPayloads returns the current-layout payloads vLLM's own publisher
// produced, the codec's golden files.
func goldenPayloads(t *testing.T) [][]byte {
	files, err := filepath.Glob("../testdata/vllm-events/current__*.bin")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden payloads: %v", err)
	}
	var out [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func TestClientAgainstHandWrittenVLLMSockets(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		withTopic bool
		dropOnce  int
	}{
		{name: "vLLM v0.26 replies with topic", withTopic: true, dropOnce: -1},
		{name: "vLLM v0.25 replies without topic", withTopic: false, dropOnce: -1},
		{name: "a reply lost in transit is fetched again", withTopic: true, dropOnce: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ports := kvtest.NewPorts(t)
			engine := startHandWrittenEngine(t, ports, "kv-events", tt.withTopic, tt.dropOnce)
			payloads := goldenPayloads(t)
			var want []kvtest.Delivered
			for i, p := range payloads {
				b, err := kvevent.DecodeEventBatch(p)
				if err != nil {
					t.Fatalf("golden payload %d: %v", i, err)
				}
				want = append(want, kvtest.Summarize(uint64(i), b))
			}
			half := len(payloads) / 2
			for _, p := range payloads[:half] {
				engine.publish(p) // before anyone subscribed: replay only
			}

			rec := &kvtest.Recorder{}
			cfg := testClientConfig(ports)
			cfg.Topic = "kv-events"
			startClient(t, cfg, rec)
			testsupport.Eventually(t, "the replayed batches", func() bool { return rec.Count() >= half })
			for _, p := range payloads[half:] {
				engine.publish(p)
			}
			testsupport.Eventually(t, "every batch", func() bool { return rec.Count() >= len(payloads) })

			got, resets := rec.Snapshot()
			if !slices.Equal(got, want) {
				t.Errorf("delivered %v\nwant      %v", got, want)
			}
			if len(resets) != 0 {
				t.Errorf("resets %v, want none", resets)
			}
			reqs := engine.replayRequests()
			if len(reqs) == 0 {
				t.Fatal("no replay request")
			}
			first := reqs[0]
			if len(first) != 3 || len(first[1]) != 0 || !slices.Equal(first[2], make([]byte, 8)) {
				t.Errorf("first replay request %q, want [identity, \"\", 8 zero bytes]", first)
			}
			if tt.dropOnce >= 0 {
				if len(reqs) < 2 || binary.BigEndian.Uint64(reqs[1][2]) != uint64(tt.dropOnce-1) {
					t.Errorf("replay requests %q, want a follow-up anchored on seq %d", reqs, tt.dropOnce-1)
				}
			}
		})
	}
}
