// Package rawsock reads and writes the sockets of TCP connections with raw
// system calls, for the connections a proxy relays requests over.
//
// The net package's reads and writes tell the Go scheduler around every
// system call that the goroutine may block in the kernel. On a socket in
// non-blocking mode, as every socket of the net package is, a read or a
// write never blocks: it moves what it can and returns. The notice still
// costs: the runtime's monitor thread (sysmon), asleep while every P is
// idle, is woken by the first system call after such a pause, and then
// polls every 20 µs until it finds every P idle again; while the process
// is busy, it takes the P of a goroutine it sees in the same system call
// twice and hands the P to another thread. A proxy relaying one request at a time pauses between every
// request and the next; profiled at one client, the monitor's wake-ups were
// a quarter of the gateway's CPU time.
//
// A Conn reads and writes through the connection's syscall.RawConn, which
// waits for readiness in the runtime's network poller and keeps the
// connection's deadlines, with system calls the scheduler is not told
// about. Such a call holds its thread's P until the kernel returns, so
// each moves at most MaxIO bytes: a garbage collection's stop-the-world
// phase waits for one at most as long as copying MaxIO bytes takes. In an
// execution trace (the admin listener's /debug/pprof/trace), the time of
// such a call shows as the goroutine running, not as a system call.
package rawsock

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// MaxIO is the most bytes one system call of a Conn reads or writes.
const MaxIO = 256 << 10

// Conn is a TCP connection whose Read, Write and WriteTwo use raw system
// calls; its other methods are those of the connection it wraps. Like a
// net.Conn, it is safe for concurrent use: reads take turns, as do
// writes.
type Conn struct {
	net.Conn
	rc syscall.RawConn

	// rmu guards the state of the read in progress, wmu that of the
	// write, which readFn and writeFn read and set.
	rmu    sync.Mutex
	rbuf   []byte
	rn     int
	rerrno syscall.Errno
	readFn func(fd uintptr) bool

	wmu     sync.Mutex
	wbufs   [2][]byte
	wn      int64
	werrno  syscall.Errno
	writeFn func(fd uintptr) bool
}

// Wrap returns c as a Conn when c is a *net.TCPConn, else c itself.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	rs := &Conn{Conn: tc, rc: rc}
	rs.readFn = rs.read
	rs.writeFn = rs.write
	return rs
}

// Read reads up to len(p) bytes, as net.Conn's Read does.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	c.rbuf, c.rn, c.rerrno = p[:min(len(p), MaxIO)], 0, 0
	err := c.rc.Read(c.readFn)
	n, errno := c.rn, c.rerrno
	c.rbuf = nil
	c.rmu.Unlock()
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (c *Conn) read(fd uintptr) bool {
	for {
		n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&c.rbuf[0])), uintptr(len(c.rbuf)))
		switch errno {
		case 0:
			c.rn = int(n)
			raceRead(fd, c.rbuf[:n])
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		c.rerrno = errno
		return true
	}
}

// Write writes all of p, as net.Conn's Write does.
func (c *Conn) Write(p []byte) (int, error) {
	n, err := c.WriteTwo(p, nil)
	return int(n), err
}

// WriteTwo writes a then b, both whole, with one system call when the
// socket takes them at once (writev).
func (c *Conn) WriteTwo(a, b []byte) (int64, error) {
	if len(a)+len(b) == 0 {
		return 0, nil
	}
	c.wmu.Lock()
	c.wbufs, c.wn, c.werrno = [2][]byte{a, b}, 0, 0
	err := c.rc.Write(c.writeFn)
	n, errno := c.wn, c.werrno
	c.wbufs = [2][]byte{}
	c.wmu.Unlock()
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case errno != 0:
		return n, c.opError("write", os.NewSyscallError("writev", errno))
	}
	return n, nil
}

func (c *Conn) write(fd uintptr) bool {
	for {
		var iov [2]syscall.Iovec
		var sent [2][]byte // what this call may send of each buffer
		k, room := 0, MaxIO
		for i, b := range c.wbufs {
			if len(b) == 0 || room == 0 {
				continue
			}
			b = b[:min(len(b), room)]
			sent[i] = b
			iov[k].Base = &b[0]
			iov[k].SetLen(len(b))
			room -= len(b)
			k++
		}
		if k == 0 {
			return true
		}
		raceWrite(fd, sent[0], sent[1])
		n, _, errno := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(k))
		switch errno {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			c.werrno = errno
			return true
		}
		c.wn += int64(n)
		for i := range c.wbufs {
			m := min(int(n), len(c.wbufs[i]))
			c.wbufs[i] = c.wbufs[i][m:]
			n -= uintptr(m)
		}
	}
}

// SyscallConn returns the raw connection the Conn reads and writes
// through, for calls of the caller's own (a peek at the socket).
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }

// CloseWrite shuts down the writing side of the connection.
func (c *Conn) CloseWrite() error { return c.Conn.(*net.TCPConn).CloseWrite() }

// opError wraps err as the net package wraps its connections' errors;
// errors of the raw connection's own (a deadline, a closed connection)
// are unwrapped first.
func (c *Conn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Listener wraps the connections a net.Listener accepts with Wrap.
type Listener struct{ net.Listener }

// Accept waits for and returns the next connection, wrapped.
func (l Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Wrap(c), nil
}
