package connlimit

import (
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// slotListener listens on loopback through a Listener holding at most n
// connections, its metrics, waits and open, registered in reg.
func slotListener(t *testing.T, n int) (*Listener, *prometheus.Registry) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	waits := prometheus.NewCounter(prometheus.CounterOpts{Name: "waits", Help: "Waits for a slot."})
	open := prometheus.NewGauge(prometheus.GaugeOpts{Name: "open", Help: "Connections open."})
	reg.MustRegister(waits, open)
	l := New(ln, n, waits, open)
	t.Cleanup(func() { l.Close() })
	return l, reg
}

// dialAccept connects to l and returns the connection l accepted.
func dialAccept(t *testing.T, l net.Listener) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAConnectionClosedTwiceGivesBackOneSlot(t *testing.T) {
	l, reg := slotListener(t, 2)
	a, b := dialAccept(t, l), dialAccept(t, l)
	if n := l.Held(); n != 2 {
		t.Fatalf("%d slots taken by two connections, want 2", n)
	}
	for range 2 {
		_ = a.Close()
	}
	if n := l.Held(); n != 1 {
		t.Fatalf("%d slots taken once a connection was closed twice, want 1 (the other's)", n)
	}
	if n := testsupport.MetricValue(t, reg, "open", nil); n != 1 {
		t.Errorf("%v connections counted open, want 1", n)
	}
	c := dialAccept(t, l)
	if n := testsupport.MetricValue(t, reg, "waits", nil); n != 0 {
		t.Errorf("accepting within the bound waited %v times, want 0", n)
	}
	for _, c := range []net.Conn{b, c} {
		_ = c.Close()
	}
	if n := l.Held(); n != 0 {
		t.Errorf("%d slots taken once every connection closed, want 0", n)
	}
}

func TestClosingTheListenerEndsAcceptsWaitForASlot(t *testing.T) {
	l, reg := slotListener(t, 1)
	dialAccept(t, l)
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	testsupport.EventuallyWhy(t, "Accept to wait for a slot", func() (string, bool) {
		n := testsupport.MetricValue(t, reg, "waits", nil)
		return fmt.Sprint(n), n == 1
	})
	_ = l.Close()
	select {
	case err := <-accepted:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept returned %v once the listener closed, want %v", err, net.ErrClosed)
		}
	case <-time.After(testsupport.WaitTimeout):
		t.Fatalf("Accept still waits for a slot %v after the listener closed", testsupport.WaitTimeout)
	}
}
