package publisher

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// ErrPublisherClosed is returned by Publish and PublishRaw after Close.
var ErrPublisherClosed = errors.New("kvevent: publisher is closed")

// ReplayLayout selects the frames a Publisher's replay ROUTER answers with.
type ReplayLayout int

const (
	// ReplayWithTopic is vLLM v0.26 and later: ["", topic, seq, payload]
	// per batch, then ["", "", 0xffffffffffffffff, ""].
	ReplayWithTopic ReplayLayout = iota
	// ReplayWithoutTopic is vLLM v0.25 and earlier: ["", seq, payload] per
	// batch, then ["", 0xffffffffffffffff, ""].
	ReplayWithoutTopic
)

// PublisherConfig configures a Publisher like vLLM's KVEventsConfig
// configures its ZmqEventPublisher.
type PublisherConfig struct {
	// Endpoint is rank 0's PUB endpoint. Like vLLM, the publisher binds it
	// when it contains '*' or "::" or uses ipc:// or inproc://, and
	// connects to it otherwise (to a subscriber that binds). To bind on
	// loopback only, use tcp://[::ffff:127.0.0.1]:<port>.
	Endpoint string
	// ReplayEndpoint is rank 0's replay ROUTER endpoint, always bound; ""
	// disables replay, as in vLLM by default.
	ReplayEndpoint string
	// DataParallelRank offsets both endpoints as vLLM's
	// offset_endpoint_port does (the port plus the rank for tcp, the suffix
	// "_dp<rank>" for inproc; other transports take rank 0 only) and is
	// stamped on batches published with DataParallelRank kvevent.NoRank.
	DataParallelRank int
	// Topic is sent as the first frame of every message.
	Topic string
	// BufferSteps is how many of the latest batches the replay buffer keeps.
	BufferSteps int
	// HWM is the PUB socket's send and receive high-water mark in messages;
	// 0 means no limit. Past it, ZeroMQ drops messages for a slow
	// subscriber, which then sees a gap.
	HWM int
	// MaxQueueSize bounds the batches waiting to be sent; Publish blocks
	// while the queue is full.
	MaxQueueSize int
	// Layout is the payload encoding of Publish.
	Layout kvevent.Layout
	// ReplayLayout is the frame layout of replay replies.
	ReplayLayout ReplayLayout
	// ReplayPollInterval is the longest an idle publisher takes to notice a
	// replay request (vLLM: 100 ms).
	ReplayPollInterval time.Duration
	// DropLive, when set, is asked for every seq whether to withhold that
	// batch from the live stream. The batch is buffered for replay all the
	// same, as a batch ZeroMQ dropped at the high-water mark would be: a
	// way to exercise subscribers' gap recovery.
	DropLive func(seq uint64) bool
	// Context is the ZeroMQ context of the sockets. When nil the publisher
	// creates its own and terminates it on Close, so the endpoints are free
	// again when Close returns.
	Context *zmq.Context
	// Logger receives the publisher's logs; the zero value logs through
	// klog's global logger.
	Logger klog.Logger
}

// DefaultPublisherConfig returns vLLM's defaults: PUB bound on
// tcp://*:5557, no replay, a 10000-batch replay buffer, high-water mark and
// queue of 100000, topic "".
func DefaultPublisherConfig() PublisherConfig {
	return PublisherConfig{
		Endpoint:           "tcp://*:5557",
		BufferSteps:        10000,
		HWM:                100000,
		MaxQueueSize:       100000,
		Layout:             kvevent.LayoutCurrent,
		ReplayLayout:       ReplayWithTopic,
		ReplayPollInterval: 100 * time.Millisecond,
	}
}

