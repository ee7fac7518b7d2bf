package extproc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime/debug"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/connlimit"
	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/internal/budget"
	"github.com/kvgate/kvgate/pkg/internal/rawsock"
)

// Config configures a Server.
type Config struct {
	// FailOpen lets a request the gateway cannot route for want of a pod
	// (a refusal with 503: the gateway not ready, no ready pod, none in the
	// subset) continue without a destination instead of answering the
	// error (KVGATE_EXTPROC_FAIL_OPEN). Client errors are answered either
	// way.
	FailOpen bool
	// TLS, when set, serves TLS with it; nil serves plaintext gRPC.
	TLS *tls.Config
	// MaxStreams is the most ExternalProcessor streams served at once,
	// over all connections and on each (KVGATE_EXTPROC_MAX_STREAMS);
	// DefaultMaxStreams when zero. A stream beyond it is refused with
	// RESOURCE_EXHAUSTED.
	MaxStreams int
	// MaxConnections is the most connections Serve's listener holds open
	// (KVGATE_EXTPROC_MAX_CONNECTIONS); DefaultMaxConnections when zero. At
	// the bound it accepts none until one closes.
	MaxConnections int
	// MaxMessageTimeout, when above zero, is Envoy's max_message_timeout
	// (KVGATE_EXTPROC_MAX_MESSAGE_TIMEOUT): a request that waits in its
	// model's SLO queue asks Envoy, with override_message_timeout, to wait
	// for its answer until it leaves the queue, at most this long.
	MaxMessageTimeout time.Duration
	// HealthInterval is how often the health service's readiness is
	// refreshed from the gateway's (default one second).
	HealthInterval time.Duration
	// Logger receives the server's logs (the Picker's when zero).
	Logger klog.Logger
}

// Config.MaxStreams and Config.MaxConnections when zero.
const (
	DefaultMaxStreams     = 4096
	DefaultMaxConnections = 1024
)

// Health service names of a Server besides "" (the server as a whole).
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
)

// Server is the external processor: a gRPC server of the ExternalProcessor
// and health services over a gateway's Picker. It implements
// gateway.Frontend.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	picker  *gateway.Picker
	cfg     Config
	log     klog.Logger
	metrics *metrics
	grpc    *grpc.Server
	health  *health.Server

	// streams holds a slot per ExternalProcessor stream being served, at
	// most cfg.MaxStreams.
	streams *budget.Budget

	stopHealth chan struct{}
	stopOnce   sync.Once
	served     chan struct{}
}

var _ gateway.Frontend = (*Server)(nil)

// New returns a Server deciding with p, its metrics registered on p's
// registry. It fails when the metrics cannot be registered.
func New(p *gateway.Picker, cfg Config) (*Server, error) {
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.HealthInterval <= 0 {
		cfg.HealthInterval = time.Second
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = p.Logger()
	}
	m, err := newMetrics(p.Registerer())
	if err != nil {
		return nil, err
	}
	s := &Server{picker: p, cfg: cfg, log: cfg.Logger.WithName("extproc"), metrics: m, health: health.NewServer(),
		streams: budget.New(int64(cfg.MaxStreams)), stopHealth: make(chan struct{}), served: make(chan struct{})}
	// A buffered body comes in one message, and goes back in one when it
	// changes: room for the largest body and its headers. gRPC allocates a
	// message as its bytes arrive, not as its prefix declares, but opens
	// the stream's flow-control window to the whole message once Process
	// reads: a stream holds at most maxMsg before Process charges the body
	// to the gateway's held bytes, and the windows cannot lower that. The
	// sum saturates at the largest int rather than wrap around to a bound
	// no message meets.
	const headroom = 1 << 20
	maxMsg := int(min(p.MaxBodyBytes(), math.MaxInt-headroom)) + headroom
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxMsg),
		grpc.MaxSendMsgSize(maxMsg),
		// One connection opens no more streams than all may: Envoy opens
		// another connection or waits, where a stream beyond the bound
		// over all connections is refused in Process.
		grpc.MaxConcurrentStreams(uint32(min(int64(cfg.MaxStreams), math.MaxUint32))),
		// Envoy keeps its connections open and may ping them; a peer gone
		// silent is found within Time+Timeout, which ends its streams.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	s.grpc = grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	s.refreshHealth()
	return s, nil
}

// Serve serves on ln, which it closes, until Shutdown, holding at most
// Config.MaxConnections of its connections open and reading and writing
// their TCP sockets with raw system calls (package rawsock).
func (s *Server) Serve(ln net.Listener) error {
	go s.followReadiness()
	defer close(s.served)
	if err := s.grpc.Serve(connlimit.New(rawsock.Listener{Listener: ln}, s.cfg.MaxConnections, s.metrics.connWaits, s.metrics.conns)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("extproc: %w", err)
	}
	return nil
}

// Shutdown reports the server NOT_SERVING, stops accepting streams and
// waits for those in flight until ctx ends, then cuts them. It returns once
// Serve has returned, or at once when Serve was never called.
func (s *Server) Shutdown(ctx context.Context) {
	s.stopOnce.Do(func() { close(s.stopHealth) })
	s.health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		s.log.Info("Streams still open after the shutdown timeout are cut")
		s.grpc.Stop()
		<-stopped
	}
}

// followReadiness keeps the health service's readiness that of the gateway
// until Shutdown.
func (s *Server) followReadiness() {
	t := time.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopHealth:
			return
		case <-t.C:
			s.refreshHealth()
		}
	}
}

// refreshHealth sets the readiness services to the gateway's readiness.
func (s *Server) refreshHealth() {
	status := healthpb.HealthCheckResponse_NOT_SERVING
	if ok, _ := s.picker.Ready(); ok {
		status = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range []string{"", HealthReadiness, extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
		s.health.SetServingStatus(name, status)
	}
}

// Process serves one request's stream: see the package documentation. A
// stream beyond Config.MaxStreams is refused with RESOURCE_EXHAUSTED. A
// panic while serving the stream ends that stream alone with INTERNAL, its
// request cancelled; it is logged with its stack and counted in
// kvgate_extproc_stream_errors_total{reason="panic"}.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) (err error) {
	st := s.newStream(srv)
	if st == nil {
		s.metrics.refusedStream.Inc()
		return status.Errorf(codes.ResourceExhausted,
			"kvgate serves at most %d external processing streams at once (KVGATE_EXTPROC_MAX_STREAMS)", s.cfg.MaxStreams)
	}
	defer st.finish()
	// gRPC does not recover a handler's panic: unrecovered, one stream
	// would end the process and every other stream with it.
	defer func() {
		if v := recover(); v != nil {
			err = st.panicked(v, debug.Stack())
		}
	}()
	return st.run()
}
