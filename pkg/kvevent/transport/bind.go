package transport

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// bindTopicPrefix starts the topic of an engine that dials into a bound
// receiver: kv@<pod-ip>:<port>@<model>.
const bindTopicPrefix = "kv@"

// BindConfig configures a BindReceiver: SUB sockets bound for engines to
// dial into (vLLM's PUB connects when its endpoint names a host, as in
// tcp://gateway:5557), instead of one connection dialled to every engine.
//
// Each engine must publish with topic kv@<pod-ip>:<port>@<model>; the
// receiver hands a message to the stream followed for that IP, model and
// rank, and counts every other message as ignored (see Ignored).
type BindConfig struct {
	// Endpoint is the endpoint bound for rank 0, e.g. tcp://*:5557. Rank r
	// binds Endpoint offset by r exactly as a connecting vLLM engine of
	// rank r offsets its endpoint: the port plus r for tcp, the suffix
	// "_dp<r>" for inproc.
	Endpoint string
	// Ranks is how many ranks are bound: the largest data-parallel size of
	// the engines (1 when 0).
	Ranks int
	// Context is the ZeroMQ context of the bound sockets and the streams'
	// replay sockets. When nil the receiver creates its own and terminates
	// it on Close.
	Context *zmq.Context
	// ReceiveHWM is the bound sockets' receive high-water mark in messages
	// (DefaultReceiveHWM when 0).
	ReceiveHWM int
	// PollTimeout bounds how long Follow and Unfollow wait for the
	// receiver's goroutine (DefaultPollTimeout when 0).
	PollTimeout time.Duration
	// Logger receives the receiver's logs; the zero value logs through
	// klog's global logger.
	Logger klog.Logger
	// Ignored, when set, is called from the receiver's goroutine with the
	// reason (one of the Ignored constants) of every message it drops.
	Ignored func(reason string)
}

// Validate reports what makes cfg unusable: an endpoint that is not a
// ZeroMQ endpoint or cannot be offset for every rank, or a negative count.
func (c *BindConfig) Validate() error {
	if err := zmqwire.ValidEndpoint(c.Endpoint); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	if c.Ranks < 0 {
		return fmt.Errorf("bind: Ranks %d is negative", c.Ranks)
	}
	if c.ReceiveHWM < 0 || c.PollTimeout < 0 {
		return fmt.Errorf("bind: ReceiveHWM %d and PollTimeout %v must not be negative", c.ReceiveHWM, c.PollTimeout)
	}
	for r := range max(c.Ranks, 1) {
		if _, err := zmqwire.OffsetEndpointPort(c.Endpoint, r); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
	}
	return nil
}

// Reasons a BindReceiver ignores a message, passed to BindConfig.Ignored.
const (
	IgnoredMalformed       = "malformed_message"
	IgnoredBadTopic        = "bad_topic"
	IgnoredUnknownPod      = "unknown_pod"
	IgnoredRankOutOfRange  = "rank_out_of_range"
	IgnoredIdentityChanged = "identity_conflict"
)

// parseBindTopic splits a topic kv@<pod-ip>:<port>@<model> into its
// parts. The IP is returned in canonical form.
func parseBindTopic(topic string) (ip string, port int, model string, err error) {
	rest, ok := strings.CutPrefix(topic, bindTopicPrefix)
	if !ok {
		return "", 0, "", fmt.Errorf("topic %q does not start with %q", topic, bindTopicPrefix)
	}
	addr, model, ok := strings.Cut(rest, "@")
	if !ok || model == "" {
		return "", 0, "", fmt.Errorf("topic %q has no @<model> after the address", topic)
	}
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, "", fmt.Errorf("topic %q: address: %w", topic, err)
	}
	parsed := net.ParseIP(host)
	port, perr := strconv.Atoi(p)
	if parsed == nil || perr != nil || port < 1 || port > 65535 {
		return "", 0, "", fmt.Errorf("topic %q: want <ip>:<port>, got %q", topic, addr)
	}
	return parsed.String(), port, model, nil
}

// BindTopic is the topic the engine at ip serving model publishes with,
// for logs and status: any port identifies it.
func BindTopic(ip, model string) string {
	return bindTopicPrefix + net.JoinHostPort(ip, "<port>") + "@" + model
}

// BindReceiver follows the streams of engines that dial into its bound SUB
// sockets, one socket per data-parallel rank. Each stream is kept exact as
// a ZMQClient's is: the receiver replays it from the engine's replay ROUTER
// when its engine first sends, on gaps and when it is quiet.
//
// One goroutine owns the bound sockets and every followed stream; Follow
// hands new streams to it and Unfollow takes them back, both through
// commands the goroutine picks up within BindConfig.PollTimeout. All
// methods are safe for concurrent use.
type BindReceiver struct {
	bound []string // endpoints, by rank
	ctx   *zmq.Context
	cmds  chan func(*bindLoop)
	stop  chan struct{}
	done  chan struct{}
}