func (c *PublisherConfig) validate() error {
	var errs []error
	if err := zmqwire.ValidEndpoint(c.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("Endpoint: %w", err))
	}
	if c.ReplayEndpoint != "" {
		if err := zmqwire.ValidEndpoint(c.ReplayEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("ReplayEndpoint: %w", err))
		}
	}
	if c.BufferSteps < 1 {
		errs = append(errs, fmt.Errorf("BufferSteps %d must be at least 1", c.BufferSteps))
	}
	if c.HWM < 0 {
		errs = append(errs, fmt.Errorf("HWM %d is negative", c.HWM))
	}
	if c.MaxQueueSize < 1 {
		errs = append(errs, fmt.Errorf("MaxQueueSize %d must be at least 1", c.MaxQueueSize))
	}
	if c.ReplayPollInterval <= 0 {
		errs = append(errs, fmt.Errorf("ReplayPollInterval %v must be positive", c.ReplayPollInterval))
	}
	if c.ReplayLayout != ReplayWithTopic && c.ReplayLayout != ReplayWithoutTopic {
		errs = append(errs, fmt.Errorf("unknown ReplayLayout %d", c.ReplayLayout))
	}
	return errors.Join(errs...)
}

// Publisher publishes KV-event batches exactly as vLLM's ZmqEventPublisher
// does: a PUB socket sending [topic, seq (8 bytes, big-endian, from 0),
// payload] and an optional replay ROUTER answering from a bounded buffer.
// One goroutine owns both sockets and sends what Publish queues, in order.
// Its methods are safe for concurrent use.
type Publisher struct {
	cfg            PublisherConfig
	endpoint       string
	replayEndpoint string
	logger         klog.Logger
	ctx            *zmq.Context
	ownCtx         bool
	pub, router    *zmq.Socket

	mu     sync.RWMutex // Close holds it to exclude Publish
	closed bool
	queue  chan []byte
	stop   chan struct{}
	done   chan struct{}

	topic []byte

	// Owned by the goroutine.
	nextSeq uint64
	buffer  replayBuffer
	seqBuf  [8]byte
	frames  [][]byte
}

// NewPublisher creates the sockets, binds or connects them and starts the
// publisher's goroutine. It fails on an invalid config or when an endpoint
// cannot be bound (already in use, say).
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("kvevent: invalid publisher config: %w", err)
	}
	p := &Publisher{cfg: cfg, logger: cfg.Logger, ctx: cfg.Context, topic: []byte(cfg.Topic),
		queue: make(chan []byte, cfg.MaxQueueSize), stop: make(chan struct{}), done: make(chan struct{})}
	var err error
	if p.endpoint, err = zmqwire.OffsetEndpointPort(cfg.Endpoint, cfg.DataParallelRank); err != nil {
		return nil, fmt.Errorf("kvevent: publisher: %w", err)
	}
	if cfg.ReplayEndpoint != "" {
		if p.replayEndpoint, err = zmqwire.OffsetEndpointPort(cfg.ReplayEndpoint, cfg.DataParallelRank); err != nil {
			return nil, fmt.Errorf("kvevent: publisher: %w", err)
		}
	}
	if p.logger.GetSink() == nil {
		p.logger = klog.Background()
	}
	p.logger = p.logger.WithValues("endpoint", p.endpoint, "dpRank", cfg.DataParallelRank)
	if p.ctx == nil {
		if p.ctx, err = zmq.NewContext(); err != nil {
			return nil, fmt.Errorf("kvevent: publisher: create ZeroMQ context: %w", err)
		}
		p.ownCtx = true
	}
	if err := p.openSockets(); err != nil {
		p.closeSockets()
		return nil, err
	}
	p.buffer.init(cfg.BufferSteps)
	go p.run()
	return p, nil
}

// openSockets creates the PUB and, with replay, the ROUTER.
func (p *Publisher) openSockets() error {
	var err error
	if p.pub, err = p.ctx.NewSocket(zmq.PUB); err != nil {
		return fmt.Errorf("kvevent: publisher: create PUB socket: %w", err)
	}
	err = errors.Join(p.pub.SetLinger(0), p.pub.SetSndhwm(p.cfg.HWM), p.pub.SetRcvhwm(p.cfg.HWM))
	if err == nil && zmqwire.NeedsIPv6(p.endpoint) {
		err = p.pub.SetIpv6(true)
	}
	if err == nil {
		if zmqwire.PublisherBinds(p.endpoint) {
			err = p.pub.Bind(p.endpoint)
		} else {
			err = p.pub.Connect(p.endpoint)
		}
	}
	if err != nil {
		return fmt.Errorf("kvevent: publisher: PUB socket on %s: %w", p.endpoint, err)
	}
	if p.replayEndpoint == "" {
		return nil
	}
	if p.router, err = p.ctx.NewSocket(zmq.ROUTER); err != nil {
		return fmt.Errorf("kvevent: publisher: create ROUTER socket: %w", err)
	}
	// A whole buffer plus its end marker fits in the ROUTER's queue, where
	// libzmq's default of 1000 messages would drop the tail of a long replay.
	err = errors.Join(p.router.SetLinger(0), p.router.SetSndhwm(p.cfg.BufferSteps+1))
	if err == nil && zmqwire.NeedsIPv6(p.replayEndpoint) {
		err = p.router.SetIpv6(true)
	}
	if err == nil {
		err = p.router.Bind(p.replayEndpoint)
	}
	if err != nil {
		return fmt.Errorf("kvevent: publisher: ROUTER socket on %s: %w", p.replayEndpoint, err)
	}
	return nil
}

