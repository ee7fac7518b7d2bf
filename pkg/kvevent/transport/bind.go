package transport

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// bindTopicPrefix starts the topic of an engine that dials into a bound
// receiver: kv@<ip>:<port>@<model>.
const bindTopicPrefix = "kv@"

// DefaultLivenessTimeout is how long a bound stream may go without hearing
// from its engine before it counts as disconnected: twice the longest wait
// between two quiet-stream probes by default (MaxReconnectInterval), whose
// replies prove a quiet engine alive.
const DefaultLivenessTimeout = 2 * MaxReconnectInterval

// BindConfig configures a BindReceiver: SUB sockets bound for engines to
// dial into (vLLM's PUB connects when its endpoint names a host, as in
// tcp://gateway:5557), instead of one connection dialled to every engine.
//
// Each engine publishes with topic kv@<ip>:<port>@<model>, its own IP
// address, the port of its HTTP server and its model. The receiver hands a
// message to the stream followed for that whole identity on the socket of
// the message's rank, and counts every other message as ignored (see
// Ignored).
//
// A bound socket accepts connections from anywhere its address is
// reachable, so a topic alone proves nothing: by default a message counts
// only when it comes from the IP address its topic names (the TCP peer
// address of its connection), so that no process can speak for an engine
// on another address, nor lock it out. Processes that share the engine's
// address (its pod's other containers, or the other processes of a node
// with host networking) are trusted with its identity; keep the bound
// port unreachable from elsewhere (a NetworkPolicy admitting only the
// engines).
type BindConfig struct {
	// Endpoint is the endpoint bound for rank 0, e.g. tcp://*:5557. Rank r
	// binds Endpoint offset by r exactly as a connecting vLLM engine of
	// rank r offsets its endpoint: the port plus r for tcp, the suffix
	// "_dp<r>" for inproc.
	Endpoint string
	// Ranks is how many ranks are bound, 0 to Ranks-1: above the largest
	// data-parallel rank of the engines (1 when 0).
	Ranks int
	// AllowAnyPeer accepts a message from any address, trusting its topic
	// alone. Set it only when engines reach the gateway through address
	// translation or a proxy, which hides their own addresses; anyone who
	// can reach the bound port can then speak for any engine.
	AllowAnyPeer bool
	// LivenessTimeout is how long a stream may go without a live message
	// or a replay reply from its engine before it counts as disconnected
	// (DefaultLivenessTimeout when 0). The quiet-stream probes keep an
	// engine with replay alive while it is idle; it must exceed the
	// streams' MaxReconnectDelay + ReplayTimeout, the longest a healthy
	// quiet engine goes unheard. Without replay, an idle engine counts as
	// disconnected until it publishes again.
	LivenessTimeout time.Duration
	// Context is the ZeroMQ context of the bound sockets and the streams'
	// replay sockets. When nil the receiver creates its own and terminates
	// it on Close.
	Context *zmq.Context
	// MaxMessageBytes bounds one frame on the bound sockets, as
	// ZMQClientConfig.MaxMessageBytes does (DefaultMaxMessageBytes when
	// 0).
	MaxMessageBytes int
	// ReceiveBufferBytes bounds what ZeroMQ queues for one connected
	// engine (DefaultReceiveBufferBytes when 0): the bound sockets'
	// receive high-water mark is ReceiveBufferBytes / MaxMessageBytes
	// messages, at least 1, unless ReceiveHWM sets it. A receiver cannot
	// disconnect one of the engines that dial in, so the bound is ZeroMQ's:
	// an engine that sends faster than the receiver reads is held back
	// (vLLM then queues on its side, up to its own high-water mark).
	ReceiveBufferBytes int
	// ReceiveHWM, when set, is the bound sockets' receive high-water mark
	// in messages per connected engine instead.
	ReceiveHWM int
	// PollTimeout bounds how long Follow and Unfollow wait for the
	// receiver's goroutine (DefaultPollTimeout when 0).
	PollTimeout time.Duration
	// ReadInterval is the least time between two reads of the bound
	// sockets while engines keep sending (DefaultReadInterval when 0;
	// negative: every read as soon as a message arrives; at most
	// MaxReadInterval). A message that arrives within the interval after
	// a read that found messages waits out the rest of it and is read
	// with everything that came meanwhile: a fleet's batches are read a
	// group at a time, one wake-up of the receiver for many, which costs
	// the receiver's process about a third less CPU a batch than reading
	// each as it comes (BenchmarkPacedBatchesFleetBound). A message that
	// comes later is read at once, so none waits longer than the interval,
	// and the receiver does not wait while a stream has more than it
	// applied in its time slice, or got as many messages as its ReceiveHWM
	// (ZeroMQ holds the engine's next ones back), or after a read that
	// stopped at its limit of 1,024 messages.
	ReadInterval time.Duration
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
	if c.ReceiveHWM < 0 || c.PollTimeout < 0 || c.MaxMessageBytes < 0 || c.ReceiveBufferBytes < 0 || c.LivenessTimeout < 0 {
		return fmt.Errorf("bind: ReceiveHWM %d, MaxMessageBytes %d, ReceiveBufferBytes %d, PollTimeout %v and LivenessTimeout %v "+
			"must not be negative", c.ReceiveHWM, c.MaxMessageBytes, c.ReceiveBufferBytes, c.PollTimeout, c.LivenessTimeout)
	}
	if c.ReadInterval > MaxReadInterval {
		return fmt.Errorf("bind: ReadInterval %v is above %v", c.ReadInterval, MaxReadInterval)
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
	IgnoredMalformed      = "malformed_message"
	IgnoredBadTopic       = "bad_topic"
	IgnoredUnknownPod     = "unknown_pod"
	IgnoredRankOutOfRange = "rank_out_of_range"
	// IgnoredPeerMismatch is a message whose topic names an IP address
	// other than the one it came from.
	IgnoredPeerMismatch = "peer_mismatch"
)

// IgnoredReasons lists every reason a BindReceiver ignores a message.
var IgnoredReasons = []string{IgnoredMalformed, IgnoredBadTopic, IgnoredUnknownPod, IgnoredRankOutOfRange, IgnoredPeerMismatch}

// bindIdentity is what a topic kv@<ip>:<port>@<model> names, with the IP in
// canonical form.
type bindIdentity struct {
	ip    string
	port  int
	model string
}

// String is the canonical topic of the identity.
func (id bindIdentity) String() string { return BindTopic(id.ip, id.port, id.model) }

// newBindIdentity returns the identity of the engine at ip, port serving
// model, or an error when ip is not an IP address or port not a port.
func newBindIdentity(ip string, port int, model string) (bindIdentity, error) {
	parsed := net.ParseIP(ip)
	switch {
	case parsed == nil:
		return bindIdentity{}, fmt.Errorf("%q is not an IP address", ip)
	case port < 1 || port > 65535:
		return bindIdentity{}, fmt.Errorf("port %d is not a port", port)
	case model == "":
		return bindIdentity{}, errors.New("no model")
	}
	return bindIdentity{ip: parsed.String(), port: port, model: model}, nil
}

// parseBindTopic reads the identity a topic kv@<ip>:<port>@<model> names.
func parseBindTopic(topic string) (bindIdentity, error) {
	rest, ok := strings.CutPrefix(topic, bindTopicPrefix)
	if !ok {
		return bindIdentity{}, &topicError{topic, `does not start with "` + bindTopicPrefix + `"`}
	}
	addr, model, ok := strings.Cut(rest, "@")
	if !ok || model == "" {
		return bindIdentity{}, &topicError{topic, "has no @<model> after the address"}
	}
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return bindIdentity{}, &topicError{topic, "has no <ip>:<port> after " + bindTopicPrefix}
	}
	port, perr := strconv.Atoi(p)
	id, err := newBindIdentity(host, port, model)
	if perr != nil || err != nil {
		return bindIdentity{}, &topicError{topic, "has no <ip>:<port> after " + bindTopicPrefix}
	}
	return id, nil
}

