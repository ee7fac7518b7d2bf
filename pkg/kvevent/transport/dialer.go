package transport

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// monitorEvents are the SUB socket events the dialer follows.
const monitorEvents = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED |
	zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_DELAYED |
	zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH

// redialGrace is how long past ReconnectDelay and ConnectTimeout the dialer
// waits, after a disconnection, for ZeroMQ to start dialling again. ZeroMQ
// does not redial a connection it dropped for a protocol error, such as a
// message above MaxMessageBytes; the dialer then rebuilds its sockets
// itself.
const redialGrace = time.Second

// monitorIDs numbers the inproc endpoints of socket monitors, which must be
// unique within a ZeroMQ context.
var monitorIDs atomic.Uint64

// dialer is the driver of a ZMQClient's stream: a SUB socket dialling the
// engine's PUB endpoint and a monitor of its connection. It is owned by the
// client's goroutine while the client runs, and by the client while it is
// stopped; it keeps the stream, so that a Stop and Start resume it.
type dialer struct {
	cfg         *ZMQClientConfig
	pubEndpoint string
	ctx         *zmq.Context
	s           *stream
	obs         *observer

	sub    *zmq.Socket
	mon    *zmq.Socket
	poller *zmqwire.Poller
	polled *zmq.Socket // the replay socket the poller holds

	frames      [][]byte // reused frame slices of live messages
	reopenAt    time.Time
	reopenDelay time.Duration
	// downAt is when the connection was lost, until ZeroMQ dials again;
	// zero otherwise.
	downAt time.Time
	// floodAt is when the engine last flooded the stream, floodDelay the
	// wait before redialling after the next flood.
	floodAt    time.Time
	floodDelay time.Duration
	// pacer spaces the reads of the live socket.
	pacer readPacer
}

func newDialer(cfg *ZMQClientConfig, pubEndpoint string, s *stream, obs *observer) *dialer {
	return &dialer{cfg: cfg, pubEndpoint: pubEndpoint, s: s, obs: obs, reopenDelay: cfg.ReconnectDelay,
		pacer: readPacer{interval: cfg.ReadInterval}}
}

// runState is one run of a client's goroutine.
type runState struct {
	stop   chan struct{}
	cmds   chan command
	exited chan struct{}
	// back returns the dialer to the client when the goroutine exits.
	back chan *dialer
}

// command is work for the client's goroutine; its result goes to reply.
type command struct {
	fn    func(*dialer) error
	reply chan error
}

// run is the client's goroutine. It owns d until it hands it back on
// rs.back.
func (d *dialer) run(rs *runState) {
	defer func() {
		rs.back <- d
		close(rs.exited)
	}()
	defer d.close()
	if err := d.open(); err != nil {
		d.scheduleReopen(err)
	}
	for {
		select {
		case <-rs.stop:
			return
		case cmd := <-rs.cmds:
			cmd.reply <- cmd.fn(d)
			continue
		default:
		}
		if d.sub != nil {
			if pause := d.pacer.wait(); pause != nil {
				select {
				case <-rs.stop:
					d.pacer.stop()
					return
				case cmd := <-rs.cmds:
					d.pacer.stop()
					cmd.reply <- cmd.fn(d)
					continue
				case <-pause:
					d.pacer.resume()
				}
			}
			d.poll()
			continue
		}
		wait := time.NewTimer(time.Until(d.reopenAt))
		select {
		case <-rs.stop:
			wait.Stop()
			return
		case cmd := <-rs.cmds:
			cmd.reply <- cmd.fn(d)
		case <-wait.C:
			if err := d.open(); err != nil {
				d.scheduleReopen(err)
			}
		}
		wait.Stop()
	}
}

