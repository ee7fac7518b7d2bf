package transport

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	zmq "github.com/pebbe/zmq4"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// Defaults of a ZMQClientConfig.
const (
	// DefaultPubPort is the port of rank 0's PUB socket in vLLM's
	// documented setup; rank r uses DefaultPubPort+r.
	DefaultPubPort = 5557
	// DefaultRouterPort is the port of rank 0's replay ROUTER in vLLM's
	// documented setup; rank r uses DefaultRouterPort+r. (These two port
	// ranges collide as soon as an engine runs two data-parallel ranks:
	// such fleets must configure ports spaced at least dp_size apart.)
	DefaultRouterPort = 5558
	// DefaultPollTimeout bounds how long the client waits on its sockets
	// before it looks at its commands and timers again.
	DefaultPollTimeout = 100 * time.Millisecond
	// DefaultReplayTimeout is how long a replay may stay silent before it
	// counts as failed.
	DefaultReplayTimeout = 5 * time.Second
	// DefaultReconnectInterval is the first delay before reconnecting.
	DefaultReconnectInterval = 1 * time.Second
	// MaxReconnectInterval caps the reconnect delay.
	MaxReconnectInterval = 30 * time.Second
	// ReconnectBackoffFactor multiplies the delay after every failed
	// attempt. libzmq doubles its reconnect interval natively; the client
	// backs off replay retries the same way.
	ReconnectBackoffFactor = 2.0
	// DefaultConnectTimeout bounds a TCP connect to an unresponsive address.
	DefaultConnectTimeout = 5 * time.Second
	// DefaultHeartbeatInterval, DefaultHeartbeatTimeout and
	// DefaultHeartbeatTTL configure the ZMTP heartbeats that detect a dead
	// or unreachable engine while it sends nothing (vLLM is silent when
	// idle).
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultHeartbeatTimeout  = 15 * time.Second
	DefaultHeartbeatTTL      = 30 * time.Second
	// DefaultMaxPendingBatches bounds the live batches a client buffers
	// while it replays a gap: vLLM's default replay buffer length.
	DefaultMaxPendingBatches = 10000
	// DefaultReceiveHWM is the SUB socket's receive high-water mark in
	// messages: vLLM's default PUB high-water mark.
	DefaultReceiveHWM = 100000

	// DefaultMaxMessageBytes bounds one frame an engine may send. It is
	// sized from the largest batch a vLLM step plausibly publishes: a
	// 128k-token prefill at block size 16 is one BlockStored of 8192
	// block hashes (9 bytes each as integers, 34 as digests) and 131072
	// token ids (up to 5 bytes each with a vocabulary above 65536), plus
	// extra_keys: 0.7 to 1.1 MiB. 16 MiB leaves room for a dozen such
	// prefills in one step, or one prefill of some 1.5M tokens.
	DefaultMaxMessageBytes = 16 << 20
	// DefaultReceiveBufferBytes bounds what a stream has read and not yet
	// applied, for its live messages and, separately, its replay
	// replies: four messages of DefaultMaxMessageBytes, or some 60
	// 128k-token prefills. A vLLM engine publishes far less per second
	// than a stream applies, so the bound only comes into play when the
	// stream falls behind an engine that floods it.
	DefaultReceiveBufferBytes = 64 << 20
	// DefaultMaxPendingBytes bounds the payload bytes of the live batches
	// a stream buffers while it replays a gap.
	DefaultMaxPendingBytes = 64 << 20
	// DefaultMaxReplayBatches bounds the replies of one replay: twice
	// vLLM's default replay buffer (buffer_steps, 10000 batches).
	DefaultMaxReplayBatches = 20000
	// DefaultMaxReplayDuration bounds one replay from its request to its
	// end marker. A replay of vLLM's whole default buffer takes well under
	// a second on a cluster network.
	DefaultMaxReplayDuration = 60 * time.Second
	// DefaultMaxResets and DefaultResetWindow bound how often a stream may
	// reset before it is suspended: an engine restart resets a stream
	// once, a loss of batches once per gap.
	DefaultMaxResets   = 5
	DefaultResetWindow = time.Minute
)

