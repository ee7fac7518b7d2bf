package transport

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// bindLoop is the state of a BindReceiver's goroutine, which alone holds
// it.
type bindLoop struct {
	cfg          BindConfig
	logger       klog.Logger
	ctx          *zmq.Context
	ownCtx       bool
	subs         []*zmq.Socket            // by rank
	bound        []string                 // endpoints, by rank
	byIdentity   map[bindIdentity]string  // engine identity -> pod key
	streams      map[boundKey]*boundEntry // followed streams
	ignoreLimits map[string]*logLimiter   // log limits of ignored messages, by reason
	poller       *zmqwire.Poller
	dirty        bool // the set of sockets changed: rebuild poller
	frames       [][]byte
	// pacer spaces the reads of the bound sockets.
	pacer readPacer
}

// boundKey identifies a followed stream: its pod and rank.
type boundKey struct {
	pod  string
	rank int
}

// boundEntry is one stream a bindLoop follows.
type boundEntry struct {
	s        *stream
	handle   *BoundStream
	id       bindIdentity // of its engine
	attached bool         // its engine has sent
	alive    bool         // heard from within the liveness timeout
	polled   *zmq.Socket  // the replay socket the poller holds
	// received counts the live messages of the current read.
	received int
}

// newBindLoop creates the context (unless cfg has one) and binds the
// sockets of every rank.
func newBindLoop(cfg BindConfig) (*bindLoop, error) {
	l := &bindLoop{cfg: cfg, logger: cfg.Logger, ctx: cfg.Context, byIdentity: map[bindIdentity]string{},
		streams: map[boundKey]*boundEntry{}, ignoreLimits: map[string]*logLimiter{}, dirty: true,
		pacer: readPacer{interval: max(cfg.ReadInterval, 0)}}
	if l.logger.GetSink() == nil {
		l.logger = klog.Background()
	}
	if l.ctx == nil {
		ctx, err := zmq.NewContext()
		if err != nil {
			return nil, fmt.Errorf("kvevent: bind: create ZeroMQ context: %w", err)
		}
		l.ctx, l.ownCtx = ctx, true
	}
	for rank := range max(cfg.Ranks, 1) {
		ep, _ := zmqwire.OffsetEndpointPort(cfg.Endpoint, rank)
		if err := l.bind(ep); err != nil {
			l.closeSockets()
			return nil, err
		}
	}
	return l, nil
}

func (l *bindLoop) bind(ep string) error {
	s, err := l.ctx.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("kvevent: bind %s: %w", ep, err)
	}
	l.subs = append(l.subs, s)
	l.bound = append(l.bound, ep)
	err = errors.Join(s.SetLinger(0), s.SetRcvhwm(l.cfg.ReceiveHWM), s.SetMaxmsgsize(int64(l.cfg.MaxMessageBytes)),
		s.SetSubscribe(""))
	if err == nil && (zmqwire.NeedsIPv6(ep) || strings.Contains(ep, "::")) {
		err = s.SetIpv6(true)
	}
	if err == nil {
		err = s.Bind(ep)
	}
	if err != nil {
		return fmt.Errorf("kvevent: bind %s: %w", ep, err)
	}
	return nil
}

// closeSockets closes the bound sockets and, when the receiver created it,
// terminates the context.
func (l *bindLoop) closeSockets() {
	_ = l.poller.Close()
	l.poller = nil
	for _, s := range l.subs {
		s.Close()
	}
	l.subs = nil
	if l.ownCtx {
		if err := l.ctx.Term(); err != nil {
			l.logger.Error(err, "Terminating the ZeroMQ context failed")
		}
	}
}

// follow adds entries, replacing the streams followed for the same pods
// and ranks, or fails, adding none, when another pod follows the identity
// of one of them.
func (l *bindLoop) follow(entries []*boundEntry) error {
	claims := map[bindIdentity]string{}
	for _, e := range entries {
		pod, ok := l.byIdentity[e.id]
		if !ok {
			pod, ok = claims[e.id]
		}
		if ok && pod != e.handle.key.pod {
			return fmt.Errorf("kvevent: follow %s: pod %s already follows the engine publishing as %s: "+
				"its messages could belong to either", e.handle.key.pod, pod, e.id)
		}
		claims[e.id] = e.handle.key.pod
	}
	for _, e := range entries {
		if old := l.streams[e.handle.key]; old != nil {
			l.drop(old)
		}
		l.byIdentity[e.id] = e.handle.key.pod
		l.streams[e.handle.key] = e
	}
	l.dirty = true
	return nil
}

// unfollow removes the streams handles name.
func (l *bindLoop) unfollow(handles []*BoundStream) {
	for _, h := range handles {
		if e := l.streams[h.key]; e != nil && e.handle == h {
			l.drop(e)
		}
	}
}

