package transport

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/prometheus/client_golang/prometheus"
)

// testClientConfig follows the publisher on ports with short timers.
func testClientConfig(ports kvtest.Ports) *ZMQClientConfig {
	cfg := DefaultZMQClientConfig("default/vllm-0", "127.0.0.1", "llama")
	cfg.PubPort, cfg.RouterPort = ports.Pub, ports.Router
	cfg.PollTimeout = 20 * time.Millisecond
	cfg.ReplayTimeout = 2 * time.Second
	cfg.ReconnectDelay = 50 * time.Millisecond
	cfg.MaxReconnectDelay = 200 * time.Millisecond
	return cfg
}

// startClient creates and starts a client delivering to h.
func startClient(t testing.TB, cfg *ZMQClientConfig, h kvevent.EventHandler) *ZMQClient {
	t.Helper()
	c, err := NewZMQClient(cfg, h)
	if err != nil {
		t.Fatalf("NewZMQClient: %v", err)
	}
	if err := c.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// newTestMetrics returns the client metrics registered on a registry of
// their own.
func newTestMetrics(t testing.TB) (*prometheus.Registry, *KVCacheMetrics) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := NewKVCacheMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	return reg, m
}
