package manager

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

// Defaults of a ManagerConfig's zero fields.
const (
	// DefaultManagerWorkers is how many pods a manager reconciles at once.
	DefaultManagerWorkers = 4
	// DefaultMaxSockets is the ZeroMQ socket limit of the manager's shared
	// context. A followed stream uses up to four sockets (SUB, its monitor
	// pair, replay DEALER); libzmq's own default of 1023 would cap a
	// gateway at some 250 streams.
	DefaultMaxSockets = 32768
)

// ManagerConfig configures a KVEventManager.
type ManagerConfig struct {
	// Index receives the batches of every followed stream. Required.
	Index kvevent.KVIndex
	// Streams holds the ports and topic of pods that do not override them
	// (see the kvgate.io annotations). The zero value means
	// DefaultStreamDefaults.
	Streams StreamDefaults
	// Client is the template of every stream's configuration: timeouts,
	// heartbeats, buffers. The manager sets the stream's pod, address,
	// ports, rank, topic, context, metrics and logger. Nil means
	// DefaultZMQClientConfig.
	Client *transport.ZMQClientConfig
	// Bind, when set, makes the gateway bind SUB sockets that engines
	// dial into, instead of dialling each pod (see transport.BindConfig).
	// Each engine publishes with topic kv@<pod-ip>:<port>@<model>, port
	// being its HTTP port (endpoint.ModelPortLabel): the manager takes the pod
	// from the topic, the eligible pod with that IP, port and model, and
	// by default only from a message that comes from that IP. Messages of
	// other topics, of other addresses, of pods the manager does not
	// follow, or of ranks beyond the pod's DP size are counted in
	// kvgate_kv_event_bind_ignored_messages_total and dropped; a pod whose
	// identity another followed pod has is not followed (state failed).
	// Replay still dials the pod's replay ROUTER
	// (endpoint.ReplayPortAnnotation), so that a stream is exact from its
	// first batch on. Endpoint, Ranks (at most endpoint.MaxDPSize),
	// AllowAnyPeer and LivenessTimeout are the manager's to read; it sets
	// the receiver's context, logger and Ignored hook, and takes the bound
	// sockets' MaxMessageBytes, ReceiveBufferBytes and PollTimeout from
	// Client.
	//
	// Choose bind mode when engines cannot be reached by the gateway (the
	// gateway's address is stable, the engines' are not) or to keep one
	// listening socket per rank instead of one connection per pod; choose
	// the default connect mode when engines bind their PUB (vLLM's default
	// tcp://*:5557), which needs nothing but the pod label.
	Bind *transport.BindConfig
	// DeadPodTimeout is how long a followed pod may go with none of its
	// streams connected (a dialled stream's connection down, a bound
	// stream's engine unheard for Bind.LivenessTimeout) and, with
	// LastScraped, no successful metrics scrape, before it counts as dead
	// (DefaultDeadPodTimeout when 0). A dead pod is purged from the index
	// once, within DeadPodTimeout and a tenth of it (at most a second) of
	// the moment both signals stopped, and its streams are restarted, so
	// that the engine, should it come back, is rebuilt from its first
	// batch. Either signal alone keeps a pod's blocks: streams that stop
	// while scrapes succeed are a quiet engine or one that publishes no
	// events, scrapes that fail while a stream is connected are trouble
	// with the metrics port.
	DeadPodTimeout time.Duration
	// LastScraped, when set, tells when a pod's metrics were last scraped
	// successfully, the zero time if never (the gateway passes the Store's
	// PodLastScraped). It is called from the manager's liveness check, never
	// with a lock of the manager held, and must not block. Nil judges pods
	// by their streams alone.
	LastScraped func(pod endpoint.Key) time.Time
	// Workers is how many pods are reconciled at once
	// (DefaultManagerWorkers when 0).
	Workers int
	// MaxSockets and IOThreads configure the shared ZeroMQ context
	// (DefaultMaxSockets and 1 when 0).
	MaxSockets int
	IOThreads  int
	// Registerer receives the manager's metrics (kvgate_kv_event_*) and its
	// clients' (aibrix_kvcache_zmq_*); nil registers none.
	Registerer prometheus.Registerer
	// Logger receives the manager's logs (klog's global logger when zero).
	Logger klog.Logger
}

