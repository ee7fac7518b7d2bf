// Package simtest serves simulated vLLM engines (package simserver) in a
// test's process, on loopback ports, for as long as the test runs.
package simtest

import (
	"context"
	"net"
	"net/http/httptest"
	"testing"

	"github.com/kvgate/kvgate/pkg/sim/simanthropic"
	"github.com/kvgate/kvgate/pkg/sim/simresponses"
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
// a free loopback port, serving Anthropic's Messages API and OpenAI's
// Responses API with vLLM's conversions (simanthropic.Convert,
// simresponses.Convert) unless cfg.Anthropic and cfg.Responses say
// otherwise.
// It fails the test when cfg is invalid.
func Serve(t testing.TB, cfg simserver.Config) Engine {
	t.Helper()
	if cfg.Anthropic == nil {
		cfg.Anthropic = simanthropic.Convert
	}
	if cfg.Responses == nil {
		cfg.Responses = simresponses.Convert
	}
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