// topicError says why a topic names no engine. The topic comes from the
// engine and may be megabytes long: the error shows at most maxShown bytes
// of it, and formats nothing until its message is asked for.
type topicError struct {
	topic   string
	problem string
}

func (e *topicError) Error() string { return fmt.Sprintf("topic %q %s", shown(e.topic), e.problem) }

// BindTopic is the topic the engine at ip whose HTTP server listens on
// port and which serves model publishes with: kv@<ip>:<port>@<model>, an
// IPv6 address in brackets.
func BindTopic(ip string, port int, model string) string {
	return bindTopicPrefix + net.JoinHostPort(ip, strconv.Itoa(port)) + "@" + model
}

// BindReceiver follows the streams of engines that dial into its bound SUB
// sockets, one socket per data-parallel rank. Each stream is kept exact as
// a ZMQClient's is: the receiver replays it from the engine's replay ROUTER
// when its engine first sends, on gaps and when it is quiet. A stream counts
// as connected from its engine's first message until it has not heard from
// its engine (a live message or a replay reply) for LivenessTimeout.
//
// One goroutine owns the bound sockets and every followed stream; Follow
// hands new streams to it and Unfollow takes them back, both through
// commands the goroutine picks up within BindConfig.PollTimeout. All
// methods are safe for concurrent use.
type BindReceiver struct {
	bound    []string // endpoints, by rank
	ctx      *zmq.Context
	liveness time.Duration
	cmds     chan func(*bindLoop)
	stop     chan struct{}
	done     chan struct{}
}

