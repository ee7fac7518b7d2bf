// Package simtest serves simulated vLLM engines (package simserver) in a
// test's process, on loopback ports, for as long as the test runs.
package simtest

import (
	"context"
	"net"
	"net/http/httptest"
	"testing"

	"github.com/kvgate/kvgate/pkg/sim/simserver"
)

// Engine is one simulated engine a test serves.
type Engine struct {
	// URL is the engine's base URL, http://127.0.0.1:<port>.
	URL string
	// Port is the port it listens on.
	Port int
}

// Serve runs the engine cfg describes until the test ends, its HTTP API on
// a free loopback port. It fails the test when cfg is invalid.
func Serve(t testing.TB, cfg simserver.Config) Engine {
	t.Helper()
	srv, err := simserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Run(ctx)
	}()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		cancel()
		<-done
	})
	return Engine{URL: hs.URL, Port: hs.Listener.Addr().(*net.TCPAddr).Port}
}
