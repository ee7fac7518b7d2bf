package kvevent

import (
	"sync"
	"testing"
	"time"
)

// testClientConfig follows the publisher on ports with short timers.
func testClientConfig(ports testPorts) *ZMQClientConfig {
	cfg := DefaultZMQClientConfig("default/vllm-0", "127.0.0.1", "llama")
	cfg.PubPort, cfg.RouterPort = ports.pub, ports.router
	cfg.PollTimeout = 20 * time.Millisecond
	cfg.ReplayTimeout = 2 * time.Second
	cfg.ReconnectDelay = 50 * time.Millisecond
	cfg.MaxReconnectDelay = 200 * time.Millisecond
	return cfg
}

// startClient creates and starts a client delivering to h.
func startClient(t testing.TB, cfg *ZMQClientConfig, h EventHandler) *ZMQClient {
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

// recorder is a BatchHandler and ResetHandler that records what it gets.
type recorder struct {
	mu      sync.Mutex
	batches []delivered
	resets  []StreamReset
}

func (r *recorder) HandleEvent(KVEvent) error { panic("recorder handles batches") }

func (r *recorder) HandleBatch(seq uint64, b *EventBatch) error {
	r.mu.Lock()
	r.batches = append(r.batches, summarize(seq, b))
	r.mu.Unlock()
	return nil
}

// has reports whether batch seq of publisher tag was delivered.
func (r *recorder) has(tag, seq int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.batches {
		if d.seq == uint64(seq) && d.first == uint64(tag*1_000_000+seq) {
			return true
		}
	}
	return false
}

// checkSequence fails unless got holds publisher tag's batches from..to-1,
// in order, each once.
func checkSequence(t testing.TB, got []delivered, tag, from, to int) {
	t.Helper()
	if len(got) != to-from {
		t.Fatalf("got %d batches %v, want seqs %d..%d", len(got), got, from, to-1)
	}
	for i, d := range got {
		want := from + i
		if d.seq != uint64(want) || d.first != uint64(tag*1_000_000+want) {
			t.Fatalf("batch %d is seq %d first hash %d, want seq %d of publisher %d", i, d.seq, d.first, want, tag)
		}
	}
}
