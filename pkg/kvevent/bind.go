package kvevent

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// BindTopicPrefix starts the topic of an engine that dials into a bound
// gateway: kv@<pod-ip>:<port>@<model>.
const BindTopicPrefix = "kv@"

// BindConfig makes a KVEventManager bind SUB sockets that engines dial into
// (vLLM's PUB connects when its endpoint names a host, as in
// tcp://gateway:5557) instead of dialling every pod.
//
// Each engine must publish with topic kv@<pod-ip>:<port>@<model>. The
// manager takes the pod from the topic: the eligible pod with that IP and
// model. Messages of other topics, of pods the manager does not follow, or
// of ranks beyond the pod's DP size are counted in
// kvgate_kv_event_bind_ignored_messages_total and dropped. Replay still
// dials the pod's replay ROUTER (ReplayPortAnnotation), so that a stream is
// exact from its first batch on.
//
// Choose bind mode when engines cannot be reached by the gateway (the
// gateway's address is stable, the engines' are not) or to keep one
// listening socket per rank instead of one connection per pod; choose the
// default connect mode when engines bind their PUB (vLLM's default
// tcp://*:5557), which needs nothing but the pod label.
type BindConfig struct {
	// Endpoint is the endpoint bound for rank 0, e.g. tcp://*:5557. Rank r
	// binds Endpoint offset by r (OffsetEndpointPort), because vLLM offsets
	// a connecting engine's endpoint by its rank too.
	Endpoint string
	// Ranks is how many ranks are bound: the largest DP size in the fleet
	// (1 when 0).
	Ranks int
}

func (c *BindConfig) validate() error {
	if err := validEndpoint(c.Endpoint); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	if c.Ranks < 0 || c.Ranks > MaxDPSize {
		return fmt.Errorf("bind: Ranks %d must be from 0 to %d", c.Ranks, MaxDPSize)
	}
	for r := range max(c.Ranks, 1) {
		if _, err := OffsetEndpointPort(c.Endpoint, r); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
	}
	return nil
}

// Reasons a bound socket ignores a message, in
// kvgate_kv_event_bind_ignored_messages_total.
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

// expectedBindTopic is the topic the engine of t must publish with, for
// logs: any port identifies it.
func expectedBindTopic(t PodTarget) string {
	return BindTopicPrefix + net.JoinHostPort(t.IP, "<port>") + "@" + t.Model
}

// bindFollower receives every stream on the gateway's bound SUB sockets. One
// goroutine owns the sockets and the streams' replay sockets, sequences each
// stream and calls the index.
type bindFollower struct {
	m        *KVEventManager
	zctx     *zmq.Context
	subs     []*zmq.Socket // by rank
	bound    []string      // endpoints, by rank
	cmds     chan func()
	stop     chan struct{}
	done     chan struct{}
	ignored  func(reason string)
	warnedAt map[string]time.Time // when an ignored identity was last logged

	// Owned by the goroutine.
	byAddr  map[string]PodTarget    // ip@model -> target
	streams map[StreamID]*bindState // followed streams, by identity
	poller  *zmq.Poller
	dirty   bool // the set of sockets changed: rebuild poller
	frames  [][]byte
}

// bindState is one followed stream of a bindFollower: a client that is never
// started, whose loop state (sequencer, replay socket) the bindFollower
// drives.
type bindState struct {
	c      *ZMQClient
	topic  string      // identity of the engine, once it has sent
	dealer *zmq.Socket // replay socket the poller knows
}

func newBindFollower(m *KVEventManager, zctx *zmq.Context) (*bindFollower, error) {
	b := &bindFollower{m: m, zctx: zctx, cmds: make(chan func()), stop: make(chan struct{}), done: make(chan struct{}),
		ignored: m.metrics.bindIgnored, warnedAt: map[string]time.Time{},
		byAddr: map[string]PodTarget{}, streams: map[StreamID]*bindState{}, dirty: true}
	for r := range max(m.cfg.Bind.Ranks, 1) {
		ep, _ := OffsetEndpointPort(m.cfg.Bind.Endpoint, r)
		if err := b.bind(ep); err != nil {
			b.closeSubs()
			return nil, err
		}
	}
	go b.run()
	return b, nil
}

