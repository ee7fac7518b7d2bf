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

// maxBurst bounds how many live messages the client reads in a row before it
// services replies, monitor events and commands again.
const maxBurst = 256

// monitorEvents are the SUB socket events the client follows.
const monitorEvents = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED |
	zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH

// monitorIDs numbers the inproc endpoints of socket monitors, which must be
// unique within a ZeroMQ context.
var monitorIDs atomic.Uint64

// clientLoop is the state owned by a client's goroutine: its sockets, the
// replay in flight, and the stream's sequencer, which outlives the sockets
// so that a Stop and Start resume the stream.
type clientLoop struct {
	c      *ZMQClient
	seq    *sequencer
	sub    *zmq.Socket
	mon    *zmq.Socket
	dealer *zmq.Socket
	poller *zmq.Poller

	frames      [][]byte // reused frame slices of live messages
	replyFrames [][]byte // reused frame slices of replay replies
	replay      replayTimer
	reopenAt    time.Time
	reopenDelay time.Duration
	connected   bool
	probeAt     time.Time // when to probe the stream if it stays quiet
	probeDelay  time.Duration
	silence     liveSilence
}

// replayTimer follows the timing of replay requests.
type replayTimer struct {
	active   bool
	deadline time.Time     // when the replay in flight fails if still silent
	retryAt  time.Time     // gap replays are refused before this
	backoff  time.Duration // next wait after a failure
}

func newClientLoop(c *ZMQClient) *clientLoop {
	l := &clientLoop{c: c}
	l.seq = newSequencer(l, c.cfg.MaxPendingBatches)
	l.replay.backoff = c.cfg.ReconnectDelay
	l.reopenDelay = c.cfg.ReconnectDelay
	return l
}

// run is the client's goroutine.
func (l *clientLoop) run(rs *runState) {
	defer close(rs.done)
	defer l.close()
	if err := l.open(); err != nil {
		l.scheduleReopen(err)
	}
	for {
		select {
		case <-rs.stop:
			return
		case cmd := <-rs.cmds:
			cmd.reply <- cmd.fn(l)
			continue
		default:
		}
		if l.sub != nil {
			l.poll()
			continue
		}
		wait := time.NewTimer(time.Until(l.reopenAt))
		select {
		case <-rs.stop:
			wait.Stop()
			return
		case cmd := <-rs.cmds:
			cmd.reply <- cmd.fn(l)
		case <-wait.C:
			if err := l.open(); err != nil {
				l.scheduleReopen(err)
			}
		}
		wait.Stop()
	}
}

// poll waits for the sockets once and services what is ready: monitor events
// first (a connection is known before its messages), then replay replies,
// then live messages.
func (l *clientLoop) poll() {
	ready, err := l.poller.Poll(l.timerWait(l.c.cfg.PollTimeout))
	if err != nil {
		if zmq.AsErrno(err) != zmq.Errno(syscall.EINTR) {
			l.socketFailed(fmt.Errorf("poll: %w", err))
		}
		return
	}
	var subReady, dealerReady bool
	for _, p := range ready {
		switch p.Socket {
		case l.mon:
			l.drainMonitor()
		case l.dealer:
			dealerReady = true
		case l.sub:
			subReady = true
		}
	}
	if dealerReady && l.dealer != nil {
		l.drainReplies()
	}
	if subReady && l.sub != nil {
		l.drainLive()
	}
	l.runTimers(time.Now())
}

// runTimers fails a replay that stayed silent past its deadline and probes
// a stream that stayed quiet past its probe time.
func (l *clientLoop) runTimers(now time.Time) {
	if l.replay.active && !now.Before(l.replay.deadline) {
		l.failReplay("", fmt.Errorf("no reply within %v", l.c.cfg.ReplayTimeout))
	}
	if l.connected && !now.Before(l.probeAt) {
		l.seq.probe()
		l.probeDelay = min(time.Duration(float64(l.probeDelay)*ReconnectBackoffFactor), l.c.cfg.MaxReconnectDelay)
		l.probeAt = now.Add(l.probeDelay)
	}
}

// timerWait returns how long a poll may wait before runTimers has work,
// capped at limit.
func (l *clientLoop) timerWait(limit time.Duration) time.Duration {
	if l.replay.active {
		limit = min(limit, max(time.Until(l.replay.deadline), 0))
	}
	if l.connected {
		limit = min(limit, max(time.Until(l.probeAt), 0))
	}
	return limit
}

// quietFrom restarts the quiet-stream probe schedule at now.
func (l *clientLoop) quietFrom(now time.Time) {
	l.probeDelay = l.c.cfg.ReconnectDelay
	l.probeAt = now.Add(l.probeDelay)
}

// open creates and connects the sockets.
func (l *clientLoop) open() error {
	c := l.c
	sub, err := c.ctx.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("kvevent: create SUB socket for %s: %w", c.pubEndpoint, err)
	}
	l.sub = sub
	if err := l.setupSub(); err != nil {
		l.close()
		return fmt.Errorf("kvevent: set up SUB socket for %s: %w", c.pubEndpoint, err)
	}
	if c.replayEndpoint != "" {
		if err := l.openDealer(); err != nil {
			l.close()
			return err
		}
	}
	l.rebuildPoller()
	l.reopenDelay = c.cfg.ReconnectDelay
	c.logDebug("Dialling KV event publisher", "endpoint", c.pubEndpoint, "replayEndpoint", c.replayEndpoint)
	return nil
}