// poll waits for the sockets once and services what is ready: monitor events
// first (a connection is known before its messages), then replay replies,
// then live messages; then the stream applies what it read, for one time
// slice, and runs its timers.
func (d *dialer) poll() {
	if d.s.replaySocket() != d.polled {
		if err := d.rebuildPoller(); err != nil {
			d.socketFailed(err)
			return
		}
	}
	wait := d.s.timerWait(d.cfg.PollTimeout)
	if !d.downAt.IsZero() {
		wait = min(wait, max(time.Until(d.downAt.Add(d.redialWait())), 0))
	}
	ready, err := d.poller.Poll(d.pacer.pollTimeout(wait))
	if err != nil {
		if zmq.AsErrno(err) != zmq.Errno(syscall.EINTR) {
			d.socketFailed(fmt.Errorf("poll: %w", err))
		}
		return
	}
	var subReady, dealerReady bool
	for _, p := range ready {
		switch p.Socket {
		case d.mon:
			d.drainMonitor()
		case d.polled:
			dealerReady = true
		case d.sub:
			subReady = true
		}
	}
	d.pacer.polled(subReady)
	if dealerReady && d.polled == d.s.replaySocket() {
		d.s.readReplies()
	}
	now := time.Now()
	if subReady && d.sub != nil && d.pacer.mayRead(now) {
		live, more := d.readLive()
		d.s.process(now)
		d.pacer.read(now, live, more || d.s.hasWork())
	} else {
		d.s.process(now)
	}
	d.s.runTimers(now)
	if !d.downAt.IsZero() && now.Sub(d.downAt) > d.redialWait() {
		d.obs.socketFailed(fmt.Errorf("not redialled %v after the connection was lost", now.Sub(d.downAt).Round(time.Millisecond)),
			"ZeroMQ dropped the connection for good (a message above MaxMessageBytes, or another protocol error): rebuilding the sockets",
			"endpoint", d.pubEndpoint)
		if err := d.reconnect(); err != nil {
			d.socketFailed(err)
		}
	}
}

// redialWait is how long ZeroMQ may take to dial again after a
// disconnection before the dialer rebuilds its sockets.
func (d *dialer) redialWait() time.Duration {
	return d.cfg.ReconnectDelay + d.cfg.ConnectTimeout + redialGrace
}

// open creates and connects the sockets.
func (d *dialer) open() error {
	sub, err := d.ctx.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("kvevent: create SUB socket for %s: %w", d.pubEndpoint, err)
	}
	d.sub = sub
	if err := d.setupSub(); err != nil {
		d.close()
		return fmt.Errorf("kvevent: set up SUB socket for %s: %w", d.pubEndpoint, err)
	}
	d.s.attach(d.ctx)
	if err := d.rebuildPoller(); err != nil {
		d.close()
		return fmt.Errorf("kvevent: poll the sockets of %s: %w", d.pubEndpoint, err)
	}
	d.reopenDelay = d.cfg.ReconnectDelay
	if l := d.obs.debug(); l.Enabled() {
		l.Info("Dialling KV event publisher", "endpoint", d.pubEndpoint, "replayEndpoint", d.s.replayEndpoint)
	}
	return nil
}

// setupSub configures d.sub, attaches its monitor and connects it.
func (d *dialer) setupSub() error {
	cfg := d.cfg
	s := d.sub
	err := errors.Join(s.SetLinger(0), s.SetRcvhwm(cfg.ReceiveHWM), s.SetMaxmsgsize(int64(cfg.MaxMessageBytes)),
		s.SetReconnectIvl(cfg.ReconnectDelay), s.SetReconnectIvlMax(cfg.MaxReconnectDelay))
	if err == nil && cfg.ConnectTimeout > 0 {
		err = s.SetConnectTimeout(cfg.ConnectTimeout)
	}
	if err == nil && cfg.HeartbeatInterval > 0 {
		err = errors.Join(s.SetHeartbeatIvl(cfg.HeartbeatInterval), s.SetHeartbeatTimeout(cfg.HeartbeatTimeout))
		if err == nil && cfg.HeartbeatTTL > 0 {
			err = s.SetHeartbeatTtl(cfg.HeartbeatTTL)
		}
	}
	if err == nil && zmqwire.NeedsIPv6(d.pubEndpoint) {
		err = s.SetIpv6(true)
	}
	if err == nil {
		err = s.SetSubscribe(cfg.Topic)
	}
	if err != nil {
		return err
	}
	addr := fmt.Sprintf("inproc://kvevent-monitor-%d", monitorIDs.Add(1))
	if err := s.Monitor(addr, monitorEvents); err != nil {
		return fmt.Errorf("monitor: %w", err)
	}
	mon, err := d.ctx.NewSocket(zmq.PAIR)
	if err != nil {
		return fmt.Errorf("monitor socket: %w", err)
	}
	d.mon = mon
	if err := errors.Join(mon.SetLinger(0), mon.Connect(addr)); err != nil {
		return fmt.Errorf("monitor socket: %w", err)
	}
	return s.Connect(d.pubEndpoint)
}

func (d *dialer) rebuildPoller() error {
	_ = d.poller.Close()
	d.polled = d.s.replaySocket()
	var err error
	d.poller, err = zmqwire.NewPoller(d.mon, d.polled, d.sub)
	return err
}

