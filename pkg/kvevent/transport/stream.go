package transport

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// stream is one engine's stream (one pod, one data-parallel rank): its
// sequencer, its replay socket, its timers, and the delivery of its batches
// to the handler. It knows nothing of the socket its live messages arrive
// on: a driver owns that socket and feeds the stream.
//
// A stream has exactly one owner at a time, the goroutine of the driver
// holding it: a ZMQClient's dialer, which follows one stream on a SUB
// socket of its own, or a BindReceiver, which follows many on bound
// sockets. Only the owner calls its methods. Other goroutines see the
// stream through its observer and the handler pointer, which are safe for
// concurrent use, and reach the owner through the driver's commands.
//
// A driver tells the stream when its engine is connected (up) and no
// longer (down), hands it every live batch (liveArrived, live), services
// its replay socket when it is readable (drainReplies) and its timers when
// they are due (timerWait, runTimers), and rebuilds its poller whenever
// replaySocket changes. detach ends a connection's state; the sequencer
// outlives it, so that the stream resumes on the next connection.
type stream struct {
	cfg            *ZMQClientConfig // read-only
	replayEndpoint string           // "" without replay
	obs            *observer
	handler        *atomic.Pointer[handlerSet]
	seq            *sequencer

	ctx         *zmq.Context // of the replay socket
	dealer      *zmq.Socket  // replay socket; nil while closed or without replay
	replyFrames [][]byte     // reused frame slices of replay replies
	replay      replayTimer
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

// handlerSet is a handler with its optional extensions resolved.
type handlerSet struct {
	event kvevent.EventHandler
	batch kvevent.BatchHandler
	reset kvevent.ResetHandler
}

func newHandlerSet(h kvevent.EventHandler) *handlerSet {
	s := &handlerSet{event: h}
	s.batch, _ = h.(kvevent.BatchHandler)
	s.reset, _ = h.(kvevent.ResetHandler)
	return s
}

// The stream is its sequencer's streamSink.
var _ streamSink = (*stream)(nil)

// newStream returns the stream cfg describes, replayed from replayEndpoint
// ("" for none), delivering to the handler that handler points to.
func newStream(cfg *ZMQClientConfig, replayEndpoint string, obs *observer, handler *atomic.Pointer[handlerSet]) *stream {
	s := &stream{cfg: cfg, replayEndpoint: replayEndpoint, obs: obs, handler: handler}
	s.seq = newSequencer(s, cfg.MaxPendingBatches)
	s.replay.backoff = cfg.ReconnectDelay
	return s
}

// openReplay creates the replay socket in ctx, when the stream replays.
func (s *stream) openReplay(ctx *zmq.Context) error {
	s.ctx = ctx
	if s.replayEndpoint == "" {
		return nil
	}
	return s.openDealer()
}

// openDealer creates and connects a fresh replay socket.
func (s *stream) openDealer() error {
	ep := s.replayEndpoint
	d, err := s.ctx.NewSocket(zmq.DEALER)
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
	s.dealer = d
	return nil
}

// resetDealer replaces the replay socket, so that replies to an abandoned
// request can never be taken for replies to the next one.
func (s *stream) resetDealer() {
	s.replay.active = false
	if s.dealer == nil {
		return
	}
	s.dealer.Close()
	s.dealer = nil
	if err := s.openDealer(); err != nil {
		s.obs.socketFailed(err, "Replay is unavailable until the stream reconnects")
	}
}

// replaySocket returns the replay socket the driver polls, nil when there is
// none.
func (s *stream) replaySocket() *zmq.Socket { return s.dealer }

// detach closes the replay socket and forgets the connection, the replay in
// flight and the buffered batches: the driver closed the stream's sockets.
// The sequencer keeps the stream's position for the next connection.
func (s *stream) detach() {
	if s.dealer != nil {
		s.dealer.Close()
		s.dealer = nil
	}
	s.replay.active = false
	s.connected = false
	s.seq.detach()
	s.obs.setConnected(false, false)
}

// up records that the stream's engine is connected at now and replays from
// the last delivered batch.
func (s *stream) up(now time.Time) {
	s.connected = true
	s.quietFrom(now)
	s.obs.setConnected(true, true)
	s.seq.onConnected()
}

// down records that the stream's engine is disconnected.
func (s *stream) down() {
	s.connected = false
	s.obs.setConnected(false, true)
}

// live feeds the sequencer one live batch; liveArrived has been called for
// the burst it belongs to.
func (s *stream) live(seq uint64, payload []byte) { s.seq.onLive(seq, payload) }

// rewind restarts the stream at seq (see ZMQClient.ReplayFrom).
func (s *stream) rewind(seq uint64) error {
	if seq > s.seq.next {
		return fmt.Errorf("kvevent: replay %s from seq %d: the stream expects seq %d next", s.cfg.PodKey, seq, s.seq.next)
	}
	s.seq.rewind(seq)
	return nil
}

// runTimers fails a replay that stayed silent past its deadline and probes
// a stream that stayed quiet past its probe time.
func (s *stream) runTimers(now time.Time) {
	if s.replay.active && !now.Before(s.replay.deadline) {
		s.failReplay(kindUncounted, fmt.Errorf("no reply within %v", s.cfg.ReplayTimeout))
	}
	if s.connected && !now.Before(s.probeAt) {
		s.seq.probe()
		s.probeDelay = min(time.Duration(float64(s.probeDelay)*ReconnectBackoffFactor), s.cfg.MaxReconnectDelay)
		s.probeAt = now.Add(s.probeDelay)
	}
}

// timerWait returns how long a poll may wait before runTimers has work,
// capped at limit.
func (s *stream) timerWait(limit time.Duration) time.Duration {
	if s.replay.active {
		limit = min(limit, max(time.Until(s.replay.deadline), 0))
	}
	if s.connected {
		limit = min(limit, max(time.Until(s.probeAt), 0))
	}
	return limit
}

// quietFrom restarts the quiet-stream probe schedule at now.
func (s *stream) quietFrom(now time.Time) {
	s.probeDelay = s.cfg.ReconnectDelay
	s.probeAt = now.Add(s.probeDelay)
}

// errMalformed describes a message that is not vLLM's [topic, seq,
// payload].
func errMalformed(frames [][]byte) error {
	lens := make([]int, len(frames))
	for i, f := range frames {
		lens[i] = len(f)
	}
	return fmt.Errorf("want 3 frames [topic, 8-byte seq, payload], got frame lengths %v", lens)
}
