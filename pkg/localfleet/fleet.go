// Package localfleet runs a fleet of simulated vLLM engines (vllm-sim) and
// kvgate's gateway in static discovery mode as child processes on
// 127.0.0.1, for demos and end-to-end benchmarks without Kubernetes; with
// several gateway replicas over the same engines, and a redis-server
// through which they share state.
//
// Start picks free ports, starts redis-server when asked, starts the
// engines with their KV events published on loopback, writes the gateways'
// endpoints file, starts the gateways and returns once every gateway is
// ready and follows every engine's KV event stream. The children run in a process group of their own (a
// terminal's Ctrl-C reaches only the parent) and die with the parent should
// it die without stopping them. Close stops them all and removes the
// fleet's temporary files.
package localfleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/internal/freeport"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/discovery"
)

// Defaults of Config's zero fields.
const (
	DefaultModel        = "sim-llama"
	DefaultStartTimeout = 2 * time.Minute
	DefaultStopTimeout  = 15 * time.Second
)

// logTailLines is how much of a child's log an error quotes.
const logTailLines = 20

// Config describes a fleet. Zero fields take the defaults their
// documentation names.
type Config struct {
	// BinDir holds the vllm-sim and gateway binaries (make build puts them
	// in bin/).
	BinDir string
	// Engines is the number of engines, at least 1.
	Engines int
	// Model is the model every engine serves; default DefaultModel.
	Model string
	// EngineArgs are added to every engine's command line: its cache size
	// and latency model (see vllm-sim -help). The fleet sets -host, -port,
	// -model and -kv-events-config itself.
	EngineArgs []string
	// GatewayArgs are added to the gateway's command line; GatewayEnv to
	// its environment (see the configuration reference in README.md). The
	// fleet sets --discovery, --static-endpoints-file and --listen-address
	// itself, and KVGATE_SHUTDOWN_DELAY to 0 unless GatewayEnv sets it.
	GatewayArgs []string
	GatewayEnv  []string
	// GatewayBinaries, when set, name the gateway binary of each replica
	// by its index, so that two builds can be measured side by side on
	// the same engines; a missing or empty entry takes BinDir's gateway.
	GatewayBinaries []string
	// GatewayReplicaEnv, when set, is added to the environment of each
	// replica by its index, after GatewayEnv, so that two configurations
	// can be measured side by side on the same engines.
	GatewayReplicaEnv [][]string
	// Tokenizer, when set, is the directory of the model's Hugging Face
	// tokenizer files (tokenizer.json, tokenizer_config.json): the engines
	// tokenize with them (vllm-sim -tokenizer), and the gateways in
	// process (--tokenizer-dir, a directory in the fleet's that holds them
	// under the model's name), once the engines' /tokenize agreed with
	// them. Empty: the simulator's own tokenizer, which the gateways ask
	// the engines for.
	Tokenizer string
	// GatewayAddress is where the (first) gateway listens, as host:port;
	// empty picks a free port on 127.0.0.1. Start fails at once, saying so,
	// when the address is in use.
	GatewayAddress string
	// AdminAddress, when set (host:port, "127.0.0.1:0" for a free port),
	// is the first gateway's admin listen address, where it serves
	// /metrics, /debug/* and Go's profiles instead of on its API address;
	// the other replicas then take a free port of their own each.
	AdminAddress string
	// Gateways is the number of gateway replicas following the same
	// engines, each on a port of its own (gateway, gateway-1, ...); default
	// 1.
	Gateways int
	// Redis starts a redis-server on a free 127.0.0.1 port, keeping nothing
	// on disk, and points every gateway at it (KVGATE_REDIS_ADDRESS), so
	// that the replicas share their state. RedisServer is its binary;
	// default the redis-server on PATH (hack/install-deps.sh installs it).
	Redis       bool
	RedisServer string
	// Dir receives the endpoints file and one log per process, and is kept.
	// Empty uses a new temporary directory that Close removes.
	Dir string
	// StartTimeout bounds how long Start waits for the engines and the
	// gateway to be ready; default DefaultStartTimeout.
	StartTimeout time.Duration
	// StopTimeout bounds how long Close waits for the processes to exit
	// after SIGTERM before it kills them; default DefaultStopTimeout.
	StopTimeout time.Duration
}

// Engine is one engine of a fleet.
type Engine struct {
	*Process
	// URL is the base URL of its HTTP API, e.g. http://127.0.0.1:40001.
	URL string
	// PodKey is its pod's name in the gateway, "static/<Name>".
	PodKey string
}

