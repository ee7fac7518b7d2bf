package testsupport

import (
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
)

// Relay forwards the TCP connections it accepts on a loopback port to a
// target address, and cuts the link as a network partition or a dead
// peer would: Cut closes every relayed connection and the port, so that
// dialling it is refused, and Restore listens on the same port again. The
// target and whatever state it keeps are untouched by either. A relay is
// closed when the test ends.
type Relay struct {
	t      testing.TB
	target string
	port   int

	mu    sync.Mutex
	ln    net.Listener // nil while cut
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewRelay starts relaying a new loopback port to target (host:port).
func NewRelay(t testing.TB, target string) *Relay {
	t.Helper()
	r := &Relay{t: t, target: target, conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("relay to %s: %v", target, err)
	}
	r.port = ln.Addr().(*net.TCPAddr).Port
	r.serve(ln)
	t.Cleanup(func() {
		r.Cut()
		r.wg.Wait()
	})
	return r
}

// Port is the loopback port the relay listens on.
func (r *Relay) Port() int { return r.port }

// Addr is the relay's address, 127.0.0.1:Port.
func (r *Relay) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Cut closes the relay's port and every connection it relays.
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		_ = r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		_ = c.Close()
	}
	clear(r.conns)
}

// Restore listens on the relay's port again after Cut.
func (r *Relay) Restore() {
	r.t.Helper()
	ln, err := net.Listen("tcp", r.Addr())
	if err != nil {
		r.t.Fatalf("relay to %s: listen again on %s: %v", r.target, r.Addr(), err)
	}
	r.serve(ln)
}

func (r *Relay) serve(ln net.Listener) {
	r.mu.Lock()
	r.ln = ln
	r.mu.Unlock()
	r.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", r.target)
			if err != nil {
				_ = in.Close()
				continue
			}
			if !r.track(ln, in, out) {
				return
			}
			r.wg.Go(func() { r.pipe(in, out) })
			r.wg.Go(func() { r.pipe(out, in) })
		}
	})
}

// track records a relayed pair, unless the relay was cut since ln accepted
// it; then it closes both and returns false.
func (r *Relay) track(ln net.Listener, in, out net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != ln {
		_ = in.Close()
		_ = out.Close()
		return false
	}
	r.conns[in], r.conns[out] = struct{}{}, struct{}{}
	return true
}

// pipe copies from src to dst until either ends, then closes and forgets
// both.
func (r *Relay) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	r.mu.Lock()
	delete(r.conns, dst)
	delete(r.conns, src)
	r.mu.Unlock()
}
