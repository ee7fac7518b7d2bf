// Package testredis starts a private redis-server for a test.
//
// Each server listens on a free 127.0.0.1 port, keeps nothing on disk and is
// killed when the test ends. The redis-server binary comes from the Debian
// package that hack/install-deps.sh installs.
package testredis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// startTimeout bounds how long a server may take to answer PING; generous
// because the machine running the tests may be loaded.
const startTimeout = 20 * time.Second

// attempts is how often Start retries when the port it picked was taken by
// someone else between picking and binding.
const attempts = 3

// Server is a running redis-server owned by one test.
type Server struct {
	// Addr is the server's host:port on 127.0.0.1.
	Addr string

	stop func()
}

// Stop kills the server now, for a test of what happens when Redis goes
// away; it is also stopped when the test ends.
func (s *Server) Stop() { s.stop() }

// Start runs a redis-server for t and stops it when t ends. It fails t when
// no server can be started.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found (run hack/install-deps.sh): %v", err)
	}
	var lastErr error
	for range attempts {
		srv, err := start(t, bin)
		if err == nil {
			return srv
		}
		lastErr = err
	}
	t.Fatalf("start redis-server: %v", lastErr)
	return nil
}

// NewClient returns a client of the server, closed when t ends.
func (s *Server) NewClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func start(t testing.TB, bin string) (*Server, error) {
	port := testsupport.FreePorts(t, 1)[0]
	cmd := exec.Command(bin,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", t.TempDir(),
		"--loglevel", "warning",
	)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("exec %s: %w", bin, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			<-exited
		})
	}

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := waitReady(addr, exited, &waitErr); err != nil {
		stop()
		return nil, fmt.Errorf("redis-server on %s: %w", addr, err)
	}
	t.Cleanup(stop)
	return &Server{Addr: addr, stop: stop}, nil
}

// waitReady polls PING until the server answers, exits or startTimeout passes.
// waitErr is read only after exited is closed.
func waitReady(addr string, exited <-chan struct{}, waitErr *error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v: %w", startTimeout, err)
		}
		select {
		case <-exited:
			return errors.Join(errors.New("exited before answering PING"), *waitErr)
		case <-tick.C:
		}
	}
}
