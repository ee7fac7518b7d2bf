//go:build !linux

package zmqwire

import (
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Poller waits for ZeroMQ sockets to hold a message with zmq_poll: without
// epoll, the goroutine holds a thread in C while it waits (see the Linux
// Poller).
type Poller struct{ p *zmq.Poller }

// NewPoller returns a Poller of socks, in that order; nil entries are left
// out.
func NewPoller(socks ...*zmq.Socket) (*Poller, error) {
	p := zmq.NewPoller()
	for _, s := range socks {
		if s != nil {
			p.Add(s, zmq.POLLIN)
		}
	}
	return &Poller{p: p}, nil
}

// Poll waits up to timeout (not at all when it is not positive) for a
// socket to hold a message, and returns those that do; none when the time
// ran out.
func (p *Poller) Poll(timeout time.Duration) ([]zmq.Polled, error) {
	return p.p.Poll(max(timeout, 0))
}

// Drained is the Linux Poller's: zmq_poll asks every socket at every Poll,
// so there is nothing to remember here.
func (p *Poller) Drained(*zmq.Socket) {}

// Close releases the Poller. A nil Poller's Close does nothing.
func (p *Poller) Close() error { return nil }