// Fleet is a running fleet. Its methods are safe for concurrent use.
type Fleet struct {
	cfg     Config
	dir     string
	tempDir bool
	group   *group
	engines []Engine
	// gateways and gwURLs are the gateway replicas, the first one first;
	// adminURLs serve their /metrics and /debug: gwURLs, or their admin
	// addresses.
	gateways  []*Process
	gwURLs    []string
	adminURLs []string
	redis     *Process
	redisAdr  string

	closeOnce sync.Once
	closing   chan struct{}
	failOnce  sync.Once
	failed    chan struct{}
	failErr   error
}

// Start starts the fleet cfg describes and waits until it is ready: every
// engine answers its health check, and the gateway is ready and follows
// every engine's KV event stream. It stops everything it started when it
// fails, when ctx ends first, or when cfg.StartTimeout passes; the error
// of a process that exited quotes the end of its log.
func Start(ctx context.Context, cfg Config) (*Fleet, error) {
	cfg = cfg.withDefaults()
	if cfg.Engines < 1 || cfg.Gateways < 1 {
		return nil, fmt.Errorf("localfleet: %d engines and %d gateways, want at least 1 of each", cfg.Engines, cfg.Gateways)
	}
	if cfg.Redis {
		bin, err := exec.LookPath(cfg.RedisServer)
		if err != nil {
			return nil, fmt.Errorf("localfleet: %w (install it with hack/install-deps.sh)", err)
		}
		cfg.RedisServer = bin
	}
	for _, bin := range []string{"vllm-sim", "gateway"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, bin)); err != nil {
			return nil, fmt.Errorf("localfleet: %w (build the binaries with make build)", err)
		}
	}
	f := &Fleet{cfg: cfg, dir: cfg.Dir, closing: make(chan struct{}), failed: make(chan struct{})}
	f.group = &group{onExit: f.exited}
	if f.dir == "" {
		dir, err := os.MkdirTemp("", "kvgate-fleet-")
		if err != nil {
			return nil, fmt.Errorf("localfleet: %w", err)
		}
		f.dir, f.tempDir = dir, true
	} else if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return nil, fmt.Errorf("localfleet: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	if err := f.start(ctx); err != nil {
		f.Close()
		return nil, fmt.Errorf("localfleet: %w", err)
	}
	return f, nil
}

func (c Config) withDefaults() Config {
	c.Model = cmp.Or(c.Model, DefaultModel)
	if c.Tokenizer != "" {
		if abs, err := filepath.Abs(c.Tokenizer); err == nil {
			c.Tokenizer = abs
		}
	}
	c.StartTimeout = cmp.Or(c.StartTimeout, DefaultStartTimeout)
	c.StopTimeout = cmp.Or(c.StopTimeout, DefaultStopTimeout)
	c.Gateways = cmp.Or(c.Gateways, 1)
	c.RedisServer = cmp.Or(c.RedisServer, "redis-server")
	return c
}