// bindLoop is the state of a BindReceiver's goroutine, which alone holds
// it.
type bindLoop struct {
	cfg      BindConfig
	logger   klog.Logger
	ctx      *zmq.Context
	ownCtx   bool
	subs     []*zmq.Socket            // by rank
	bound    []string                 // endpoints, by rank
	byAddr   map[string]string        // ip@model -> pod key
	streams  map[boundKey]*boundEntry // followed streams
	warnedAt map[string]time.Time     // when an ignored identity was last logged
	poller   *zmq.Poller
	dirty    bool // the set of sockets changed: rebuild poller
	frames   [][]byte
}

// boundKey identifies a followed stream: its pod and rank.
type boundKey struct {
	pod  string
	rank int
}

// boundEntry is one stream a bindLoop follows.
type boundEntry struct {
	s      *stream
	handle *BoundStream
	addr   string      // ip@model of its engine
	topic  string      // identity of the engine, once it has sent
	polled *zmq.Socket // the replay socket the poller holds
}

// NewBindReceiver binds cfg's endpoints and starts the receiver's
// goroutine. It fails on an invalid cfg or when an endpoint cannot be
// bound.
func NewBindReceiver(cfg BindConfig) (*BindReceiver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kvevent: %w", err)
	}
	cfg.ReceiveHWM = cmp.Or(cfg.ReceiveHWM, DefaultReceiveHWM)
	cfg.PollTimeout = cmp.Or(cfg.PollTimeout, DefaultPollTimeout)
	l := &bindLoop{cfg: cfg, logger: cfg.Logger, ctx: cfg.Context,
		byAddr: map[string]string{}, streams: map[boundKey]*boundEntry{}, warnedAt: map[string]time.Time{}, dirty: true}
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
	r := &BindReceiver{bound: l.bound, ctx: l.ctx,
		cmds: make(chan func(*bindLoop)), stop: make(chan struct{}), done: make(chan struct{})}
	go l.run(r)
	return r, nil
}

func (l *bindLoop) bind(ep string) error {
	s, err := l.ctx.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("kvevent: bind %s: %w", ep, err)
	}
	l.subs = append(l.subs, s)
	l.bound = append(l.bound, ep)
	err = errors.Join(s.SetLinger(0), s.SetRcvhwm(l.cfg.ReceiveHWM), s.SetSubscribe(""))
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

// do runs fn on the goroutine and waits for it.
func (r *BindReceiver) do(fn func(*bindLoop)) error {
	ran := make(chan struct{})
	select {
	case r.cmds <- func(l *bindLoop) { fn(l); close(ran) }:
		<-ran
		return nil
	case <-r.done:
		return errors.New("kvevent: bound receiver is closed")
	}
}

// BoundStreamConfig is one stream for BindReceiver.Follow.
type BoundStreamConfig struct {
	// Config configures the stream as it would a ZMQClient's. PodIP (an IP
	// address), ModelName and DPRank name the engine's messages: topic
	// kv@<PodIP>:<any port>@<ModelName> on rank DPRank's bound socket.
	// Replay dials ReplayEndpoint; an empty one disables replay. The
	// receiver sets PubEndpoint to the rank's bound endpoint; PubPort,
	// RouterPort, Topic and Context are not used.
	Config *ZMQClientConfig
	// Handler receives the stream's batches, as a ZMQClient's would.
	Handler kvevent.EventHandler
}

// BoundStream is a stream a BindReceiver follows, for its statistics and
// for Unfollow.
type BoundStream struct {
	key            boundKey
	pubEndpoint    string
	replayEndpoint string
	obs            *observer
}

// Stats returns a snapshot of the stream's counters.
func (s *BoundStream) Stats() ClientStats { return s.obs.stats() }

// Endpoints returns the bound endpoint the stream's engine dials and the
// replay endpoint it is replayed from ("" without replay).
func (s *BoundStream) Endpoints() (pub, replay string) { return s.pubEndpoint, s.replayEndpoint }

// Follow starts following streams, all of them or, on error, none. A
// stream attaches to its engine on the engine's first message and replays
// it from the start, since the engine published before it was followed.
// A stream replaces the one followed before for the same pod and rank; the
// latest pod to follow an IP and model receives its messages. Follow fails
// on an invalid config, a nil handler, a rank the receiver does not bind,
// or a closed receiver.
func (r *BindReceiver) Follow(streams ...BoundStreamConfig) ([]*BoundStream, error) {
	handles := make([]*BoundStream, 0, len(streams))
	entries := make([]*boundEntry, 0, len(streams))
	fail := func(err error) ([]*BoundStream, error) {
		for _, h := range handles {
			h.obs.close()
		}
		return nil, err
	}
	for _, bs := range streams {
		e, err := r.newEntry(bs)
		if err != nil {
			return fail(err)
		}
		entries = append(entries, e)
		handles = append(handles, e.handle)
	}
	err := r.do(func(l *bindLoop) {
		for _, e := range entries {
			if old := l.streams[e.handle.key]; old != nil {
				old.s.detach()
			}
			l.byAddr[e.addr] = e.handle.key.pod
			l.streams[e.handle.key] = e
		}
		l.dirty = true
	})
	if err != nil {
		return fail(err)
	}
	return handles, nil
}