// setupSub configures l.sub, attaches its monitor and connects it.
func (l *clientLoop) setupSub() error {
	cfg := &l.c.cfg
	s := l.sub
	err := errors.Join(s.SetLinger(0), s.SetRcvhwm(cfg.ReceiveHWM),
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
	if err == nil && zmqwire.NeedsIPv6(l.c.pubEndpoint) {
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
	mon, err := l.c.ctx.NewSocket(zmq.PAIR)
	if err != nil {
		return fmt.Errorf("monitor socket: %w", err)
	}
	l.mon = mon
	if err := errors.Join(mon.SetLinger(0), mon.Connect(addr)); err != nil {
		return fmt.Errorf("monitor socket: %w", err)
	}
	return s.Connect(l.c.pubEndpoint)
}

// openDealer creates and connects a fresh replay socket.
func (l *clientLoop) openDealer() error {
	ep := l.c.replayEndpoint
	d, err := l.c.ctx.NewSocket(zmq.DEALER)
	if err != nil {
		return fmt.Errorf("kvevent: create replay socket for %s: %w", ep, err)
	}
	err = errors.Join(d.SetLinger(0), d.SetRcvhwm(0))
	if err == nil && zmqwire.NeedsIPv6(ep) {
		err = d.SetIpv6(true)
	}
	if err == nil {
		err = d.Connect(ep)
	}
	if err != nil {
		d.Close()
		return fmt.Errorf("kvevent: set up replay socket for %s: %w", ep, err)
	}
	l.dealer = d
	return nil
}

// resetDealer replaces the replay socket, so that replies to an abandoned
// request can never be taken for replies to the next one.
func (l *clientLoop) resetDealer() {
	l.replay.active = false
	if l.dealer == nil {
		return
	}
	l.dealer.Close()
	l.dealer = nil
	if err := l.openDealer(); err != nil {
		l.c.logger.Error(err, "Replay is unavailable until the client reconnects")
		l.c.metrics.IncrementErrorCount(ErrorTypeSocket)
	}
	l.rebuildPoller()
}

func (l *clientLoop) rebuildPoller() {
	l.poller = zmq.NewPoller()
	for _, s := range []*zmq.Socket{l.mon, l.dealer, l.sub} {
		if s != nil {
			l.poller.Add(s, zmq.POLLIN)
		}
	}
}

// close closes every socket. The sequencer keeps the stream's position.
func (l *clientLoop) close() {
	if l.sub != nil {
		// Stop the monitor before closing anything: libzmq must not be
		// left with a monitor whose peer is gone.
		l.sub.Monitor("", 0)
	}
	for _, s := range []*zmq.Socket{l.mon, l.dealer, l.sub} {
		if s != nil {
			s.Close()
		}
	}
	l.mon, l.dealer, l.sub, l.poller = nil, nil, nil, nil
	l.replay.active = false
	l.connected = false
	l.seq.detach()
	l.c.setConnected(false, false)
}

// scheduleReopen logs why the sockets could not be set up and when the next
// attempt is.
func (l *clientLoop) scheduleReopen(err error) {
	l.reopenAt = time.Now().Add(l.reopenDelay)
	l.c.logger.Error(err, "Cannot set up sockets, retrying", "retryIn", l.reopenDelay)
	l.c.metrics.IncrementErrorCount(ErrorTypeSocket)
	l.reopenDelay = min(time.Duration(float64(l.reopenDelay)*ReconnectBackoffFactor), l.c.cfg.MaxReconnectDelay)
}

// socketFailed tears the sockets down after an unexpected socket error and
// schedules new ones.
func (l *clientLoop) socketFailed(err error) {
	l.close()
	l.scheduleReopen(err)
}

// drainMonitor handles the pending monitor events.
func (l *clientLoop) drainMonitor() {
	c := l.c
	for {
		ev, addr, value, err := l.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			if !zmqwire.IsAgain(err) {
				l.socketFailed(fmt.Errorf("read socket monitor: %w", err))
			}
			return
		}
		switch ev {
		case zmq.EVENT_HANDSHAKE_SUCCEEDED:
			l.connected = true
			l.quietFrom(time.Now())
			c.setConnected(true, true)
			l.seq.onConnected()
		case zmq.EVENT_DISCONNECTED:
			l.connected = false
			c.setConnected(false, true)
		case zmq.EVENT_CONNECT_RETRIED:
			c.counters.reconnectAttempts.Add(1)
			c.metrics.IncrementReconnectAttempts()
			c.logDebug("Reconnecting to KV event publisher", "endpoint", addr, "inMillis", value)
		default:
			c.metrics.IncrementErrorCount(ErrorTypeSocket)
			c.logInfo("Handshake with KV event publisher failed", "endpoint", addr, "event", ev.String(), "errno", value)
		}
	}
}

// drainLive reads live messages and feeds them to the sequencer.
func (l *clientLoop) drainLive() {
	c := l.c
	for i := range maxBurst {
		frames, err := zmqwire.RecvFrames(l.sub, zmq.DONTWAIT, l.frames)
		l.frames = frames
		if err != nil {
			if !zmqwire.IsAgain(err) {
				l.socketFailed(fmt.Errorf("receive from %s: %w", c.pubEndpoint, err))
			}
			return
		}
		if i == 0 {
			l.liveArrived(time.Now())
		}
		var seq uint64
		ok := len(frames) == 3
		if ok {
			seq, ok = zmqwire.ParseSeqFrame(frames[1])
		}
		if !ok {
			c.counters.malformed.Add(1)
			c.metrics.IncrementErrorCount(ErrorTypeMalformed)
			c.logger.Error(errMalformed(frames), "Dropping malformed KV event message")
			continue
		}
		l.seq.onLive(seq, frames[2])
	}
}

func errMalformed(frames [][]byte) error {
	lens := make([]int, len(frames))
	for i, f := range frames {
		lens[i] = len(f)
	}
	return fmt.Errorf("want 3 frames [topic, 8-byte seq, payload], got frame lengths %v", lens)
}