// ZMQClientConfig configures a ZMQClient: which engine stream to follow, and
// how. Build one with DefaultZMQClientConfig and adjust it; ValidateConfig
// explains what it rejects.
type ZMQClientConfig struct {
	// PodKey identifies the engine's pod ("namespace/name") in logs,
	// metrics and resets.
	PodKey string
	// PodIP is the address of the engine; an IPv6 address is bracketed
	// when the endpoints are built.
	PodIP string
	// ModelName is the engine's model, for logs.
	ModelName string
	// PubPort and RouterPort are rank 0's PUB and replay ROUTER ports; the
	// client dials PubPort+DPRank and RouterPort+DPRank. RouterPort 0
	// disables replay.
	PubPort    int
	RouterPort int
	// DPRank is the data-parallel rank of the stream.
	DPRank int
	// Topic is the SUB prefix filter. vLLM's default topic is "", which
	// matches every message.
	Topic string

	// PubEndpoint and ReplayEndpoint, when set, are dialled exactly as
	// given instead of the endpoints built from PodIP, the ports and
	// DPRank. With PubEndpoint set, replay uses ReplayEndpoint and is
	// disabled when it is empty.
	PubEndpoint    string
	ReplayEndpoint string

	// PollTimeout bounds how long a command (Stop, Reconnect, ReplayFrom...)
	// may wait for the client's goroutine.
	PollTimeout time.Duration
	// ReplayTimeout is how long a replay may stay silent before it fails.
	ReplayTimeout time.Duration
	// ReconnectDelay and MaxReconnectDelay bound libzmq's reconnect
	// backoff (doubling each attempt) and the client's backoff between
	// failed replays.
	ReconnectDelay    time.Duration
	MaxReconnectDelay time.Duration
	// ConnectTimeout bounds one TCP connect attempt; 0 leaves it to the
	// operating system.
	ConnectTimeout time.Duration
	// HeartbeatInterval, HeartbeatTimeout and HeartbeatTTL set ZMTP
	// heartbeats on the SUB connection: a PING every interval, the
	// connection dropped (and re-dialled) when nothing arrives within the
	// timeout, the peer told to drop it after the TTL. An interval of 0
	// disables heartbeats.
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration
	HeartbeatTTL      time.Duration
	// MaxPendingBatches and MaxPendingBytes bound the live batches
	// buffered while a gap is replayed, in number and in payload bytes;
	// overflowing either makes the gap unrecoverable.
	MaxPendingBatches int
	MaxPendingBytes   int
	// ReceiveHWM is the SUB socket's receive high-water mark in messages;
	// 0 means no limit. The stream reads its sockets as soon as they are
	// readable, or ReadInterval after its last read, so what ZeroMQ queues
	// stays small and the bytes waiting are bounded by ReceiveBufferBytes
	// instead.
	ReceiveHWM int
	// MaxMessageBytes bounds one frame of a live message or a replay
	// reply (ZeroMQ's ZMQ_MAXMSGSIZE): an engine that sends a larger one
	// is disconnected by ZeroMQ, which shows as a disconnection (and a
	// replay as failed), and the batch is lost.
	MaxMessageBytes int
	// ReceiveBufferBytes bounds the bytes a stream has read and not yet
	// applied, for its live messages and, separately, its replay
	// replies; it must hold at least one message of MaxMessageBytes. A
	// live message that does not fit is dropped and replayed later, like
	// one the engine's PUB dropped; a replay whose replies do not fit is
	// cut short and the rest replayed again.
	ReceiveBufferBytes int
	// MaxReplayBatches and MaxReplayDuration bound one replay: its replies,
	// and the time from its request to its end marker. A replay beyond
	// either is cut short: what it delivered stands, and the rest is
	// replayed again.
	MaxReplayBatches  int
	MaxReplayDuration time.Duration
	// MaxResets and ResetWindow bound how often a stream may reset
	// (publisher restarts and unrecoverable gaps): one that resets more
	// than MaxResets times within ResetWindow is suspended, ignoring its
	// engine for ReconnectDelay, doubling up to MaxReconnectDelay while
	// it keeps resetting, then resynchronised through replay. MaxResets 0
	// disables the bound.
	MaxResets   int
	ResetWindow time.Duration
	// ReadInterval is the least time between two reads of the live
	// socket while the engine keeps sending, at most MaxReadInterval; 0
	// reads every message as it comes. A message that arrives within the
	// interval after a read that found messages waits out the rest of it
	// and is read with those that came meanwhile: an engine that publishes
	// every few milliseconds has its batches read a few at a time, one
	// wake-up of the client for several, which costs this process about a
	// third less CPU a batch at a batch every 2 ms (BenchmarkPacedBatches).
	// A message that comes later is read at once, and the client does not
	// wait while its stream has more than it applied in its time slice or
	// after a read that stopped at its limit of 1,024 messages.
	ReadInterval time.Duration

	// Context is the ZeroMQ context of the client's sockets. When nil the
	// client creates its own and terminates it on Close. A shared context
	// saves two OS threads per client; its owner terminates it after
	// closing every client.
	Context *zmq.Context
	// Metrics receives the client's Prometheus metrics. When nil the client
	// exports none; GetStats and Stats work either way.
	Metrics *KVCacheMetrics
	// Logger receives the stream's logs, to which the client adds the pod,
	// model and rank: errors, and at verbosity 0 connection changes,
	// resets and topic mismatches; at verbosity 4 dialling, redials and
	// replay requests; at verbosity 5 every delivered batch. A logger's
	// V(n) shifts them all by n. The zero value logs through klog's global
	// logger.
	Logger klog.Logger
}