// KVEventManager follows the KV-event streams of every eligible vLLM pod
// and keeps a kvevent.KVIndex up to date with them. It is built like a Kubernetes
// controller: OnPodAdd, OnPodUpdate and OnPodDelete record the pod and
// queue its key, without I/O and without blocking; workers reconcile each
// queued pod, comparing the streams it should have (TargetForPod, one per
// data-parallel rank) with the ones it has, and start, stop or restart them.
// A reconcile that fails is retried with a rate-limited backoff; reconciles
// are idempotent, so a missed or repeated event heals itself.
//
// Whenever a pod's streams stop (deleted, terminating, no longer Running,
// relabelled, address or ports changed, dead), the pod is purged from the
// index before new streams start. A stream's client rebuilds the stream
// through replay and tells the index to reset the stream when its engine
// restarted or batches were lost for good.
//
// Between Start and Stop a liveness check judges every followed pod once
// per tenth of DeadPodTimeout (at most a second): a pod whose streams are
// all disconnected and whose metrics scrapes all failed for
// DeadPodTimeout is dead, and is queued for its worker to purge it from the
// index and restart its streams, once per death (see PodLiveness).
//
// All methods are safe for concurrent use.
type KVEventManager struct {
	cfg     ManagerConfig
	index   kvevent.KVIndex
	logger  klog.Logger
	queue   workqueue.TypedRateLimitingInterface[string]
	metrics *managerMetrics

	mu     sync.Mutex
	pods   map[string]*v1.Pod    // latest version of every pod the manager was told about
	states map[string]*podStatus // reconciled state, by pod key
	// liveness is each followed pod's liveness as last judged, by pod
	// key; restarts holds the dead pods whose next reconcile purges them
	// and restarts their streams.
	liveness map[string]*podLiveness
	restarts map[string]struct{}

	lifecycle sync.Mutex // guards started, follower, zctx
	started   bool
	follower  follower
	zctx      *zmq.Context
	stopping  atomic.Bool
	stopOnce  sync.Once
	workers   sync.WaitGroup
	// stopLiveness ends the liveness check, which closes livenessDone.
	stopLiveness chan struct{}
	livenessDone chan struct{}
}

