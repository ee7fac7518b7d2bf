// Package connlimit bounds the connections a listener holds open.
//
// A Listener takes a slot before each accept and its connection gives the
// slot back when first closed, however it is closed (twice by net/http,
// by a handler that hijacked it, by a timeout). At the bound Accept waits
// for a slot before accepting, so that new connections wait in the
// kernel's listen backlog (bounded by net.core.somaxconn) rather than being
// accepted and dropped; closing the Listener ends the wait, so that a
// server's shutdown does not hang on a full listener.
package connlimit

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Listener is a net.Listener holding at most a given number of
// connections open.
type Listener struct {
	net.Listener
	slots     chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
	waits     prometheus.Counter
	open      prometheus.Gauge
}

// New returns ln holding at most n connections open (n ≥ 1), counting in
// waits each time Accept found the bound reached and had to wait, and in
// open the connections open.
func New(ln net.Listener, n int, waits prometheus.Counter, open prometheus.Gauge) *Listener {
	return &Listener{Listener: ln, slots: make(chan struct{}, max(n, 1)), closed: make(chan struct{}), waits: waits, open: open}
}

// Accept waits for a slot, then accepts a connection, which gives the slot
// back when closed. It returns net.ErrClosed once the Listener is closed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	default:
		l.waits.Inc()
		select {
		case l.slots <- struct{}{}:
		case <-l.closed:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	l.open.Inc()
	return &Conn{Conn: c, l: l}, nil
}

// Close closes the listener and ends Accept's wait for a slot.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Held returns the number of slots taken: connections open, and one being
// accepted.
func (l *Listener) Held() int { return len(l.slots) }

// Conn is a connection a Listener accepted.
type Conn struct {
	net.Conn
	l      *Listener
	closed atomic.Bool
}

// Close closes the connection and, the first time, gives its slot back.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	if !c.closed.Swap(true) {
		c.l.open.Dec()
		<-c.l.slots
	}
	return err
}

// CloseWrite half-closes a TCP connection, as net/http does before closing
// one it answered with Connection: close.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
