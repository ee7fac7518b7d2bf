// Command gateway runs kvgate's inference gateway: an OpenAI-compatible
// proxy that routes each request to the vLLM pod that can serve it fastest,
// using the KV-cache events of every pod, and, with an external processing
// address, the same routing as Envoy's external processor (package
// extproc). Its settings come from flags and
// environment variables (gateway -help lists the flags; README.md documents
// every variable); a flag given on the command line overrides its variable.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/extproc"
	"github.com/kvgate/kvgate/pkg/gateway"
)

func main() {
	redis.SetLogger(redisLog{klog.Background().WithName("redis")})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.LookupEnv, os.Stderr)
	stop()
	klog.Flush()
	os.Exit(code)
}

// redisLog takes the Redis client's own logs (a dial that failed, a pool
// that ran out) to klog at verbosity 2: the gateway's components log when
// Redis starts and stops failing, and count each failure.
type redisLog struct{ log klog.Logger }

func (r redisLog) Printf(_ context.Context, format string, v ...any) {
	if l := r.log.V(2); l.Enabled() {
		l.Info(fmt.Sprintf(format, v...))
	}
}

// run runs the gateway until ctx ends and returns the process's exit code:
// 0 after a clean shutdown, 1 when the configuration is invalid or the
// gateway cannot start or fails, 2 for bad command-line arguments.
func run(ctx context.Context, args []string, env config.LookupFunc, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	lookup, err := parseArgs(fs, args, env)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	e := config.NewEnv(lookup)
	cfg := gateway.LoadConfig(e)
	if err := e.Err(); err != nil {
		fmt.Fprintf(stderr, "gateway: refusing to start, the configuration has these problems:\n%v\n", err)
		return 1
	}
	g, err := gateway.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "gateway: refusing to start:", err)
		return 1
	}
	if err := attachExtProc(g, cfg); err != nil {
		fmt.Fprintln(stderr, "gateway: refusing to start:", err)
		return 1
	}
	if err := g.Run(ctx); err != nil {
		klog.ErrorS(err, "Gateway failed")
		fmt.Fprintln(stderr, "gateway: failed:", err)
		return 1
	}
	klog.InfoS("Gateway stopped")
	return 0
}

// attachExtProc attaches to g the external processor cfg.ExtProc
// configures, when it has an address.
func attachExtProc(g *gateway.Gateway, cfg gateway.Config) error {
	x := cfg.ExtProc
	if x.ListenAddress == "" {
		return nil
	}
	ec := extproc.Config{FailOpen: x.FailOpen, MaxStreams: x.MaxStreams, MaxConnections: x.MaxConnections, MaxMessageTimeout: x.MaxMessageTimeout, Logger: cfg.Logger}
	if x.TLS {
		var err error
		if ec.TLS, err = extproc.TLSConfig(x.CertDir, klog.Background()); err != nil {
			return err
		}
	}
	srv, err := extproc.New(g.Picker(), ec)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", x.ListenAddress)
	if err != nil {
		return fmt.Errorf("extproc: listen on %s: %w", x.ListenAddress, err)
	}
	g.Attach("ext_proc", ln, srv)
	return nil
}
