package transport

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
)

// threads counts the process's threads.
func threads(t *testing.T) int {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("cannot count threads: %v", err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("no thread count in /proc/self/status")
	return 0
}

// TestWaitingClientsHoldNoThreads follows many engines from one context,
// as the KVEventManager does, and checks that a client waiting for its
// sockets holds no thread: a thread blocked in zmq_poll per client would
// take one per engine followed, up to the Go runtime's limit of 10,000.
// Not parallel: it counts the whole process's threads.
func TestWaitingClientsHoldNoThreads(t *testing.T) {
	const clients = 64
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	before := threads(t)
	var started []*ZMQClient
	for range clients {
		cfg := testClientConfig(kvtest.NewPorts(t))
		cfg.Context = zctx
		c, err := NewZMQClient(cfg, &kvtest.Recorder{})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		started = append(started, c)
	}
	defer func() {
		for _, c := range started {
			c.Close()
		}
	}()
	// Sampled over ten poll timeouts of every client.
	most := 0
	for range 20 {
		most = max(most, threads(t))
		time.Sleep(10 * time.Millisecond)
	}
	if grew := most - before; grew >= clients/2 {
		t.Errorf("%d clients waiting for their engines took %d threads more (%d before)", clients, grew, before)
	}
}
