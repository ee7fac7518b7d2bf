package transport

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// BindTopicPrefix starts the topic of an engine that dials into a bound
// receiver: kv@<pod-ip>:<port>@<model>.
const BindTopicPrefix = "kv@"

// BindConfig configures a BindReceiver: SUB sockets bound for engines to
// dial into (vLLM's PUB connects when its endpoint names a host, as in
// tcp://gateway:5557), instead of one connection dialled to every engine.
//
// Each engine must publish with topic kv@<pod-ip>:<port>@<model>; the
// receiver hands a message to the stream followed for that IP, model and
// rank, and counts every other message as ignored (see Ignored).
type BindConfig struct {
	// Endpoint is the endpoint bound for rank 0, e.g. tcp://*:5557. Rank r
	// binds Endpoint offset by r as vLLM offsets its endpoints: the port
	// plus r for tcp, the suffix "_dp<r>" for inproc; because a connecting
	// engine offsets its endpoint by its rank too.
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

// ParseBindTopic splits a topic kv@<pod-ip>:<port>@<model> into its
// parts. The IP is returned in canonical form.
func ParseBindTopic(topic string) (ip string, port int, model string, err error) {
	rest, ok := strings.CutPrefix(topic, BindTopicPrefix)
	if !ok {
		return "", 0, "", fmt.Errorf("topic %q does not start with %q", topic, BindTopicPrefix)
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
	return BindTopicPrefix + net.JoinHostPort(ip, "<port>") + "@" + model
}

// BindReceiver follows the streams of engines that dial into its bound SUB
// sockets, one socket per data-parallel rank. Each stream is exact in the
// way a ZMQClient's is: the receiver replays it from the engine's replay
// ROUTER when its engine first sends, on gaps and when it is quiet.
//
// One goroutine owns the bound sockets and every stream; Follow and
// Unfollow hand streams to it and take them back. All methods are safe for
// concurrent use.
type BindReceiver struct {
	cfg    BindConfig
	logger klog.Logger
	bound  []string // endpoints, by rank
	ctx    *zmq.Context
	ownCtx bool
	cmds   chan func()
	stop   chan struct{}
	done   chan struct{}

	// Owned by the goroutine.
	subs     []*zmq.Socket           // by rank
	byAddr   map[string]string       // ip@model -> pod key
	streams  map[boundKey]*bindState // followed streams
	warnedAt map[string]time.Time    // when an ignored identity was last logged
	poller   *zmq.Poller
	dirty    bool // the set of sockets changed: rebuild poller
	frames   [][]byte
}

// boundKey identifies a followed stream: its pod and rank.
type boundKey struct {
	pod  string
	rank int
}

// bindState is one followed stream of a BindReceiver: a client that is
// never started, whose loop state (sequencer, replay socket) the receiver
// drives.
type bindState struct {
	c      *ZMQClient
	addr   string      // ip@model of its engine
	topic  string      // identity of the engine, once it has sent
	dealer *zmq.Socket // replay socket the poller knows
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
	r := &BindReceiver{cfg: cfg, logger: cfg.Logger, ctx: cfg.Context,
		cmds: make(chan func()), stop: make(chan struct{}), done: make(chan struct{}),
		byAddr: map[string]string{}, streams: map[boundKey]*bindState{}, warnedAt: map[string]time.Time{}, dirty: true}
	if r.logger.GetSink() == nil {
		r.logger = klog.Background()
	}
	if r.ctx == nil {
		ctx, err := zmq.NewContext()
		if err != nil {
			return nil, fmt.Errorf("kvevent: bind: create ZeroMQ context: %w", err)
		}
		r.ctx, r.ownCtx = ctx, true
	}
	for rank := range max(cfg.Ranks, 1) {
		ep, _ := zmqwire.OffsetEndpointPort(cfg.Endpoint, rank)
		if err := r.bind(ep); err != nil {
			r.closeSockets()
			return nil, err
		}
	}
	go r.run()
	return r, nil
}

func (r *BindReceiver) bind(ep string) error {
	s, err := r.ctx.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("kvevent: bind %s: %w", ep, err)
	}
	r.subs = append(r.subs, s)
	r.bound = append(r.bound, ep)
	err = errors.Join(s.SetLinger(0), s.SetRcvhwm(r.cfg.ReceiveHWM), s.SetSubscribe(""))
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
func (r *BindReceiver) closeSockets() {
	for _, s := range r.subs {
		s.Close()
	}
	r.subs = nil
	if r.ownCtx {
		if err := r.ctx.Term(); err != nil {
			r.logger.Error(err, "Terminating the ZeroMQ context failed")
		}
	}
}

// do runs fn on the goroutine and waits for it.
func (r *BindReceiver) do(fn func()) error {
	ran := make(chan struct{})
	select {
	case r.cmds <- func() { fn(); close(ran) }:
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
	// receiver sets PubEndpoint to the rank's bound endpoint and Context to
	// its own; PubPort, RouterPort and Topic are not used.
	Config *ZMQClientConfig
	// Handler receives the stream's batches, as a ZMQClient's would.
	Handler kvevent.EventHandler
}

// BoundStream is a stream a BindReceiver follows, for its statistics.
type BoundStream struct {
	key boundKey
	c   *ZMQClient
}

// Stats returns a snapshot of the stream's counters.
func (s *BoundStream) Stats() ClientStats { return s.c.Stats() }

// Endpoints returns the bound endpoint the stream's engine dials and the
// replay endpoint it is replayed from ("" without replay).
func (s *BoundStream) Endpoints() (pub, replay string) { return s.c.pubEndpoint, s.c.replayEndpoint }

// Follow starts following streams, all of them or, on error, none. A
// stream attaches to its engine on the engine's first message and replays
// it from the start, since the engine published before it was followed.
// Streams of one pod and rank replace each other; the latest pod to follow
// an IP and model receives its messages. Follow fails on an invalid
// config, a rank the receiver does not bind, or a closed receiver.
func (r *BindReceiver) Follow(streams ...BoundStreamConfig) ([]*BoundStream, error) {
	out := make([]*BoundStream, 0, len(streams))
	states := make([]*bindState, 0, len(streams))
	closeAll := func() {
		for _, st := range states {
			st.c.Close()
		}
	}
	for _, s := range streams {
		if s.Config == nil {
			closeAll()
			return nil, errors.New("kvevent: follow a bound stream: nil config")
		}
		cfg := *s.Config
		if cfg.DPRank < 0 || cfg.DPRank >= len(r.bound) {
			closeAll()
			return nil, fmt.Errorf("kvevent: follow %s rank %d: the receiver binds %d ranks", cfg.PodKey, cfg.DPRank, len(r.bound))
		}
		if net.ParseIP(cfg.PodIP) == nil {
			closeAll()
			return nil, fmt.Errorf("kvevent: follow %s rank %d: PodIP %q is not an IP address", cfg.PodKey, cfg.DPRank, cfg.PodIP)
		}
		cfg.PubEndpoint, cfg.Topic, cfg.Context = r.bound[cfg.DPRank], "", r.ctx
		c, err := NewZMQClient(&cfg, s.Handler)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("follow %s rank %d: %w", cfg.PodKey, cfg.DPRank, err)
		}
		c.ctx = r.ctx
		key := boundKey{pod: cfg.PodKey, rank: cfg.DPRank}
		states = append(states, &bindState{c: c, addr: addrKey(cfg.PodIP, cfg.ModelName)})
		out = append(out, &BoundStream{key: key, c: c})
	}
	err := r.do(func() {
		for i, st := range states {
			if old := r.streams[out[i].key]; old != nil {
				old.c.loop.close()
			}
			r.byAddr[st.addr] = out[i].key.pod
			r.streams[out[i].key] = st
		}
		r.dirty = true
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	return out, nil
}

// Unfollow stops following streams and returns once none of their batches
// can reach their handlers any more.
func (r *BindReceiver) Unfollow(streams ...*BoundStream) {
	r.do(func() {
		for _, s := range streams {
			st := r.streams[s.key]
			if st == nil || st.c != s.c {
				continue
			}
			delete(r.streams, s.key)
			if r.byAddr[st.addr] == s.key.pod {
				delete(r.byAddr, st.addr)
			}
			st.c.loop.close()
			r.dirty = true
		}
	})
	for _, s := range streams {
		s.c.Close()
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
func (r *BindReceiver) run() {
	defer close(r.done)
	defer r.closeSockets()
	defer func() {
		for _, st := range r.streams {
			st.c.loop.close()
		}
	}()
	for {
		select {
		case <-r.stop:
			return
		case cmd := <-r.cmds:
			cmd()
			continue
		default:
		}
		r.poll()
	}
}

// poll waits for the sockets once and services what is ready, then the
// streams' timers.
func (r *BindReceiver) poll() {
	if r.dirty {
		r.rebuildPoller()
	}
	wait := r.cfg.PollTimeout
	for _, st := range r.streams {
		if st.topic != "" {
			wait = st.c.loop.timerWait(wait)
		}
	}
	ready, err := r.poller.Poll(wait)
	if err != nil {
		if zmq.AsErrno(err) != zmq.Errno(syscall.EINTR) {
			r.logger.Error(err, "Polling the bound KV event sockets failed")
			time.Sleep(r.cfg.PollTimeout)
		}
		return
	}
	for _, p := range ready {
		if rank := r.subRank(p.Socket); rank >= 0 {
			r.drainLive(rank)
			continue
		}
		for _, st := range r.streams {
			if st.dealer == p.Socket && st.c.loop.dealer != nil {
				st.c.loop.drainReplies()
				r.track(st)
			}
		}
	}
	now := time.Now()
	for _, st := range r.streams {
		if st.topic != "" {
			st.c.loop.runTimers(now)
			r.track(st)
		}
	}
}

func (r *BindReceiver) subRank(s *zmq.Socket) int {
	for rank, sub := range r.subs {
		if sub == s {
			return rank
		}
	}
	return -1
}

// track notices a stream whose replay socket was replaced.
func (r *BindReceiver) track(st *bindState) {
	if st.c.loop.dealer != st.dealer {
		st.dealer = st.c.loop.dealer
		r.dirty = true
	}
}

func (r *BindReceiver) rebuildPoller() {
	r.poller = zmq.NewPoller()
	for _, s := range r.subs {
		r.poller.Add(s, zmq.POLLIN)
	}
	for _, st := range r.streams {
		if st.dealer != nil {
			r.poller.Add(st.dealer, zmq.POLLIN)
		}
	}
	r.dirty = false
}