func (b *bindFollower) bind(ep string) error {
	s, err := b.zctx.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("kvevent: bind %s: %w", ep, err)
	}
	b.subs = append(b.subs, s)
	b.bound = append(b.bound, ep)
	cfg := b.m.cfg.Client
	err = errors.Join(s.SetLinger(0), s.SetRcvhwm(cfg.ReceiveHWM), s.SetSubscribe(""))
	if err == nil && (needsIPv6(ep) || strings.Contains(ep, "::")) {
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

func (b *bindFollower) closeSubs() {
	for _, s := range b.subs {
		s.Close()
	}
	b.subs = nil
}

// do runs fn on the goroutine and waits for it.
func (b *bindFollower) do(fn func()) error {
	ran := make(chan struct{})
	select {
	case b.cmds <- func() { fn(); close(ran) }:
		<-ran
		return nil
	case <-b.done:
		return errors.New("kvevent: bound receiver is closed")
	}
}

func (b *bindFollower) follow(t PodTarget) ([]*followedStream, error) {
	if t.DPSize > len(b.subs) {
		return nil, fmt.Errorf("pod %s has %s %d but the gateway binds %d rank endpoints", t.PodKey, DPSizeAnnotation, t.DPSize, len(b.subs))
	}
	streams := make([]*followedStream, 0, t.DPSize)
	states := make([]*bindState, 0, t.DPSize)
	for rank := range t.DPSize {
		cfg := *b.m.cfg.Client
		cfg.PodKey, cfg.PodIP, cfg.ModelName, cfg.DPRank, cfg.Topic = t.PodKey, t.IP, t.Model, rank, ""
		cfg.PubEndpoint, cfg.ReplayEndpoint = b.bound[rank], ""
		if t.ReplayPort != 0 {
			cfg.ReplayEndpoint = tcpEndpoint(t.IP, t.ReplayPort+rank)
		}
		cfg.Context, cfg.Logger = b.zctx, b.m.logger
		id := t.Stream(rank)
		h := &indexHandler{index: b.m.index, stream: id, logger: b.m.logger.WithValues("pod", t.PodKey, "model", t.Model, "dpRank", rank)}
		c, err := NewZMQClient(&cfg, h)
		if err != nil {
			for _, st := range states {
				st.c.Close()
			}
			return nil, fmt.Errorf("follow %s rank %d: %w", t.PodKey, rank, err)
		}
		c.ctx = b.zctx
		states = append(states, &bindState{c: c})
		streams = append(streams, &followedStream{id: id, pubEndpoint: c.pubEndpoint, replayEndpoint: c.replayEndpoint,
			topic: expectedBindTopic(t), since: time.Now(), client: c})
	}
	err := b.do(func() {
		b.byAddr[addrKey(t.IP, t.Model)] = t
		for i, st := range states {
			b.streams[streams[i].id] = st
		}
	})
	if err != nil {
		for _, st := range states {
			st.c.Close()
		}
		return nil, err
	}
	return streams, nil
}

func (b *bindFollower) unfollow(streams []*followedStream) {
	b.do(func() {
		for _, s := range streams {
			st := b.streams[s.id]
			if st == nil {
				continue
			}
			delete(b.streams, s.id)
			if t, ok := b.byAddr[addrKey(s.client.cfg.PodIP, s.id.Model)]; ok && t.PodKey == s.id.PodKey {
				delete(b.byAddr, addrKey(t.IP, t.Model))
			}
			st.c.loop.close()
			b.dirty = true
		}
	})
	for _, s := range streams {
		s.client.Close()
	}
}

// close stops the goroutine and closes the bound sockets; Stop has
// unfollowed every stream before.
func (b *bindFollower) close() {
	close(b.stop)
	<-b.done
}

func addrKey(ip, model string) string {
	if p := net.ParseIP(ip); p != nil {
		ip = p.String()
	}
	return ip + "@" + model
}

// run is the bound receiver's goroutine.
func (b *bindFollower) run() {
	defer close(b.done)
	defer b.closeSubs()
	for {
		select {
		case <-b.stop:
			return
		case cmd := <-b.cmds:
			cmd()
			continue
		default:
		}
		b.poll()
	}
}

// poll waits for the sockets once and services what is ready, then the
// streams' timers.
func (b *bindFollower) poll() {
	if b.dirty {
		b.rebuildPoller()
	}
	wait := b.m.cfg.Client.PollTimeout
	for _, st := range b.streams {
		if st.topic != "" {
			wait = st.c.loop.timerWait(wait)
		}
	}
	ready, err := b.poller.Poll(wait)
	if err != nil {
		if zmq.AsErrno(err) != zmq.Errno(syscall.EINTR) {
			b.m.logger.Error(err, "Polling the bound KV event sockets failed")
			time.Sleep(b.m.cfg.Client.PollTimeout)
		}
		return
	}
	for _, p := range ready {
		if rank := b.subRank(p.Socket); rank >= 0 {
			b.drainLive(rank)
			continue
		}
		for _, st := range b.streams {
			if st.dealer == p.Socket && st.c.loop.dealer != nil {
				st.c.loop.drainReplies()
				b.track(st)
			}
		}
	}
	now := time.Now()
	for _, st := range b.streams {
		if st.topic != "" {
			st.c.loop.runTimers(now)
			b.track(st)
		}
	}
}

func (b *bindFollower) subRank(s *zmq.Socket) int {
	for r, sub := range b.subs {
		if sub == s {
			return r
		}
	}
	return -1
}

// track notices a stream whose replay socket was replaced.
func (b *bindFollower) track(st *bindState) {
	if st.c.loop.dealer != st.dealer {
		st.dealer = st.c.loop.dealer
		b.dirty = true
	}
}

func (b *bindFollower) rebuildPoller() {
	b.poller = zmq.NewPoller()
	for _, s := range b.subs {
		b.poller.Add(s, zmq.POLLIN)
	}
	for _, st := range b.streams {
		if st.dealer != nil {
			b.poller.Add(st.dealer, zmq.POLLIN)
		}
	}
	b.dirty = false
}