// DefaultZMQClientConfig returns the configuration of a client that follows
// rank 0 of the vLLM engine at podIP on the default ports, with replay.
func DefaultZMQClientConfig(podKey, podIP, modelName string) *ZMQClientConfig {
	return &ZMQClientConfig{
		PodKey:             podKey,
		PodIP:              podIP,
		ModelName:          modelName,
		PubPort:            DefaultPubPort,
		RouterPort:         DefaultRouterPort,
		PollTimeout:        DefaultPollTimeout,
		ReplayTimeout:      DefaultReplayTimeout,
		ReconnectDelay:     DefaultReconnectInterval,
		MaxReconnectDelay:  MaxReconnectInterval,
		ConnectTimeout:     DefaultConnectTimeout,
		HeartbeatInterval:  DefaultHeartbeatInterval,
		HeartbeatTimeout:   DefaultHeartbeatTimeout,
		HeartbeatTTL:       DefaultHeartbeatTTL,
		MaxPendingBatches:  DefaultMaxPendingBatches,
		MaxPendingBytes:    DefaultMaxPendingBytes,
		ReceiveHWM:         DefaultReceiveHWM,
		ReadInterval:       DefaultReadInterval,
		MaxMessageBytes:    DefaultMaxMessageBytes,
		ReceiveBufferBytes: DefaultReceiveBufferBytes,
		MaxReplayBatches:   DefaultMaxReplayBatches,
		MaxReplayDuration:  DefaultMaxReplayDuration,
		MaxResets:          DefaultMaxResets,
		ResetWindow:        DefaultResetWindow,
	}
}

