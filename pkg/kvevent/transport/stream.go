package transport

import (
	"fmt"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// processSlice bounds how long a stream applies what it has read before its
// driver reads the sockets again, so that ZeroMQ's queues stay short while a
// stream is busy. The stream looks at the clock after every batch, so a
// slice runs over by one batch at most.
const processSlice = 2 * time.Millisecond

// stream is one engine's stream (one pod, one data-parallel rank): its
// sequencer, its inboxes, its replay socket, its timers, and the delivery of
// its batches to the handler. It knows nothing of the socket its live
// messages arrive on: a driver owns that socket and feeds the stream.
//
// A stream has exactly one owner at a time, the goroutine of the driver
// holding it: a ZMQClient's dialer, which follows one stream on a SUB
// socket of its own, or a BindReceiver, which follows many on bound
// sockets. Only the owner calls its methods. Other goroutines see the
// stream through its observer and the handler pointer, which are safe for
// concurrent use, and reach the owner through the driver's commands.
//
// A driver tells the stream when its engine is connected (up) and no
// longer (down), hands it every live message as soon as it is read
// (liveArrived, pushLive), has it read its replay socket when that is
// readable (readReplies), lets it apply what it read (process) while it
// has work, runs its timers when they are due (timerWait, runTimers), and
// rebuilds its poller whenever replaySocket changes. detach ends a
// connection's state; the sequencer outlives it, so that the stream
// resumes on the next connection.
type stream struct {
	cfg            *ZMQClientConfig // read-only
	replayEndpoint string           // "" without replay
	obs            *observer
	handler        *atomic.Pointer[handlerSet]
	seq            *sequencer

	ctx         *zmq.Context // of the replay sockets
	live        inbox        // live messages read, not yet applied
	replies     inbox        // replies of the replay in flight, not yet applied
	dealer      *zmq.Socket  // socket of the replay in flight; nil otherwise
	replyFrames [][]byte     // reused frame slices of replay replies
	replay      replayTimer
	connected   bool
	probeAt     time.Time // when to probe the stream if it stays quiet
	probeDelay  time.Duration
	silence     liveSilence
	resets      resetBudget
	heardAt     time.Time // last live message or replay reply
}

// replayTimer follows the replay in flight and the timing of replay
// requests.
type replayTimer struct {
	// active is set from the request until the replay ends; the replay
	// socket is open until its end marker arrives or it is cut short,
	// after which the replies read are applied.
	active bool
	// ending is set once no more replies are read: the replay ends when
	// the replies inbox is applied, with cut telling how.
	ending  bool
	cut     bool
	replies int       // replies read
	cutAt   time.Time // the replay's overall deadline
	// deadline is when the replay fails if still silent.
	deadline time.Time
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
	s.seq = newSequencer(s, cfg.MaxPendingBatches, cfg.MaxPendingBytes)
	s.replay.backoff = cfg.ReconnectDelay
	s.live.limit, s.replies.limit = cfg.ReceiveBufferBytes, cfg.ReceiveBufferBytes
	s.resets.init(cfg)
	return s
}

// attach gives the stream the context its replay sockets are created in.
func (s *stream) attach(ctx *zmq.Context) { s.ctx = ctx }

// replaySocket returns the replay socket the driver polls, nil when there is
// none.
func (s *stream) replaySocket() *zmq.Socket { return s.dealer }

// detach closes the replay socket and forgets the connection, the replay in
// flight and everything read and not yet applied: the driver closed the
// stream's sockets. The sequencer keeps the stream's position for the next
// connection.
func (s *stream) detach() {
	s.endReplay()
	s.live.clear()
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
	if !s.resets.suspended {
		s.seq.onConnected()
	}
}

// down records that the stream's engine is disconnected.
func (s *stream) down() {
	s.connected = false
	s.obs.setConnected(false, true)
}

// pushLive queues one live message for process; liveArrived has been
// called for the burst it belongs to. A message the inbox cannot hold, or
// that arrives while the stream is suspended, is dropped and counted: the
// gap it leaves is replayed like one the engine's PUB left. It returns the
// payload bytes dropped for a full inbox.
func (s *stream) pushLive(seq uint64, payload []byte) int {
	switch {
	case s.resets.suspended:
		s.obs.droppedSuspended()
	case !s.live.push(inMsg{seq: seq, payload: payload}):
		s.obs.droppedLive(seq, len(payload), s.live.limit)
		return len(payload)
	}
	return 0
}

// heard records that the engine was heard from at now: a live message or
// a replay reply.
func (s *stream) heard(now time.Time) {
	s.heardAt = now
	s.obs.heard(now)
}

// hasWork reports whether the stream has read messages it has not applied,
// or a replay that ended and must be wound up.
func (s *stream) hasWork() bool {
	return !s.live.empty() || !s.replies.empty() || s.replay.ending
}

// process applies what the stream has read, replies first, until it is
// done or the time slice from now is used up; it applies one batch at
// least.
func (s *stream) process(now time.Time) {
	until := now.Add(processSlice)
	for n := 0; ; n++ {
		if n > 0 && time.Now().After(until) {
			return
		}
		if s.resets.suspended {
			s.live.clear()
			return
		}
		if m, ok := s.replies.pop(); ok {
			s.applyReply(m)
			continue
		}
		if s.replay.ending {
			s.finishReplay()
			continue
		}
		m, ok := s.live.pop()
		if !ok {
			return
		}
		s.seq.onLive(m.seq, m.payload)
	}
}

// rewind restarts the stream at seq (see ZMQClient.ReplayFrom).
func (s *stream) rewind(seq uint64) error {
	if seq > s.seq.next {
		return fmt.Errorf("kvevent: replay %s from seq %d: the stream expects seq %d next", s.cfg.PodKey, seq, s.seq.next)
	}
	s.seq.rewind(seq)
	return nil
}

// runTimers fails or cuts a replay that stayed silent or ran past its
// deadline, resumes a suspended stream, and probes a stream that stayed
// quiet past its probe time. A stream with live messages still to apply is
// not quiet: its probe waits until they are applied.
func (s *stream) runTimers(now time.Time) {
	s.obs.flushLogs(now)
	if s.resets.suspended {
		if now.Before(s.resets.until) {
			return
		}
		s.resume(now)
	}
	if s.replay.active && !s.replay.ending {
		switch {
		case !now.Before(s.replay.cutAt):
			s.cutReplay(LimitReplayDuration)
		case !now.Before(s.replay.deadline) && s.replay.replies > 0:
			s.obs.replayStalled(s.replay.replies, s.cfg.ReplayTimeout, s.replayEndpoint)
			s.cutReplay("")
		case !now.Before(s.replay.deadline):
			s.failReplay(kindUncounted, fmt.Errorf("no reply within %v", s.cfg.ReplayTimeout))
		}
	}
	if s.connected && !now.Before(s.probeAt) && s.live.empty() {
		s.seq.probe()
		s.probeDelay = min(time.Duration(float64(s.probeDelay)*ReconnectBackoffFactor), s.cfg.MaxReconnectDelay)
		s.probeAt = now.Add(s.probeDelay)
	}
}

// timerWait returns how long a poll may wait before the stream has work,
// capped at limit.
func (s *stream) timerWait(limit time.Duration) time.Duration {
	if s.hasWork() {
		return 0
	}
	if s.resets.suspended {
		return min(limit, max(time.Until(s.resets.until), 0))
	}
	if s.replay.active {
		limit = min(limit, max(time.Until(s.replay.deadline), 0), max(time.Until(s.replay.cutAt), 0))
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
// payload]: n frames, the first of which are frames.
func errMalformed(frames [][]byte, n int) error {
	lens := make([]int, len(frames))
	for i, f := range frames {
		lens[i] = len(f)
	}
	if n > len(frames) {
		return fmt.Errorf("want 3 frames [topic, 8-byte seq, payload], got %d frames, the first of lengths %v", n, lens)
	}
	return fmt.Errorf("want 3 frames [topic, 8-byte seq, payload], got frame lengths %v", lens)
}