// newEntry builds the stream bs describes, not yet followed.
func (r *BindReceiver) newEntry(bs BoundStreamConfig) (*boundEntry, error) {
	if bs.Config == nil {
		return nil, errors.New("kvevent: follow a bound stream: nil config")
	}
	cfg := *bs.Config
	switch {
	case cfg.DPRank < 0 || cfg.DPRank >= len(r.bound):
		return nil, fmt.Errorf("kvevent: follow %s rank %d: the receiver binds %d ranks", cfg.PodKey, cfg.DPRank, len(r.bound))
	case net.ParseIP(cfg.PodIP) == nil:
		return nil, fmt.Errorf("kvevent: follow %s rank %d: PodIP %q is not an IP address", cfg.PodKey, cfg.DPRank, cfg.PodIP)
	case bs.Handler == nil:
		return nil, fmt.Errorf("kvevent: follow %s rank %d: nil handler", cfg.PodKey, cfg.DPRank)
	}
	cfg.PubEndpoint, cfg.Topic, cfg.Context = r.bound[cfg.DPRank], "", r.ctx
	if err := ValidateConfig(&cfg); err != nil {
		return nil, fmt.Errorf("follow %s rank %d: %w", cfg.PodKey, cfg.DPRank, err)
	}
	pub, replay := cfg.endpoints()
	obs := newObserver(&cfg, pub)
	handler := &atomic.Pointer[handlerSet]{}
	handler.Store(newHandlerSet(bs.Handler))
	h := &BoundStream{key: boundKey{pod: cfg.PodKey, rank: cfg.DPRank}, pubEndpoint: pub, replayEndpoint: replay, obs: obs}
	return &boundEntry{s: newStream(&cfg, replay, obs, handler), handle: h, addr: addrKey(cfg.PodIP, cfg.ModelName)}, nil
}

// Unfollow stops following streams and returns once none of their batches
// can reach their handlers any more.
func (r *BindReceiver) Unfollow(streams ...*BoundStream) {
	r.do(func(l *bindLoop) {
		for _, h := range streams {
			e := l.streams[h.key]
			if e == nil || e.handle != h {
				continue
			}
			delete(l.streams, h.key)
			if l.byAddr[e.addr] == h.key.pod {
				delete(l.byAddr, e.addr)
			}
			e.s.detach()
			l.dirty = true
		}
	})
	for _, h := range streams {
		h.obs.close()
	}
}

// Close stops the receiver's goroutine and closes the bound sockets and the
// replay sockets of the streams still followed, whose handlers get nothing
// more; it terminates the context when the receiver created it. Close
// returns once all of it is done; it must be called once.
func (r *BindReceiver) Close() {
	close(r.stop)
	<-r.done
}

func addrKey(ip, model string) string {
	if p := net.ParseIP(ip); p != nil {
		ip = p.String()
	}
	return ip + "@" + model
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

// poll waits for the sockets once and services what is ready, then the
// streams' timers.
func (l *bindLoop) poll() {
	if l.dirty {
		l.rebuildPoller()
	}
	wait := l.cfg.PollTimeout
	for _, e := range l.streams {
		if e.topic != "" {
			wait = e.s.timerWait(wait)
		}
	}
	ready, err := l.poller.Poll(wait)
	if err != nil {
		if zmq.AsErrno(err) != zmq.Errno(syscall.EINTR) {
			l.logger.Error(err, "Polling the bound KV event sockets failed")
			time.Sleep(l.cfg.PollTimeout)
		}
		return
	}
	for _, p := range ready {
		if rank := l.subRank(p.Socket); rank >= 0 {
			l.drainLive(rank)
			continue
		}
		for _, e := range l.streams {
			if e.polled == p.Socket {
				e.s.drainReplies()
				l.track(e)
			}
		}
	}
	now := time.Now()
	for _, e := range l.streams {
		if e.topic != "" {
			e.s.runTimers(now)
			l.track(e)
		}
	}
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

func (l *bindLoop) rebuildPoller() {
	l.poller = zmq.NewPoller()
	for _, s := range l.subs {
		l.poller.Add(s, zmq.POLLIN)
	}
	for _, e := range l.streams {
		if e.polled != nil {
			l.poller.Add(e.polled, zmq.POLLIN)
		}
	}
	l.dirty = false
}