// start starts Redis, the engines, then the gateways, waiting for each
// stage.
func (f *Fleet) start(ctx context.Context) error {
	gwAddr := f.cfg.GatewayAddress
	if gwAddr != "" {
		ln, err := net.Listen("tcp", gwAddr)
		if err != nil {
			return fmt.Errorf("gateway address %s is not free: %w", gwAddr, err)
		}
		ln.Close()
	}
	e, g := f.cfg.Engines, f.cfg.Gateways
	ports, err := freeport.Distinct(3*e + g + 1)
	if err != nil {
		return err
	}
	// A fleet on one machine has no load balancer to tell of a shutdown.
	gwEnv := append([]string{config.ShutdownDelay.Name + "=0"}, f.cfg.GatewayEnv...)
	if f.cfg.Redis {
		if err := f.startRedis(ctx, ports[3*e+g]); err != nil {
			return err
		}
		gwEnv = append([]string{gwEnv[0], config.RedisAddress.Name + "=" + f.redisAdr}, gwEnv[1:]...)
	}
	var gwArgs []string
	if f.cfg.Tokenizer != "" {
		dir, err := f.layOutTokenizer()
		if err != nil {
			return err
		}
		gwArgs = append(gwArgs, "--tokenizer-dir", dir)
	}
	gwArgs = append(gwArgs, f.cfg.GatewayArgs...)
	var static discovery.StaticFile
	for i := range e {
		e, ep, err := f.startEngine(i, ports[3*i], ports[3*i+1], ports[3*i+2])
		if err != nil {
			return err
		}
		f.engines = append(f.engines, e)
		static.Endpoints = append(static.Endpoints, ep)
	}
	for _, e := range f.engines {
		if err := f.waitFor(ctx, e.Process, e.Name+" to answer /health", func(ctx context.Context) (bool, error) {
			return httpOK(ctx, e.URL+"/health")
		}); err != nil {
			return err
		}
	}
	file := filepath.Join(f.dir, "endpoints.yaml")
	data, err := yaml.Marshal(&static)
	if err == nil {
		err = os.WriteFile(file, data, 0o644)
	}
	if err != nil {
		return fmt.Errorf("write the endpoints file: %w", err)
	}
	for i := range g {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[3*e+i]))
		name := "gateway"
		if i == 0 && gwAddr != "" {
			addr = gwAddr
		}
		if i > 0 {
			name += "-" + strconv.Itoa(i)
		}
		args := []string{"--discovery", "static", "--static-endpoints-file", file, "--listen-address", addr}
		adminURL := "http://" + addr
		if admin := f.cfg.AdminAddress; admin != "" {
			if i > 0 {
				admin = "127.0.0.1:0"
			}
			if admin, err = freeAddress(admin); err != nil {
				return err
			}
			args = append(args, "--admin-listen-address", admin)
			adminURL = "http://" + admin
		}
		args = append(args, gwArgs...)
		bin := filepath.Join(f.cfg.BinDir, "gateway")
		if i < len(f.cfg.GatewayBinaries) && f.cfg.GatewayBinaries[i] != "" {
			bin = f.cfg.GatewayBinaries[i]
		}
		env := gwEnv
		if i < len(f.cfg.GatewayReplicaEnv) {
			env = append(slices.Clip(gwEnv), f.cfg.GatewayReplicaEnv[i]...)
		}
		p, err := f.group.start(f.dir, name, bin, args, env)
		if err != nil {
			return err
		}
		f.gateways, f.gwURLs = append(f.gateways, p), append(f.gwURLs, "http://"+addr)
		f.adminURLs = append(f.adminURLs, adminURL)
	}
	for i, p := range f.gateways {
		url, admin := f.gwURLs[i], f.adminURLs[i]
		if err := f.waitFor(ctx, p, p.Name+" to be ready", func(ctx context.Context) (bool, error) {
			return httpOK(ctx, url+"/readyz")
		}); err != nil {
			return err
		}
		if err := f.waitFor(ctx, p, p.Name+" to follow every engine's KV events", func(ctx context.Context) (bool, error) {
			return f.allFollowed(ctx, admin)
		}); err != nil {
			return err
		}
	}
	return nil
}

// layOutTokenizer returns a gateway tokenizer directory in the fleet's
// directory that holds the tokenizer files under the model's name.
func (f *Fleet) layOutTokenizer() (string, error) {
	dir := filepath.Join(f.dir, "tokenizers")
	link := filepath.Join(dir, filepath.FromSlash(f.cfg.Model))
	err := os.MkdirAll(filepath.Dir(link), 0o755)
	if err == nil {
		// A fleet directory used before holds the link already.
		if err = os.Remove(link); errors.Is(err, fs.ErrNotExist) {
			err = nil
		}
	}
	if err == nil {
		err = os.Symlink(f.cfg.Tokenizer, link)
	}
	if err != nil {
		return "", fmt.Errorf("lay out the gateway's tokenizer directory: %w", err)
	}
	return dir, nil
}

// startRedis starts redis-server on port and waits until it answers PING.
func (f *Fleet) startRedis(ctx context.Context, port int) error {
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", f.dir, "--loglevel", "warning"}
	p, err := f.group.start(f.dir, "redis", f.cfg.RedisServer, args, nil)
	if err != nil {
		return err
	}
	f.redis, f.redisAdr = p, net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := redis.NewClient(&redis.Options{Addr: f.redisAdr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	return f.waitFor(ctx, p, "redis-server to answer PING", func(ctx context.Context) (bool, error) {
		err := c.Ping(ctx).Err()
		return err == nil, err
	})
}

// startEngine starts engine i serving HTTP on port and publishing KV
// events on pub, with replay on replay, and returns it with its entry in
// the endpoints file.
func (f *Fleet) startEngine(i, port, pub, replay int) (Engine, discovery.StaticEndpoint, error) {
	name := "vllm-" + strconv.Itoa(i)
	events := fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":"tcp://[::ffff:127.0.0.1]:%d","replay_endpoint":"tcp://[::ffff:127.0.0.1]:%d"}`,
		pub, replay)
	args := []string{"-host", "127.0.0.1", "-port", strconv.Itoa(port), "-model", f.cfg.Model, "-kv-events-config", events}
	if f.cfg.Tokenizer != "" {
		args = append(args, "-tokenizer", f.cfg.Tokenizer)
	}
	args = append(args, f.cfg.EngineArgs...)
	p, err := f.group.start(f.dir, name, filepath.Join(f.cfg.BinDir, "vllm-sim"), args, nil)
	if err != nil {
		return Engine{}, discovery.StaticEndpoint{}, err
	}
	e := Engine{Process: p, URL: "http://127.0.0.1:" + strconv.Itoa(port), PodKey: discovery.StaticNamespace + "/" + name}
	ep := discovery.StaticEndpoint{Name: name, Address: "127.0.0.1", Model: f.cfg.Model, Port: port, PubPort: &pub, ReplayPort: &replay}
	return e, ep, nil
}

// freeAddress returns addr, its port replaced by a free one when it is 0.
func freeAddress(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("admin address %q: %w", addr, err)
	}
	if port != "0" {
		return addr, nil
	}
	free, err := freeport.Address(host)
	if err != nil {
		return "", fmt.Errorf("find a free admin port: %w", err)
	}
	return free, nil
}