// close closes every socket, the stream's replay socket included. The
// stream keeps its position.
func (d *dialer) close() {
	if d.sub != nil {
		// Stop the monitor before closing anything: libzmq must not be
		// left with a monitor whose peer is gone.
		d.sub.Monitor("", 0)
	}
	if d.mon != nil {
		d.mon.Close()
	}
	d.s.detach()
	if d.sub != nil {
		d.sub.Close()
	}
	_ = d.poller.Close()
	d.mon, d.sub, d.poller, d.polled = nil, nil, nil, nil
	d.downAt = time.Time{}
}

// reconnect tears the sockets down and builds them again.
func (d *dialer) reconnect() error {
	d.close()
	d.obs.reconnectAttempt()
	return d.open()
}

// scheduleReopen logs why the sockets could not be set up and when the next
// attempt is.
func (d *dialer) scheduleReopen(err error) {
	d.reopenAt = time.Now().Add(d.reopenDelay)
	d.obs.socketFailed(err, "Cannot set up sockets, retrying", "retryIn", d.reopenDelay)
	d.reopenDelay = min(time.Duration(float64(d.reopenDelay)*ReconnectBackoffFactor), d.cfg.MaxReconnectDelay)
}

// socketFailed tears the sockets down after an unexpected socket error and
// schedules new ones.
func (d *dialer) socketFailed(err error) {
	d.close()
	d.scheduleReopen(err)
}

// drainMonitor handles the pending monitor events.
func (d *dialer) drainMonitor() {
	for {
		ev, addr, value, err := d.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			if zmqwire.IsAgain(err) {
				d.poller.Drained(d.mon)
			} else {
				d.socketFailed(fmt.Errorf("read socket monitor: %w", err))
			}
			return
		}
		if ev != zmq.EVENT_DISCONNECTED {
			d.downAt = time.Time{}
		}
		switch ev {
		case zmq.EVENT_HANDSHAKE_SUCCEEDED:
			d.s.up(time.Now())
		case zmq.EVENT_DISCONNECTED:
			d.downAt = time.Now()
			d.s.down()
		case zmq.EVENT_CONNECTED, zmq.EVENT_CONNECT_DELAYED:
		case zmq.EVENT_CONNECT_RETRIED:
			d.obs.reconnectAttempt()
			if l := d.obs.debug(); l.Enabled() {
				l.Info("Reconnecting to KV event publisher", "endpoint", addr, "inMillis", value)
			}
		default:
			d.obs.handshakeFailed(addr, ev.String(), value)
		}
	}
}

// readLive reads the live messages waiting and hands them to the stream,
// and reports whether there were any, and whether it stopped at
// maxReadBurst with more perhaps waiting.
func (d *dialer) readLive() (read, more bool) {
	dropped := 0
	for i := range maxReadBurst {
		frames, n, err := zmqwire.RecvFrames(d.sub, zmq.DONTWAIT, d.frames, 3)
		d.frames = frames
		if err != nil {
			if zmqwire.IsAgain(err) {
				d.poller.Drained(d.sub)
			} else {
				d.socketFailed(fmt.Errorf("receive from %s: %w", d.pubEndpoint, err))
			}
			return i > 0, false
		}
		if i == 0 {
			d.s.liveArrived(time.Now())
		}
		var seq uint64
		ok := n == 3
		if ok {
			seq, ok = zmqwire.ParseSeqFrame(frames[1])
		}
		if !ok {
			d.obs.malformed(frames, n)
			continue
		}
		if dropped += d.s.pushLive(seq, frames[2]); dropped > d.cfg.ReceiveBufferBytes {
			d.flooded()
			return true, false
		}
	}
	return true, true
}

// flooded disconnects from an engine that sent more than a second receive
// buffer's worth while the first was full, faster than the stream reads:
// ZeroMQ's own queue would grow with it. The dialer redials after
// ReconnectDelay, doubling up to MaxReconnectDelay while the engine keeps
// flooding; what the engine published meanwhile is replayed.
func (d *dialer) flooded() {
	now := time.Now()
	if now.Sub(d.floodAt) > 2*d.cfg.MaxReconnectDelay {
		d.floodDelay = d.cfg.ReconnectDelay
	}
	delay := d.floodDelay
	d.floodAt, d.floodDelay = now, min(2*d.floodDelay, d.cfg.MaxReconnectDelay)
	d.obs.flooded(delay, d.cfg.ReceiveBufferBytes)
	d.close()
	d.reopenAt = now.Add(delay)
}
