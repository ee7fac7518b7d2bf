package publisher_test

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
)

func TestPublisherSendsVLLMFramesAndStampsItsRank(t *testing.T) {
	t.Parallel()
	// The subscriber binds and the publisher connects: vLLM's heuristic
	// for an endpoint without '*' or "::".
	ports := testsupport.ConsecutivePorts(t, 3)
	sub := kvtest.RawSocket(t, zmq.SUB)
	sub.SetSubscribe("kv")
	rank2 := fmt.Sprintf("tcp://127.0.0.1:%d", ports[2])
	if err := sub.Bind(rank2); err != nil {
		t.Fatal(err)
	}
	cfg := publisher.DefaultPublisherConfig()
	cfg.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports[0])
	cfg.Topic = "kv-events"
	cfg.DataParallelRank = 2
	pub, err := publisher.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if pub.Endpoint() != rank2 {
		t.Fatalf("rank 2 endpoint %q, want %q", pub.Endpoint(), rank2)
	}

	// Publish until the subscription has reached the publisher.
	var first [][]byte
	sub.SetRcvtimeo(20 * time.Millisecond)
	testsupport.Eventually(t, "a first message", func() bool {
		if err := pub.Publish(kvtest.Batch(1, 0)); err != nil {
			t.Fatal(err)
		}
		msg, err := sub.RecvMessageBytes(0)
		first = msg
		return err == nil
	})
	sub.SetRcvtimeo(testsupport.WaitTimeout)
	explicit := kvtest.Batch(1, 1)
	explicit.DataParallelRank = 7
	if err := pub.Publish(explicit); err != nil {
		t.Fatal(err)
	}
	// Retries of the first batch may still be on the way: every message up
	// to the explicit one is a stamped batch, and seqs have no holes.
	msg := first
	for i := 0; ; i++ {
		if i > 0 {
			prev := binary.BigEndian.Uint64(msg[1])
			if msg, err = sub.RecvMessageBytes(0); err != nil {
				t.Fatal(err)
			}
			if seq := binary.BigEndian.Uint64(msg[1]); seq != prev+1 {
				t.Fatalf("seq %d follows seq %d", seq, prev)
			}
		}
		if len(msg) != 3 || string(msg[0]) != "kv-events" || len(msg[1]) != 8 {
			t.Fatalf("message %d frames %q, want [topic, 8-byte seq, payload]", i, msg)
		}
		b, err := kvevent.DecodeEventBatch(msg[2])
		if err != nil {
			t.Fatal(err)
		}
		if b.DataParallelRank == 7 {
			break
		}
		if b.DataParallelRank != 2 {
			t.Fatalf("message %d has rank %d, want the publisher's 2", i, b.DataParallelRank)
		}
	}
	if explicit.DataParallelRank != 7 {
		t.Error("Publish modified the caller's batch")
	}
}

// replay sends a raw replay request and returns the replies up to and
// including the end marker.
func replay(t *testing.T, d *kvtest.Socket, start []byte) [][][]byte {
	t.Helper()
	if _, err := d.SendMessage("", start); err != nil {
		t.Fatal(err)
	}
	var replies [][][]byte
	for {
		msg, err := d.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay from %x: %v", start, err)
		}
		replies = append(replies, msg)
		if s, _ := zmqwire.ParseSeqFrame(msg[len(msg)-2]); s == zmqwire.EndOfReplay {
			return replies
		}
	}
}

// describe renders replies as "seq/topic/payload-length" per message, "end"
// for the end marker, with the frame count first.
func describe(replies [][][]byte) string {
	var parts []string
	for _, r := range replies {
		seq, _ := zmqwire.ParseSeqFrame(r[len(r)-2])
		switch {
		case seq == zmqwire.EndOfReplay:
			parts = append(parts, fmt.Sprintf("%d:end", len(r)))
		case len(r) == 4:
			parts = append(parts, fmt.Sprintf("%d:%s/%d", len(r), r[1], seq))
		default:
			parts = append(parts, fmt.Sprintf("%d:%d", len(r), seq))
		}
	}
	return strings.Join(parts, " ")
}