func (p *Publisher) closeSockets() {
	for _, s := range []*zmq.Socket{p.pub, p.router} {
		if s != nil {
			s.Close()
		}
	}
	p.pub, p.router = nil, nil
	if p.ownCtx {
		if err := p.ctx.Term(); err != nil {
			p.logger.Error(err, "Terminating the publisher's ZeroMQ context failed")
		}
	}
}

// Endpoint returns the PUB endpoint after the rank offset.
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint returns the replay endpoint after the rank offset, "" when
// replay is disabled.
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// Publish encodes batch in the configured layout and queues it, blocking
// while the queue is full. Like vLLM, it stamps the publisher's rank on a
// batch whose DataParallelRank is kvevent.NoRank (batch itself is not modified).
// It
// fails when the batch cannot be encoded or the publisher is closed.
func (p *Publisher) Publish(batch *kvevent.EventBatch) error {
	if batch == nil {
		return errors.New("kvevent: publish a nil batch")
	}
	b := *batch
	if b.DataParallelRank == kvevent.NoRank {
		b.DataParallelRank = p.cfg.DataParallelRank
	}
	payload, err := kvevent.AppendEventBatch(nil, &b, p.cfg.Layout)
	if err != nil {
		return fmt.Errorf("kvevent: publish on %s: %w", p.endpoint, err)
	}
	return p.PublishRaw(payload)
}

// PublishRaw queues payload as the next batch, as it is: it may be anything,
// including bytes no decoder accepts. The publisher keeps payload, which the
// caller must not modify afterwards.
func (p *Publisher) PublishRaw(payload []byte) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrPublisherClosed
	}
	p.queue <- payload
	return nil
}

// Close sends what is queued, closes the sockets with linger 0 (messages
// ZeroMQ has not written yet are dropped, as when an engine exits) and, when
// the publisher created its context, terminates it so that the endpoints
// can be bound again at once. Close is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	return nil
}

// run is the publisher's goroutine: it sends queued batches and, between
// them or every ReplayPollInterval when idle, answers replay requests.
func (p *Publisher) run() {
	defer close(p.done)
	defer p.closeSockets()
	tick := time.NewTicker(p.cfg.ReplayPollInterval)
	defer tick.Stop()
	for {
		select {
		case payload := <-p.queue:
			p.send(payload)
			p.sendQueued(63)
		case <-tick.C:
		case <-p.stop:
			p.sendQueued(len(p.queue))
			return
		}
		p.serviceReplay()
	}
}

// sendQueued sends up to n batches that are already queued.
func (p *Publisher) sendQueued(n int) {
	for range n {
		select {
		case payload := <-p.queue:
			p.send(payload)
		default:
			return
		}
	}
}

// send assigns the next seq to payload, buffers it for replay and publishes
// it.
func (p *Publisher) send(payload []byte) {
	seq := p.nextSeq
	p.nextSeq++
	p.buffer.add(seq, payload)
	if p.cfg.DropLive != nil && p.cfg.DropLive(seq) {
		return
	}
	binary.BigEndian.PutUint64(p.seqBuf[:], seq)
	if err := zmqwire.SendFrames(p.pub, 0, p.topic, p.seqBuf[:], payload); err != nil {
		p.logger.Error(err, "Sending KV event batch failed", "seq", seq)
	}
}