// drop stops following e.
func (l *bindLoop) drop(e *boundEntry) {
	delete(l.streams, e.handle.key)
	if l.byIdentity[e.id] == e.handle.key.pod && !l.identityInUse(e.id) {
		delete(l.byIdentity, e.id)
	}
	e.s.detach()
	l.dirty = true
}

// identityInUse reports whether a followed stream has identity id.
func (l *bindLoop) identityInUse(id bindIdentity) bool {
	for _, e := range l.streams {
		if e.id == id {
			return true
		}
	}
	return false
}

// run is the receiver's goroutine.
func (l *bindLoop) run(r *BindReceiver) {
	defer close(r.done)
	defer l.closeSockets()
	defer func() {
		for _, e := range l.streams {
			e.s.detach()
		}
	}()
	for {
		if !l.waitToRead(r) {
			return
		}
		select {
		case <-r.stop:
			return
		case cmd := <-r.cmds:
			cmd(l)
			continue
		default:
		}
		l.poll()
	}
}

// waitToRead waits until the pacer lets the sockets be polled again,
// running the commands that come meanwhile, and reports false when the
// receiver stops.
func (l *bindLoop) waitToRead(r *BindReceiver) bool {
	for {
		pause := l.pacer.wait()
		if pause == nil {
			return true
		}
		select {
		case <-r.stop:
			l.pacer.stop()
			return false
		case cmd := <-r.cmds:
			l.pacer.stop()
			cmd(l)
		case <-pause:
			l.pacer.resume()
			return true
		}
	}
}

// poll waits for the sockets once and reads what is ready, then lets every
// attached stream apply what it read, for one time slice, and run its
// timers and liveness.
func (l *bindLoop) poll() {
	if l.dirty {
		if err := l.rebuildPoller(); err != nil {
			l.logger.Error(err, "Polling the bound KV event sockets failed")
			time.Sleep(l.cfg.PollTimeout)
			return
		}
	}
	wait := l.cfg.PollTimeout
	for _, e := range l.streams {
		if e.attached {
			wait = e.s.timerWait(wait)
		}
	}
	ready, err := l.poller.Poll(l.pacer.pollTimeout(wait))
	if err != nil {
		if zmq.AsErrno(err) != zmq.Errno(syscall.EINTR) {
			l.logger.Error(err, "Polling the bound KV event sockets failed")
			time.Sleep(l.cfg.PollTimeout)
		}
		return
	}
	now := time.Now()
	// read: a bound socket was read; live: the read found messages;
	// backlog: more wait to be read or applied at once.
	read, live, backlog := false, false, false
	l.pacer.polled(slices.ContainsFunc(ready, func(p zmq.Polled) bool { return l.subRank(p.Socket) >= 0 }))
	for _, p := range ready {
		if rank := l.subRank(p.Socket); rank >= 0 {
			if !l.pacer.mayRead(now) {
				continue
			}
			found, more := l.readLive(rank)
			read, live, backlog = true, live || found, backlog || more
			continue
		}
		for _, e := range l.streams {
			if e.polled == p.Socket && e.polled == e.s.replaySocket() {
				e.s.readReplies()
			}
		}
	}
	for _, e := range l.streams {
		if e.attached {
			e.s.process(now)
			// A stream that got a high-water mark's worth may have more
			// waiting on its engine's side of the connection.
			backlog = backlog || e.s.hasWork() || e.received >= l.cfg.ReceiveHWM
			e.received = 0
			e.s.runTimers(now)
			l.checkLiveness(e, now)
			l.track(e)
		}
	}
	if read {
		l.pacer.read(now, live, backlog)
	}
	l.flushIgnoreLogs(now)
}

// checkLiveness marks e disconnected when it has not heard from its engine
// for the liveness timeout, and connected again when it has.
func (l *bindLoop) checkLiveness(e *boundEntry, now time.Time) {
	alive := now.Sub(e.s.heardAt) < l.cfg.LivenessTimeout
	if alive == e.alive {
		return
	}
	e.alive = alive
	e.s.obs.setConnected(alive, true)
}

func (l *bindLoop) subRank(s *zmq.Socket) int {
	for rank, sub := range l.subs {
		if sub == s {
			return rank
		}
	}
	return -1
}

// track notices a stream whose replay socket was replaced.
func (l *bindLoop) track(e *boundEntry) {
	if e.s.replaySocket() != e.polled {
		e.polled = e.s.replaySocket()
		l.dirty = true
	}
}

func (l *bindLoop) rebuildPoller() error {
	_ = l.poller.Close()
	socks := slices.Clone(l.subs)
	for _, e := range l.streams {
		socks = append(socks, e.polled)
	}
	var err error
	l.poller, err = zmqwire.NewPoller(socks...)
	l.dirty = err != nil
	return err
}
