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
// whether a message is there, and asking consumes the signal. A socket
// that ZMQ_EVENTS found empty, or whose receive found nothing (the caller
// reports those with Drained), is signalled again by its next message; any
// other may hold a message whose signal was consumed already. So after the
// runtime's readiness flag is reset, and before it parks, Poll asks
// ZMQ_EVENTS of the sockets of the second kind and of those whose signal
// one epoll_wait on its instance finds: a signal sent after the question
// wakes it. A question costs libzmq two system calls (its fork check and a
// poll of the socket's mailbox), the epoll_wait one for all the sockets.
// A Poller belongs to one goroutine, as its sockets do.
type Poller struct {
	socks []*zmq.Socket
	// quiet[i] is set while socks[i] holds no message its ZMQ_FD would not
	// signal: ZMQ_EVENTS said it held none, or the caller reported it
	// drained, and nothing was done on it since.
	quiet []bool
	// signalled[i] is set while check handles a signal of socks[i].
	signalled []bool
	events    []syscall.EpollEvent
	epfd      int
	ep        *os.File
	rc        syscall.RawConn
	ready     []zmq.Polled
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
			// signal is unread. The event's data is the socket's index.
			ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(len(p.socks))}
			err = syscall.EpollCtl(fd, syscall.EPOLL_CTL_ADD, zfd, &ev)
		}
		if err != nil {
			_ = syscall.Close(fd)
			return nil, fmt.Errorf("zmqwire: watch %v: %w", s, err)
		}
		p.socks = append(p.socks, s)
	}
	p.quiet = make([]bool, len(p.socks))
	p.signalled = make([]bool, len(p.socks))
	p.events = make([]syscall.EpollEvent, len(p.socks))
	p.epfd = fd
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

// Drained tells the Poller that a receive on s, one of its sockets, found
// nothing (ZeroMQ's EAGAIN) and that nothing was done on s since: until the
// next message signals it, Poll need not ask it. Anything else done on s
// before the next Poll (a send, a receive that found a message, an option
// set) breaks that promise and may leave a message unseen until the wait
// runs out. A nil Poller's Drained does nothing.
func (p *Poller) Drained(s *zmq.Socket) {
	if p == nil {
		return
	}
	for i, ps := range p.socks {
		if ps == s {
			p.quiet[i] = true
		}
	}
}

// check asks ZMQ_EVENTS of the sockets that may hold a message: those not
// known to be quiet, and those whose signal epoll finds.
func (p *Poller) check() ([]zmq.Polled, error) {
	p.ready = p.ready[:0]
	if len(p.socks) == 0 {
		return p.ready, nil
	}
	clear(p.signalled)
	n, err := syscall.EpollWait(p.epfd, p.events, 0)
	switch {
	case err == syscall.EINTR:
		clear(p.quiet)
	case err != nil:
		return nil, fmt.Errorf("zmqwire: epoll_wait: %w", err)
	}
	for _, ev := range p.events[:max(n, 0)] {
		p.signalled[ev.Fd] = true
	}
	for i, s := range p.socks {
		if p.quiet[i] && !p.signalled[i] {
			continue
		}
		ev, err := s.GetEvents()
		if err != nil {
			p.quiet[i] = false
			return nil, err
		}
		p.quiet[i] = ev&zmq.POLLIN == 0
		if !p.quiet[i] {
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