// NewBindReceiver binds cfg's endpoints and starts the receiver's
// goroutine. It fails on an invalid cfg or when an endpoint cannot be
// bound.
func NewBindReceiver(cfg BindConfig) (*BindReceiver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kvevent: %w", err)
	}
	cfg.PollTimeout = cmp.Or(cfg.PollTimeout, DefaultPollTimeout)
	cfg.MaxMessageBytes = cmp.Or(cfg.MaxMessageBytes, DefaultMaxMessageBytes)
	cfg.ReceiveBufferBytes = cmp.Or(cfg.ReceiveBufferBytes, DefaultReceiveBufferBytes)
	cfg.ReceiveHWM = cmp.Or(cfg.ReceiveHWM, max(1, cfg.ReceiveBufferBytes/cfg.MaxMessageBytes))
	cfg.LivenessTimeout = cmp.Or(cfg.LivenessTimeout, DefaultLivenessTimeout)
	cfg.ReadInterval = cmp.Or(cfg.ReadInterval, DefaultReadInterval)
	l, err := newBindLoop(cfg)
	if err != nil {
		return nil, err
	}
	r := &BindReceiver{bound: l.bound, ctx: l.ctx, liveness: cfg.LivenessTimeout,
		cmds: make(chan func(*bindLoop)), stop: make(chan struct{}), done: make(chan struct{})}
	go l.run(r)
	return r, nil
}

// do runs fn on the goroutine and returns its error.
func (r *BindReceiver) do(fn func(*bindLoop) error) error {
	result := make(chan error, 1)
	select {
	case r.cmds <- func(l *bindLoop) { result <- fn(l) }:
		return <-result
	case <-r.done:
		return errors.New("kvevent: bound receiver is closed")
	}
}