// ValidateConfig reports every problem of config in one error, or nil when
// a client can run with it.
func ValidateConfig(config *ZMQClientConfig) error {
	if config == nil {
		return errors.New("kvevent: nil ZMQClientConfig")
	}
	c := config
	var errs []error
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.PodKey == "", "PodKey is empty")
	check(c.DPRank < 0, "DPRank %d is negative", c.DPRank)
	if c.PubEndpoint != "" {
		if err := zmqwire.ValidEndpoint(c.PubEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("PubEndpoint: %w", err))
		}
	} else {
		check(!validHost(c.PodIP), "PodIP %q is neither an IP address nor a host name", c.PodIP)
		check(c.PubPort < 1 || c.PubPort+c.DPRank > 65535, "PubPort %d with DPRank %d is not a valid port", c.PubPort, c.DPRank)
	}
	if c.ReplayEndpoint != "" {
		if err := zmqwire.ValidEndpoint(c.ReplayEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("ReplayEndpoint: %w", err))
		}
	} else if c.PubEndpoint == "" {
		check(c.RouterPort < 0 || c.RouterPort+c.DPRank > 65535, "RouterPort %d with DPRank %d is not a valid port", c.RouterPort, c.DPRank)
	}
	check(c.PollTimeout <= 0, "PollTimeout %v must be positive", c.PollTimeout)
	check(c.ReplayTimeout <= 0, "ReplayTimeout %v must be positive", c.ReplayTimeout)
	check(c.ReconnectDelay <= 0, "ReconnectDelay %v must be positive", c.ReconnectDelay)
	check(c.MaxReconnectDelay < c.ReconnectDelay, "MaxReconnectDelay %v is below ReconnectDelay %v", c.MaxReconnectDelay, c.ReconnectDelay)
	check(c.ConnectTimeout < 0, "ConnectTimeout %v is negative", c.ConnectTimeout)
	check(c.HeartbeatInterval < 0, "HeartbeatInterval %v is negative", c.HeartbeatInterval)
	check(c.HeartbeatInterval > 0 && c.HeartbeatTimeout < c.HeartbeatInterval,
		"HeartbeatTimeout %v is below HeartbeatInterval %v", c.HeartbeatTimeout, c.HeartbeatInterval)
	check(c.HeartbeatTTL < 0, "HeartbeatTTL %v is negative", c.HeartbeatTTL)
	check(c.MaxPendingBatches < 1, "MaxPendingBatches %d must be at least 1", c.MaxPendingBatches)
	check(c.ReceiveHWM < 0, "ReceiveHWM %d is negative", c.ReceiveHWM)
	check(c.ReadInterval < 0 || c.ReadInterval > MaxReadInterval, "ReadInterval %v is not between 0 and %v", c.ReadInterval, MaxReadInterval)
	check(c.MaxMessageBytes < 1, "MaxMessageBytes %d must be at least 1", c.MaxMessageBytes)
	check(c.ReceiveBufferBytes < c.MaxMessageBytes, "ReceiveBufferBytes %d is below MaxMessageBytes %d", c.ReceiveBufferBytes, c.MaxMessageBytes)
	check(c.MaxPendingBytes < c.MaxMessageBytes, "MaxPendingBytes %d is below MaxMessageBytes %d", c.MaxPendingBytes, c.MaxMessageBytes)
	check(c.MaxReplayBatches < 1, "MaxReplayBatches %d must be at least 1", c.MaxReplayBatches)
	check(c.MaxReplayDuration < c.ReplayTimeout, "MaxReplayDuration %v is below ReplayTimeout %v", c.MaxReplayDuration, c.ReplayTimeout)
	check(c.MaxResets < 0, "MaxResets %d is negative", c.MaxResets)
	check(c.MaxResets > 0 && c.ResetWindow <= 0, "ResetWindow %v must be positive", c.ResetWindow)
	if len(errs) > 0 {
		return fmt.Errorf("kvevent: invalid ZMQ client config for %q: %w", c.PodKey, errors.Join(errs...))
	}
	return nil
}

// endpoints returns the PUB and replay endpoints the client dials; replay is
// "" when disabled. The config must be valid.
func (c *ZMQClientConfig) endpoints() (pub, replay string) {
	if c.PubEndpoint != "" {
		return c.PubEndpoint, c.ReplayEndpoint
	}
	pub, replay = zmqwire.TCPEndpoint(c.PodIP, c.PubPort+c.DPRank), c.ReplayEndpoint
	if replay == "" && c.RouterPort != 0 {
		replay = zmqwire.TCPEndpoint(c.PodIP, c.RouterPort+c.DPRank)
	}
	return pub, replay
}

// validHost accepts an IP address or a DNS host name.
func validHost(host string) bool {
	if net.ParseIP(host) != nil {
		return true
	}
	if host == "" || len(host) > 253 {
		return false
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}