// GatewayURL returns the first gateway's base URL, e.g.
// http://127.0.0.1:8080.
func (f *Fleet) GatewayURL() string { return f.gwURLs[0] }

// GatewayURLs returns the base URLs of every gateway replica, the first
// one first.
func (f *Fleet) GatewayURLs() []string { return append([]string(nil), f.gwURLs...) }

// RedisAddress returns the host:port of the fleet's redis-server, "" when
// Config.Redis is off.
func (f *Fleet) RedisAddress() string { return f.redisAdr }

// AdminURL returns the base URL of the first gateway's /metrics and
// /debug/*: its admin address when Config.AdminAddress is set, GatewayURL
// otherwise.
func (f *Fleet) AdminURL() string { return f.adminURLs[0] }

// AdminURLs returns every gateway's admin base URL, in replica order.
func (f *Fleet) AdminURLs() []string { return append([]string(nil), f.adminURLs...) }

// Model returns the model the engines serve.
func (f *Fleet) Model() string { return f.cfg.Model }

// Engines returns the engines in order.
func (f *Fleet) Engines() []Engine { return append([]Engine(nil), f.engines...) }

// Gateway returns the first gateway's process.
func (f *Fleet) Gateway() *Process { return f.gateways[0] }

// Gateways returns the processes of every gateway replica, the first one
// first.
func (f *Fleet) Gateways() []*Process { return append([]*Process(nil), f.gateways...) }

// Redis returns the redis-server's process, nil when Config.Redis is off.
func (f *Fleet) Redis() *Process { return f.redis }

// ProcessGroup returns the id of the process group of the fleet's
// processes.
func (f *Fleet) ProcessGroup() int {
	f.group.mu.Lock()
	defer f.group.mu.Unlock()
	return f.group.pgid
}

// Dir returns the directory holding the endpoints file and the logs.
func (f *Fleet) Dir() string { return f.dir }

// Failed is closed when a process of the fleet exits before Close; Err
// then says which and quotes the end of its log.
func (f *Fleet) Failed() <-chan struct{} { return f.failed }

// Err returns why the fleet failed, nil while it has not.
func (f *Fleet) Err() error {
	select {
	case <-f.failed:
		return f.failErr
	default:
		return nil
	}
}

// ErrExited marks the error of a fleet whose process exited on its own:
// Fleet.Err's, and Start's when a process exits while the fleet starts.
var ErrExited = errors.New("a process of the fleet exited")

// exited records the first process that exits before Close.
func (f *Fleet) exited(p *Process) {
	select {
	case <-f.closing:
		return
	default:
	}
	f.failOnce.Do(func() {
		f.failErr = fmt.Errorf("%w: %w; the end of its log (%s):\n%s", ErrExited, p.exitError(), p.LogPath,
			p.LogTail(logTailLines))
		close(f.failed)
	})
}

// Close stops every process of the fleet, the gateways first so that they
// drain against live engines and Redis, then the engines and Redis (SIGTERM,
// then SIGKILL to what is left after Config.StopTimeout at each step),
// waits for them to exit, and removes the fleet's directory when it is a
// temporary one. It is safe to call more than once; later calls wait for
// nothing.
func (f *Fleet) Close() {
	f.closeOnce.Do(func() {
		close(f.closing)
		f.group.stop(f.cfg.StopTimeout, f.gateways)
		if f.tempDir {
			_ = os.RemoveAll(f.dir)
		}
	})
}