// BoundStreamConfig is one stream for BindReceiver.Follow.
type BoundStreamConfig struct {
	// Config configures the stream as it would a ZMQClient's. PodIP (an IP
	// address), EnginePort, ModelName and DPRank name the engine's
	// messages: topic kv@<PodIP>:<EnginePort>@<ModelName> on rank DPRank's
	// bound socket. Replay dials ReplayEndpoint; an empty one disables
	// replay. The receiver sets PubEndpoint to the rank's bound endpoint;
	// PubPort, RouterPort, Topic and Context are not used.
	Config *ZMQClientConfig
	// EnginePort is the port in the engine's topic: the port of its HTTP
	// server, so that the engines of one address (several per node, with
	// host networking) have identities of their own.
	EnginePort int
	// Handler receives the stream's batches, as a ZMQClient's would.
	Handler kvevent.EventHandler
}

// BoundStream is a stream a BindReceiver follows, for its statistics and
// for Unfollow.
type BoundStream struct {
	key            boundKey
	topic          string
	pubEndpoint    string
	replayEndpoint string
	obs            *observer
}

// Stats returns a snapshot of the stream's counters.
func (s *BoundStream) Stats() ClientStats { return s.obs.stats() }

// Endpoints returns the bound endpoint the stream's engine dials and the
// replay endpoint it is replayed from ("" without replay).
func (s *BoundStream) Endpoints() (pub, replay string) { return s.pubEndpoint, s.replayEndpoint }

// Topic returns the topic the stream's engine must publish with.
func (s *BoundStream) Topic() string { return s.topic }

// Follow starts following streams, all of them or, on error, none. A
// stream attaches to its engine on the engine's first message and replays
// it from the start, since the engine published before it was followed.
// A stream replaces the one followed before for the same pod and rank.
// Follow fails on an invalid config, a nil handler, a rank the receiver
// does not bind, an identity (IP, port and model) that another pod
// followed already, since its messages could belong to either, or a closed
// receiver.
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
	if err := r.do(func(l *bindLoop) error { return l.follow(entries) }); err != nil {
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
	id, idErr := newBindIdentity(cfg.PodIP, bs.EnginePort, cfg.ModelName)
	switch {
	case cfg.DPRank < 0 || cfg.DPRank >= len(r.bound):
		return nil, fmt.Errorf("kvevent: follow %s rank %d: the receiver binds %d ranks", cfg.PodKey, cfg.DPRank, len(r.bound))
	case idErr != nil:
		return nil, fmt.Errorf("kvevent: follow %s rank %d: engine identity: %w", cfg.PodKey, cfg.DPRank, idErr)
	case bs.Handler == nil:
		return nil, fmt.Errorf("kvevent: follow %s rank %d: nil handler", cfg.PodKey, cfg.DPRank)
	case r.liveness <= cfg.MaxReconnectDelay+cfg.ReplayTimeout:
		return nil, fmt.Errorf("kvevent: follow %s rank %d: LivenessTimeout %v must exceed MaxReconnectDelay %v + ReplayTimeout %v",
			cfg.PodKey, cfg.DPRank, r.liveness, cfg.MaxReconnectDelay, cfg.ReplayTimeout)
	}
	cfg.PubEndpoint, cfg.Topic, cfg.Context = r.bound[cfg.DPRank], "", r.ctx
	if err := ValidateConfig(&cfg); err != nil {
		return nil, fmt.Errorf("follow %s rank %d: %w", cfg.PodKey, cfg.DPRank, err)
	}
	pub, replay := cfg.endpoints()
	obs := newObserver(&cfg, pub)
	handler := &atomic.Pointer[handlerSet]{}
	handler.Store(newHandlerSet(bs.Handler))
	h := &BoundStream{key: boundKey{pod: cfg.PodKey, rank: cfg.DPRank}, topic: id.String(), pubEndpoint: pub,
		replayEndpoint: replay, obs: obs}
	return &boundEntry{s: newStream(&cfg, replay, obs, handler), handle: h, id: id}, nil
}

// Unfollow stops following streams and returns once none of their batches
// can reach their handlers any more.
func (r *BindReceiver) Unfollow(streams ...*BoundStream) {
	_ = r.do(func(l *bindLoop) error {
		l.unfollow(streams)
		return nil
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