func TestPublisherAnswersReplayLikeVLLM(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		layout publisher.ReplayLayout
		start  []byte
		want   string
	}{
		{"v0.26 layout from an evicted seq starts at the oldest kept", publisher.ReplayWithTopic, zmqwire.SeqFrame(0), "4:kv/2 4:kv/3 4:kv/4 4:end"},
		{"v0.25 layout", publisher.ReplayWithoutTopic, zmqwire.SeqFrame(0), "3:2 3:3 3:4 3:end"},
		{"from the newest seq", publisher.ReplayWithTopic, zmqwire.SeqFrame(4), "4:kv/4 4:end"},
		{"beyond the newest seq only ends", publisher.ReplayWithTopic, zmqwire.SeqFrame(5), "4:end"},
		{"start of any length, like int.from_bytes", publisher.ReplayWithTopic, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 3}, "4:kv/3 4:kv/4 4:end"},
		{"start beyond 64 bits", publisher.ReplayWithTopic, []byte{1, 0, 0, 0, 0, 0, 0, 0, 0}, "4:end"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ports := kvtest.NewPorts(t)
			pub := kvtest.NewPublisher(t, ports, func(c *publisher.PublisherConfig) {
				c.BufferSteps = 3
				c.Topic = "kv"
				c.ReplayLayout = tt.layout
			})
			kvtest.Publish(t, pub, 1, 0, 5)
			kvtest.AwaitBuffered(t, ports, 4)
			d := kvtest.RawSocket(t, zmq.DEALER)
			if err := d.Connect(pub.ReplayEndpoint()); err != nil {
				t.Fatal(err)
			}
			replies := replay(t, d, tt.start)
			if got := describe(replies); got != tt.want {
				t.Errorf("replies %s, want %s", got, tt.want)
			}
			for _, r := range replies {
				if len(r[0]) != 0 {
					t.Errorf("reply %q does not start with the empty delimiter", r)
				}
			}
		})
	}
}

func TestPublisherIgnoresReplayRequestsWithoutDelimiter(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	kvtest.Publish(t, pub, 1, 0, 3)
	kvtest.AwaitBuffered(t, ports, 2)
	d := kvtest.RawSocket(t, zmq.DEALER)
	if err := d.Connect(pub.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SendBytes(zmqwire.SeqFrame(0), 0); err != nil { // no "" frame
		t.Fatal(err)
	}
	// Replies come in request order: if the first request were answered,
	// its replies (from seq 0) would arrive first.
	if got, want := describe(replay(t, d, zmqwire.SeqFrame(2))), "4:/2 4:end"; got != want {
		t.Errorf("replies %s, want %s", got, want)
	}
}

func TestPublisherRestartsOnTheSamePortsFromSeqZero(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	for round := range 3 {
		pub := kvtest.NewPublisher(t, ports, nil)
		kvtest.Publish(t, pub, round, 0, 2)
		kvtest.AwaitBuffered(t, ports, 1)
		d := kvtest.RawSocket(t, zmq.DEALER)
		if err := d.Connect(pub.ReplayEndpoint()); err != nil {
			t.Fatal(err)
		}
		replies := replay(t, d, zmqwire.SeqFrame(0))
		if got := describe(replies); got != "4:/0 4:/1 4:end" {
			t.Fatalf("round %d: replies %s", round, got)
		}
		b, err := kvevent.DecodeEventBatch(replies[0][3])
		if err != nil {
			t.Fatal(err)
		}
		if got := kvtest.Summarize(0, b).First; got != uint64(round*1_000_000) {
			t.Errorf("round %d replayed first hash %d, a batch of an earlier publisher", round, got)
		}
		d.Close()
		if err := pub.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPublisherErrors(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	cfg := publisher.DefaultPublisherConfig()
	cfg.Endpoint = kvtest.BindEndpoint(ports.Pub)
	if _, err := publisher.NewPublisher(cfg); err == nil || !strings.Contains(err.Error(), "PUB socket") {
		t.Errorf("second publisher on a bound port: %v", err)
	}
	bad := []func(*publisher.PublisherConfig){
		func(c *publisher.PublisherConfig) { c.Endpoint = "localhost:5557" },
		func(c *publisher.PublisherConfig) { c.ReplayEndpoint = "udp://x" },
		func(c *publisher.PublisherConfig) { c.BufferSteps = 0 },
		func(c *publisher.PublisherConfig) { c.HWM = -1 },
		func(c *publisher.PublisherConfig) { c.MaxQueueSize = 0 },
		func(c *publisher.PublisherConfig) { c.ReplayPollInterval = 0 },
		func(c *publisher.PublisherConfig) { c.ReplayLayout = 9 },
		func(c *publisher.PublisherConfig) { c.Endpoint, c.DataParallelRank = "ipc:///tmp/kv", 1 },
	}
	for i, adjust := range bad {
		cfg := publisher.DefaultPublisherConfig()
		adjust(&cfg)
		if p, err := publisher.NewPublisher(cfg); err == nil {
			p.Close()
			t.Errorf("config %d accepted", i)
		}
	}
	if err := pub.Publish(nil); err == nil {
		t.Error("nil batch published")
	}
	pub.Close()
	if err := pub.Publish(kvtest.Batch(1, 0)); err != publisher.ErrPublisherClosed {
		t.Errorf("Publish after Close: %v", err)
	}
	if err := pub.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
