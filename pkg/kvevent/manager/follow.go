package manager

import (
	"fmt"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

// follower starts and stops the streams of pods: dialling each pod, or
// receiving from engines that dial in.
type follower interface {
	// follow starts the streams of t and returns them.
	follow(t PodTarget) ([]*followedStream, error)
	// unfollow stops streams and returns once none of their batches can
	// reach the index any more.
	unfollow(streams []*followedStream)
}

// closer is implemented by followers that own resources beyond their
// streams; Stop closes them after unfollowing every stream.
type closer interface{ close() }

// followedStream is one stream the manager follows.
type followedStream struct {
	id             kvevent.StreamID
	pubEndpoint    string
	replayEndpoint string
	// topic is the SUB filter of a dialled stream, or the topic a bound
	// stream expects its engine to publish with.
	topic string
	since time.Time
	// stats reads the stream's counters: a *transport.ZMQClient dialling
	// the pod, or a *transport.BoundStream of the bound receiver.
	stats interface{ Stats() transport.ClientStats }
}

// streamConfig returns the configuration of rank's stream of t, from the
// manager's client template.
func (m *KVEventManager) streamConfig(t PodTarget, rank int, zctx *zmq.Context) *transport.ZMQClientConfig {
	cfg := *m.cfg.Client
	cfg.PodKey, cfg.PodIP, cfg.ModelName = t.PodKey, t.IP, t.Model
	cfg.PubPort, cfg.RouterPort, cfg.DPRank, cfg.Topic = t.PubPort, t.ReplayPort, rank, t.Topic
	cfg.PubEndpoint, cfg.ReplayEndpoint = "", ""
	cfg.Context = zctx
	cfg.Logger = m.logger
	return &cfg
}

// handler returns the handler delivering rank's stream of t to the index.
func (m *KVEventManager) handler(t PodTarget, rank int) *indexHandler {
	return &indexHandler{index: m.index, stream: t.streamID(rank),
		logger: m.logger.WithValues("pod", t.PodKey, "model", t.Model, "dpRank", rank)}
}

// clientFollower follows each stream with a ZMQClient dialling the pod.
type clientFollower struct {
	m    *KVEventManager
	zctx *zmq.Context
}

func (f *clientFollower) follow(t PodTarget) ([]*followedStream, error) {
	streams := make([]*followedStream, 0, t.DPSize)
	for rank := t.FirstRank; rank <= t.lastRank(); rank++ {
		s, err := f.start(t, rank)
		if err != nil {
			f.unfollow(streams)
			return nil, err
		}
		streams = append(streams, s)
	}
	return streams, nil
}

func (f *clientFollower) start(t PodTarget, rank int) (*followedStream, error) {
	cfg := f.m.streamConfig(t, rank, f.zctx)
	c, err := transport.NewZMQClient(cfg, f.m.handler(t, rank))
	if err != nil {
		return nil, fmt.Errorf("follow %s rank %d: %w", t.PodKey, rank, err)
	}
	if err := c.Start(); err != nil {
		c.Close()
		return nil, fmt.Errorf("follow %s rank %d: %w", t.PodKey, rank, err)
	}
	pub, replay := c.Endpoints()
	return &followedStream{id: t.streamID(rank), pubEndpoint: pub, replayEndpoint: replay, topic: cfg.Topic,
		since: time.Now(), stats: c}, nil
}

// unfollow closes the clients all at once: each takes up to a poll
// timeout to notice.
func (f *clientFollower) unfollow(streams []*followedStream) {
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Go(s.stats.(*transport.ZMQClient).Close)
	}
	wg.Wait()
}

// bindFollower follows the streams of engines that dial into the gateway's
// bound sockets, through one transport.BindReceiver.
type bindFollower struct {
	m     *KVEventManager
	ranks int
	r     *transport.BindReceiver
}

func newBindFollower(m *KVEventManager, zctx *zmq.Context) (*bindFollower, error) {
	cfg := *m.cfg.Bind
	cfg.Context, cfg.Logger, cfg.Ignored = zctx, m.logger, m.metrics.bindIgnored
	cfg.PollTimeout, cfg.MaxMessageBytes, cfg.ReceiveBufferBytes = m.cfg.Client.PollTimeout, m.cfg.Client.MaxMessageBytes,
		m.cfg.Client.ReceiveBufferBytes
	r, err := transport.NewBindReceiver(cfg)
	if err != nil {
		return nil, err
	}
	return &bindFollower{m: m, ranks: max(cfg.Ranks, 1), r: r}, nil
}

func (f *bindFollower) follow(t PodTarget) ([]*followedStream, error) {
	if t.lastRank() >= f.ranks {
		return nil, fmt.Errorf("pod %s has ranks %d to %d (%s %d, %s %d) but the gateway binds %d rank endpoints",
			t.PodKey, t.FirstRank, t.lastRank(), endpoint.DPStartRankAnnotation, t.FirstRank, endpoint.DPSizeAnnotation, t.DPSize, f.ranks)
	}
	specs := make([]transport.BoundStreamConfig, t.DPSize)
	for i := range specs {
		rank := t.FirstRank + i
		cfg := f.m.streamConfig(t, rank, nil)
		if t.ReplayPort != 0 {
			cfg.ReplayEndpoint = zmqwire.TCPEndpoint(t.IP, t.ReplayPort+rank)
		}
		specs[i] = transport.BoundStreamConfig{Config: cfg, EnginePort: t.EnginePort, Handler: f.m.handler(t, rank)}
	}
	bound, err := f.r.Follow(specs...)
	if err != nil {
		return nil, err
	}
	streams := make([]*followedStream, len(bound))
	for i, b := range bound {
		pub, replay := b.Endpoints()
		streams[i] = &followedStream{id: t.streamID(t.FirstRank + i), pubEndpoint: pub, replayEndpoint: replay,
			topic: b.Topic(), since: time.Now(), stats: b}
	}
	return streams, nil
}

func (f *bindFollower) unfollow(streams []*followedStream) {
	bound := make([]*transport.BoundStream, len(streams))
	for i, s := range streams {
		bound[i] = s.stats.(*transport.BoundStream)
	}
	f.r.Unfollow(bound...)
}

// close closes the bound receiver; Stop has unfollowed every stream before.
func (f *bindFollower) close() { f.r.Close() }
