package zmqwire

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Poller waits for ZeroMQ sockets to hold a message, as zmq_poll does, but
// in the Go runtime's network poller: an epoll instance watches the
// sockets' ZMQ_FD descriptors, and Poll parks the goroutine on it. A
// goroutine blocked in zmq_poll holds a thread in a C call: a thread per
// engine followed, up to the Go runtime's limit of 10,000, and a hand-off
// back to the scheduler for every batch.
//
// ZMQ_FD only says that a socket's state may have changed: ZMQ_EVENTS says
// whether a message is there, and reading it consumes the signal. Poll asks
// ZMQ_EVENTS of every socket after the runtime's readiness flag is reset
// and before it parks, so that a signal sent after the question wakes it.
// A Poller belongs to one goroutine, as its sockets do.
type Poller struct {
	socks []*zmq.Socket
	ep    *os.File
	rc    syscall.RawConn
	ready []zmq.Polled
}

// NewPoller returns a Poller of socks, in that order; nil entries are left
// out. Close releases it; closing the sockets does not.
func NewPoller(socks ...*zmq.Socket) (*Poller, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("zmqwire: create an epoll instance: %w", err)
	}
	p := &Poller{}
	for _, s := range socks {
		if s == nil {
			continue
		}
		zfd, err := s.GetFd()
		if err == nil {
			// Level-triggered: the instance is readable while a socket's
			// signal is unread.
			ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(zfd)}
			err = syscall.EpollCtl(fd, syscall.EPOLL_CTL_ADD, zfd, &ev)
		}
		if err != nil {
			_ = syscall.Close(fd)
			return nil, fmt.Errorf("zmqwire: watch %v: %w", s, err)
		}
		p.socks = append(p.socks, s)
	}
	// A non-blocking descriptor joins the runtime's poller.
	if err := syscall.SetNonblock(fd, true); err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("zmqwire: epoll instance: %w", err)
	}
	p.ep = os.NewFile(uintptr(fd), "zmq-poller")
	if p.rc, err = p.ep.SyscallConn(); err != nil {
		_ = p.ep.Close()
		return nil, fmt.Errorf("zmqwire: epoll instance: %w", err)
	}
	return p, nil
}

// Poll waits up to timeout (not at all when it is not positive) for a
// socket to hold a message, and returns those that do, in the Poller's
// order; none when the time ran out. The slice is reused by the next Poll.
func (p *Poller) Poll(timeout time.Duration) ([]zmq.Polled, error) {
	if timeout <= 0 {
		return p.check()
	}
	if err := p.ep.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("zmqwire: poll: %w", err)
	}
	var ready []zmq.Polled
	var serr error
	asked := false
	err := p.rc.Read(func(uintptr) bool {
		asked = true
		ready, serr = p.check()
		return serr != nil || len(ready) > 0
	})
	switch {
	case serr != nil:
		return nil, serr
	case errors.Is(err, os.ErrDeadlineExceeded):
		if !asked {
			// The deadline passed before the sockets were asked once.
			return p.check()
		}
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("zmqwire: poll: %w", err)
	}
	return ready, nil
}

// check asks every socket whether it holds a message.
func (p *Poller) check() ([]zmq.Polled, error) {
	p.ready = p.ready[:0]
	for _, s := range p.socks {
		ev, err := s.GetEvents()
		if err != nil {
			return nil, err
		}
		if ev&zmq.POLLIN != 0 {
			p.ready = append(p.ready, zmq.Polled{Socket: s, Events: ev})
		}
	}
	return p.ready, nil
}

// Close releases the epoll instance. A nil Poller's Close does nothing.
func (p *Poller) Close() error {
	if p == nil {
		return nil
	}
	return p.ep.Close()
}