// NewKVEventManager returns a manager configured by cfg. It does nothing
// until Start, but records the pods it is told about from the start. It
// fails when cfg has no Index, invalid stream defaults or client template,
// or its metrics cannot be registered.
func NewKVEventManager(cfg ManagerConfig) (*KVEventManager, error) {
	if cfg.Index == nil {
		return nil, errors.New("kvevent: KV event manager needs an Index")
	}
	if cfg.Streams == (StreamDefaults{}) {
		cfg.Streams = DefaultStreamDefaults()
	}
	if err := cfg.Streams.validate(); err != nil {
		return nil, fmt.Errorf("kvevent: KV event manager: %w", err)
	}
	if cfg.Client == nil {
		cfg.Client = transport.DefaultZMQClientConfig("", "", "")
	}
	probe := *cfg.Client
	probe.PodKey, probe.PodIP, probe.PubPort, probe.RouterPort, probe.PubEndpoint, probe.ReplayEndpoint = "template", "127.0.0.1", 1, 0, "", ""
	if err := transport.ValidateConfig(&probe); err != nil {
		return nil, fmt.Errorf("kvevent: KV event manager client template: %w", err)
	}
	if cfg.Bind != nil {
		if err := cfg.Bind.Validate(); err != nil {
			return nil, fmt.Errorf("kvevent: KV event manager: %w", err)
		}
		if cfg.Bind.Ranks > endpoint.MaxDPSize {
			return nil, fmt.Errorf("kvevent: KV event manager: bind: Ranks %d must be from 0 to %d", cfg.Bind.Ranks, endpoint.MaxDPSize)
		}
		quiet := cfg.Client.MaxReconnectDelay + cfg.Client.ReplayTimeout
		if live := cmp.Or(cfg.Bind.LivenessTimeout, transport.DefaultLivenessTimeout); live <= quiet {
			return nil, fmt.Errorf("kvevent: KV event manager: bind: LivenessTimeout %v must exceed %v, the longest a quiet "+
				"engine goes unheard between two replay probes (MaxReconnectDelay + ReplayTimeout)", live, quiet)
		}
	}
	if cfg.DeadPodTimeout < 0 {
		return nil, fmt.Errorf("kvevent: KV event manager: DeadPodTimeout %v must not be negative", cfg.DeadPodTimeout)
	}
	cfg.DeadPodTimeout = cmp.Or(cfg.DeadPodTimeout, DefaultDeadPodTimeout)
	cfg.Workers = cmp.Or(cfg.Workers, DefaultManagerWorkers)
	cfg.MaxSockets = cmp.Or(cfg.MaxSockets, DefaultMaxSockets)
	cfg.IOThreads = cmp.Or(cfg.IOThreads, 1)
	if cfg.Workers < 0 || cfg.MaxSockets < 0 || cfg.IOThreads < 0 {
		return nil, fmt.Errorf("kvevent: KV event manager: Workers %d, MaxSockets %d and IOThreads %d must not be negative",
			cfg.Workers, cfg.MaxSockets, cfg.IOThreads)
	}
	m := &KVEventManager{
		cfg:      cfg,
		index:    cfg.Index,
		logger:   cfg.Logger,
		pods:     map[string]*v1.Pod{},
		states:   map[string]*podStatus{},
		liveness: map[string]*podLiveness{},
		restarts: map[string]struct{}{},
	}
	if m.logger.GetSink() == nil {
		m.logger = klog.Background()
	}
	m.logger = m.logger.WithName("kv-event-manager")
	m.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "kv_event_manager"})
	var err error
	if m.metrics, err = newManagerMetrics(cfg.Registerer, m); err != nil {
		m.queue.ShutDown()
		return nil, err
	}
	if cfg.Registerer != nil && cfg.Client.Metrics == nil {
		if cfg.Client.Metrics, err = transport.NewKVCacheMetrics(cfg.Registerer); err != nil {
			m.metrics.unregister()
			m.queue.ShutDown()
			return nil, err
		}
	}
	return m, nil
}

// Start creates the shared ZeroMQ context (and, in bind mode, binds the
// gateway's sockets) and starts the workers, which reconcile every pod the
// manager has been told about. It fails when called twice, after Stop, or
// when the context or the bound sockets cannot be set up.
func (m *KVEventManager) Start() error {
	m.lifecycle.Lock()
	defer m.lifecycle.Unlock()
	switch {
	case m.stopping.Load():
		return errors.New("kvevent: KV event manager is stopped")
	case m.started:
		return errors.New("kvevent: KV event manager is already started")
	}
	zctx, err := m.newContext()
	if err != nil {
		return err
	}
	var f follower
	if m.cfg.Bind != nil {
		f, err = newBindFollower(m, zctx)
	} else {
		f = &clientFollower{m: m, zctx: zctx}
	}
	if err != nil {
		if terr := zctx.Term(); terr != nil {
			m.logger.Error(terr, "Terminating the ZeroMQ context failed")
		}
		return err
	}
	m.zctx, m.follower, m.started = zctx, f, true
	m.stopLiveness, m.livenessDone = make(chan struct{}), make(chan struct{})
	go m.runLiveness(m.stopLiveness, m.livenessDone)
	for range m.cfg.Workers {
		m.workers.Add(1)
		go func() {
			defer m.workers.Done()
			for m.processNext() {
			}
		}()
	}
	if b := m.cfg.Bind; b != nil {
		m.logger.Info("Started KV event manager", "workers", m.cfg.Workers, "mode", m.mode(), "bindEndpoint", b.Endpoint,
			"bindRanks", max(b.Ranks, 1), "replayPort", m.cfg.Streams.ReplayPort, "deadPodTimeout", m.cfg.DeadPodTimeout)
	} else {
		m.logger.Info("Started KV event manager", "workers", m.cfg.Workers, "mode", m.mode(),
			"pubPort", m.cfg.Streams.PubPort, "replayPort", m.cfg.Streams.ReplayPort, "topic", m.cfg.Streams.Topic,
			"deadPodTimeout", m.cfg.DeadPodTimeout)
	}
	return nil
}

