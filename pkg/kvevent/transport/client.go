package transport

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// Errors of a ZMQClient's lifecycle.
var (
	ErrClientClosed     = errors.New("kvevent: ZMQ client is closed")
	ErrClientRunning    = errors.New("kvevent: ZMQ client is already running")
	ErrClientNotRunning = errors.New("kvevent: ZMQ client is not running")
)

// ZMQClient follows one vLLM engine's KV-event stream (one pod, one
// data-parallel rank) and hands its batches to a handler exactly once each,
// in seq order, recovering what the live stream missed through the engine's
// replay ROUTER and telling the handler, through a kvevent.StreamReset,
// whenever that is impossible.
//
// One goroutine, started by Start, owns the client's ZeroMQ sockets and its
// stream and calls the handler; while the client is stopped nothing runs.
// The other methods are safe for concurrent use and reach that goroutine
// through commands, which it picks up within ZMQClientConfig.PollTimeout.
type ZMQClient struct {
	cfg            ZMQClientConfig
	pubEndpoint    string
	replayEndpoint string
	obs            *observer
	handler        atomic.Pointer[handlerSet]

	mu     sync.Mutex // guards idle, run, closed, ctx
	idle   *dialer    // the stream's driver while no goroutine runs it
	run    *runState  // the goroutine running it
	closed bool
	ctx    *zmq.Context
	ownCtx bool
}

// NewZMQClient returns a client for the stream config describes, delivering
// to handler (see kvevent.BatchHandler and kvevent.ResetHandler for the optional
// extensions). The client copies config; it does nothing until Start.
// It fails when config is invalid (see ValidateConfig) or handler is nil.
func NewZMQClient(config *ZMQClientConfig, handler kvevent.EventHandler) (*ZMQClient, error) {
	if err := ValidateConfig(config); err != nil {
		return nil, err
	}
	if handler == nil {
		return nil, fmt.Errorf("kvevent: ZMQ client for %q needs a handler", config.PodKey)
	}
	c := &ZMQClient{cfg: *config}
	c.pubEndpoint, c.replayEndpoint = c.cfg.endpoints()
	c.obs = newObserver(&c.cfg, c.pubEndpoint)
	c.handler.Store(newHandlerSet(handler))
	c.idle = newDialer(&c.cfg, c.pubEndpoint, newStream(&c.cfg, c.replayEndpoint, c.obs, &c.handler), c.obs)
	return c, nil
}

// Start starts the client's goroutine, which connects to the engine and
// keeps the stream exact until Stop or Close. It returns at once, without
// waiting for the network; WaitForConnection waits for the engine. It fails
// when the client is closed or already running, or its ZeroMQ context cannot
// be created.
func (c *ZMQClient) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return ErrClientClosed
	case c.run != nil:
		return ErrClientRunning
	}
	if c.ctx == nil {
		if c.ctx = c.cfg.Context; c.ctx == nil {
			ctx, err := zmq.NewContext()
			if err != nil {
				return fmt.Errorf("kvevent: create ZeroMQ context for %s: %w", c.cfg.PodKey, err)
			}
			c.ctx, c.ownCtx = ctx, true
		}
	}
	rs := &runState{stop: make(chan struct{}), cmds: make(chan command), exited: make(chan struct{}), back: make(chan *dialer, 1)}
	d := c.idle
	c.run, c.idle = rs, nil
	d.ctx = c.ctx
	go d.run(rs)
	return nil
}

// Stop stops the client's goroutine and closes its sockets, waiting for
// both. The stream's position is kept: a later Start resumes it, replaying
// what was published meanwhile. Stop on a client that is not running does
// nothing.
func (c *ZMQClient) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run == nil {
		return
	}
	close(c.run.stop)
	c.idle = <-c.run.back
	c.run = nil
}

// Close stops the client for good: it stops the goroutine, removes the
// stream's metric series, and terminates the ZeroMQ context when the client
// created it. Close is idempotent; a closed client cannot be started again.
func (c *ZMQClient) Close() {
	c.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	c.obs.close()
	if c.ownCtx {
		if err := c.ctx.Term(); err != nil {
			c.obs.logger.Error(err, "Terminating the ZeroMQ context failed")
		}
	}
	c.ctx = nil
}

// Connect makes sure the client runs and its sockets are set up, starting it
// if needed. It returns once the sockets exist and are dialling, with the
// error of creating them (a refused endpoint, a resource limit), and does not
// wait for the engine: WaitForConnection does.
func (c *ZMQClient) Connect() error {
	if err := c.Start(); err != nil && !errors.Is(err, ErrClientRunning) {
		return err
	}
	return c.do(func(d *dialer) error {
		if d.sub != nil {
			return nil
		}
		return d.open()
	})
}

// Reconnect tears the client's sockets down and builds them again, for an
// engine known to have moved or hung. The stream resynchronises through
// replay once the new connection is up. It fails with ErrClientNotRunning
// when the client is not running, or with the error of creating the sockets.
func (c *ZMQClient) Reconnect() error {
	return c.do((*dialer).reconnect)
}

// ReplayFrom rewinds the stream to seq: the handler receives a
// kvevent.StreamReset with reason kvevent.ResetRewind, then every batch from
// seq on that the engine still buffers (an unrecoverable gap is reported for
// the ones it does not), then the live stream. It is the way to rebuild a handler's state for the
// stream (seq 0) without reconnecting. It fails when the client is not
// running, or when seq is beyond the next batch the stream expects.
func (c *ZMQClient) ReplayFrom(seq uint64) error {
	return c.do(func(d *dialer) error { return d.s.rewind(seq) })
}

// WaitForConnection waits until the client is connected to the engine's
// publisher, and fails after timeout or when the client is closed first.
func (c *ZMQClient) WaitForConnection(timeout time.Duration) error {
	return c.obs.conn.wait(timeout, c.pubEndpoint)
}

// Subscribe replaces the client's handler; the next batch goes to handler.
// It fails when handler is nil.
func (c *ZMQClient) Subscribe(handler kvevent.EventHandler) error {
	if handler == nil {
		return fmt.Errorf("kvevent: subscribe %s: nil handler", c.cfg.PodKey)
	}
	c.handler.Store(newHandlerSet(handler))
	return nil
}

// Endpoints returns the PUB endpoint the client dials and the replay
// endpoint ("" without replay).
func (c *ZMQClient) Endpoints() (pub, replay string) { return c.pubEndpoint, c.replayEndpoint }

// GetStats reports whether the client is connected and how many batches it
// has delivered (including ones that failed to decode). Stats has more.
func (c *ZMQClient) GetStats() (connected bool, msgsReceived uint64) {
	return c.obs.conn.isConnected(), c.obs.counters.batches.Load()
}

// do runs fn on the client's goroutine and returns its error.
func (c *ZMQClient) do(fn func(*dialer) error) error {
	c.mu.Lock()
	rs := c.run
	c.mu.Unlock()
	if rs == nil {
		return ErrClientNotRunning
	}
	cmd := command{fn: fn, reply: make(chan error, 1)}
	select {
	case rs.cmds <- cmd:
	case <-rs.exited:
		return ErrClientNotRunning
	}
	return <-cmd.reply
}
