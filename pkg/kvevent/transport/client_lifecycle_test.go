package transport

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
)

// openFDs counts the process's open file descriptors: ZeroMQ sockets,
// contexts and their TCP connections all hold some.
func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	return len(entries)
}

// Not parallel: it counts the whole process's descriptors and goroutines.
func TestClientStopAndCloseLeakNoGoroutinesOrSockets(t *testing.T) {
	before := openFDs(t)
	func() {
		ports := kvtest.NewPorts(t)
		pub := kvtest.NewPublisher(t, ports, nil)
		defer pub.Close()
		rec := &kvtest.Recorder{}
		c, err := NewZMQClient(testClientConfig(ports), rec)
		if err != nil {
			t.Fatal(err)
		}
		for round := range 3 {
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
				t.Fatal(err)
			}
			kvtest.Publish(t, pub, 1, round, round+1)
			testsupport.Eventually(t, "the round's batch", func() bool { return rec.Has(1, round) })
			c.Stop()
			if connected, _ := c.GetStats(); connected {
				t.Error("a stopped client reports a connection")
			}
		}
		c.Close()
		got, resets := rec.Snapshot()
		kvtest.CheckSequence(t, got, 1, 0, 3)
		if len(resets) != 0 {
			t.Errorf("resets %v across Stop and Start, want none", resets)
		}
	}()
	goleak.VerifyNone(t)
	if after := openFDs(t); after > before {
		t.Errorf("%d file descriptors open after Close, %d before", after, before)
	}
}