// mode names how the manager follows streams, for logs: "bind" when engines
// dial into the gateway's bound sockets, else "connect".
func (m *KVEventManager) mode() string {
	if m.cfg.Bind != nil {
		return "bind"
	}
	return "connect"
}

func (m *KVEventManager) newContext() (*zmq.Context, error) {
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("kvevent: KV event manager: create ZeroMQ context: %w", err)
	}
	if err := errors.Join(zctx.SetMaxSockets(m.cfg.MaxSockets), zctx.SetIoThreads(m.cfg.IOThreads)); err != nil {
		zctx.Term()
		return nil, fmt.Errorf("kvevent: KV event manager: configure ZeroMQ context (MaxSockets %d, IOThreads %d): %w",
			m.cfg.MaxSockets, m.cfg.IOThreads, err)
	}
	return zctx, nil
}

// Stop stops the liveness check and the workers, stops every stream (all
// at once), purges the followed pods from the index, terminates the ZeroMQ
// context and unregisters the metrics. It returns once all of it is done; pods queued
// but not yet reconciled are dropped. Stop is idempotent; a stopped manager
// cannot be started again.
func (m *KVEventManager) Stop() {
	m.stopOnce.Do(func() {
		m.lifecycle.Lock()
		defer m.lifecycle.Unlock()
		m.stopping.Store(true)
		if m.stopLiveness != nil {
			close(m.stopLiveness)
			<-m.livenessDone
		}
		m.queue.ShutDown()
		m.workers.Wait()
		m.mu.Lock()
		states := m.states
		m.states = map[string]*podStatus{}
		m.mu.Unlock()
		var all []*followedStream
		for _, st := range states {
			all = append(all, st.streams...)
		}
		if m.follower != nil {
			m.follower.unfollow(all)
			if c, ok := m.follower.(closer); ok {
				c.close()
			}
		}
		for key, st := range states {
			if len(st.streams) > 0 {
				m.index.PurgePod(key)
			}
		}
		if m.zctx != nil {
			if err := m.zctx.Term(); err != nil {
				m.logger.Error(err, "Terminating the ZeroMQ context failed")
			}
		}
		m.metrics.unregister()
		m.logger.Info("Stopped KV event manager", "streams", len(all))
	})
}

// OnPodAdd records a pod and queues it for reconciliation.
func (m *KVEventManager) OnPodAdd(pod *v1.Pod) { m.record(pod) }

// OnPodUpdate records the new version of a pod and queues it for
// reconciliation.
func (m *KVEventManager) OnPodUpdate(_, newPod *v1.Pod) { m.record(newPod) }

// OnPodDelete forgets a pod and queues it, so that its streams stop and it
// is purged from the index.
func (m *KVEventManager) OnPodDelete(pod *v1.Pod) {
	key := endpoint.KeyOf(pod).String()
	m.mu.Lock()
	delete(m.pods, key)
	m.mu.Unlock()
	m.queue.Add(key)
}

func (m *KVEventManager) record(pod *v1.Pod) {
	key := endpoint.KeyOf(pod).String()
	m.mu.Lock()
	m.pods[key] = pod
	m.mu.Unlock()
	m.queue.Add(key)
}

// processNext reconciles one queued pod; it returns false once the queue
// is shut down.
func (m *KVEventManager) processNext() bool {
	key, shutdown := m.queue.Get()
	if shutdown {
		return false
	}
	defer m.queue.Done(key)
	if m.stopping.Load() {
		return true
	}
	if err := m.reconcile(key); err != nil {
		m.metrics.reconciles.WithLabelValues("error").Inc()
		m.logger.Error(err, "Reconciling KV event streams failed, retrying", "pod", key,
			"retries", m.queue.NumRequeues(key))
		m.queue.AddRateLimited(key)
		return true
	}
	m.metrics.reconciles.WithLabelValues("ok").Inc()
	m.queue.Forget(key)
	return true
}
