package transport

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
)

// pollingThreads counts the process's threads asleep in poll(2) or
// select(2), as zmq_poll leaves its caller's thread, from the kernel's
// wait channel of each. ok is false when the kernel does not name wait
// channels (every thread reads "0").
func pollingThreads(t *testing.T) (n int, ok bool) {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/wchan")
	if err != nil || len(tasks) == 0 {
		t.Skipf("cannot list the process's threads: %v", err)
	}
	for _, path := range tasks {
		wchan, err := os.ReadFile(path)
		if err != nil {
			continue // the thread exited
		}
		w := string(wchan)
		if w != "0" && w != "" {
			ok = true
		}
		if strings.HasPrefix(w, "poll_schedule_timeout") {
			n++
		}
	}
	return n, ok
}

// mostPollingThreads samples pollingThreads for d and returns the most seen.
func mostPollingThreads(t *testing.T, d time.Duration) int {
	t.Helper()
	most := 0
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		n, ok := pollingThreads(t)
		if !ok {
			t.Skip("the kernel does not name its threads' wait channels")
		}
		most = max(most, n)
	}
	return most
}

// TestWaitingClientsHoldNoThreads follows many engines from one context,
// as the KVEventManager does, and checks that a client waiting for its
// sockets holds no thread: a thread blocked in zmq_poll per client would
// take one per engine followed, up to the Go runtime's limit of 10,000.
// It counts the threads asleep in poll(2), where zmq_poll waits, rather
// than all of them: the runtime keeps the threads it started for the
// clients' first cgo calls, which on a loaded machine may be many, but
// none of them waits in poll. A zmq_poll of its own, first, shows that
// the count sees such a thread. Not parallel: it reads the whole
// process's threads.
func TestWaitingClientsHoldNoThreads(t *testing.T) {
	const clients = 64
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()

	probe, err := zctx.NewSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	poller := zmq.NewPoller()
	poller.Add(probe, zmq.POLLIN)
	stop, done := make(chan struct{}), make(chan struct{})
	// Stopped and closed before the context ends, on a skip too: Term waits
	// for every socket to close.
	stopProbe := sync.OnceFunc(func() {
		close(stop)
		<-done
		probe.Close()
	})
	defer stopProbe()
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := poller.Poll(20 * time.Millisecond); err != nil {
				t.Errorf("zmq_poll: %v", err)
				return
			}
		}
	}()
	seen := mostPollingThreads(t, 200*time.Millisecond)
	stopProbe()
	if seen < 1 {
		t.Fatalf("a thread in zmq_poll for 200 ms was never seen asleep in poll(2)")
	}

	var started []*ZMQClient
	defer func() {
		for _, c := range started {
			c.Close()
		}
	}()
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
	// Sampled over ten poll timeouts of every client.
	if most := mostPollingThreads(t, 200*time.Millisecond); most >= clients/2 {
		t.Errorf("%d clients waiting for their engines held %d threads in poll(2)", clients, most)
	}
}
