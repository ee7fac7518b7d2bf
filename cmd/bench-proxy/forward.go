package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// The reference forwarders are what a reverse proxy written in Go costs
// when it does nothing but relay: HTTP/1.1 requests with a Content-Length,
// responses with a Content-Length or chunked, on keep-alive connections,
// round robin over the engines, each message parsed only as far as its
// framing. go-raw reads and writes the connections itself, a goroutine per
// client connection with an engine connection of its own; go-nethttp is
// net/http's server with the same engine connections, pooled. They run as
// this command's child (bench-proxy forward raw|nethttp CONFIG), so that
// their CPU time is measured as nginx's is. They are a yardstick, not a
// proxy: no timeouts, no header checks beyond framing, no errors answered.

// Reference forwarders, by proxy name.
const (
	forwardRaw     = "raw"
	forwardNetHTTP = "nethttp"
)

// maxForwardHead bounds a message head the forwarders read.
const maxForwardHead = 64 << 10

// forwardConfig is a forwarder's configuration file: a "listen ADDR" line
// and an "upstream ADDR" line per engine; # starts a comment.
type forwardConfig struct {
	listen    string
	upstreams []string
}

func readForwardConfig(path string) (forwardConfig, error) {
	var cfg forwardConfig
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, err
	}
	for n, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case len(f) == 2 && f[0] == "listen":
			cfg.listen = f[1]
		case len(f) == 2 && f[0] == "upstream":
			cfg.upstreams = append(cfg.upstreams, f[1])
		default:
			return cfg, fmt.Errorf("%s:%d: want listen ADDR or upstream ADDR", path, n+1)
		}
	}
	if cfg.listen == "" || len(cfg.upstreams) == 0 {
		return cfg, fmt.Errorf("%s: want a listen line and at least one upstream line", path)
	}
	return cfg, nil
}

// runForwarder serves args' configuration (kind, then the file) until its
// listener fails.
func runForwarder(args []string, stderr io.Writer) int {
	if len(args) != 2 || (args[0] != forwardRaw && args[0] != forwardNetHTTP) {
		fmt.Fprintln(stderr, "usage: bench-proxy forward raw|nethttp CONFIG")
		return 2
	}
	cfg, err := readForwardConfig(args[1])
	if err == nil {
		var ln net.Listener
		if ln, err = net.Listen("tcp", cfg.listen); err == nil {
			up := &upstreams{addrs: cfg.upstreams}
			if args[0] == forwardRaw {
				err = serveRaw(ln, up)
			} else {
				err = http.Serve(ln, up)
			}
		}
	}
	fmt.Fprintln(stderr, "bench-proxy forward:", err)
	return 1
}

// upstreams dials the engines in turn and pools idle connections to them.
type upstreams struct {
	addrs []string
	next  atomic.Uint64
	mu    sync.Mutex
	idle  []*engineConn
}

// engineConn is a keep-alive connection to an engine and its buffers.
type engineConn struct {
	net.Conn
	r        *bufio.Reader
	out, msg []byte
}

func (u *upstreams) dial() (*engineConn, error) {
	c, err := net.Dial("tcp", u.addrs[u.next.Add(1)%uint64(len(u.addrs))])
	if err != nil {
		return nil, err
	}
	return &engineConn{Conn: c, r: bufio.NewReader(c)}, nil
}

func (u *upstreams) get() (*engineConn, error) {
	u.mu.Lock()
	if n := len(u.idle); n > 0 {
		c := u.idle[n-1]
		u.idle = u.idle[:n-1]
		u.mu.Unlock()
		return c, nil
	}
	u.mu.Unlock()
	return u.dial()
}

func (u *upstreams) put(c *engineConn) {
	u.mu.Lock()
	u.idle = append(u.idle, c)
	u.mu.Unlock()
}

// serveRaw relays each client connection's messages to an engine
// connection of its own.
func serveRaw(ln net.Listener, up *upstreams) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			e, err := up.dial()
			if err != nil {
				return
			}
			defer e.Close()
			r := bufio.NewReader(c)
			var buf []byte
			for {
				// The request, head and body, in one write.
				var n int64
				if buf, n, err = readHead(r, buf[:0]); err != nil || n < 0 {
					return
				}
				if buf, err = appendBody(buf, r, n); err != nil {
					return
				}
				if _, err = e.Write(buf); err != nil {
					return
				}
				// The response, as it comes.
				if buf, n, err = readHead(e.r, buf[:0]); err != nil {
					return
				}
				if n >= 0 {
					if buf, err = appendBody(buf, e.r, n); err == nil {
						_, err = c.Write(buf)
					}
				} else {
					err = relayChunks(c, e.r, buf)
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// ServeHTTP relays a request through net/http's server.
func (u *upstreams) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength < 0 {
		w.WriteHeader(http.StatusLengthRequired)
		return
	}
	e, err := u.get()
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	e.out = append(e.out[:0], r.Method...)
	e.out = append(e.out, ' ')
	e.out = append(e.out, r.URL.RequestURI()...)
	e.out = append(e.out, " HTTP/1.1\r\nHost: engine\r\n"...)
	if ct := r.Header.Get("Content-Type"); ct != "" {
		e.out = append(e.out, "Content-Type: "...)
		e.out = append(e.out, ct...)
		e.out = append(e.out, "\r\n"...)
	}
	e.out = append(e.out, "Content-Length: "...)
	e.out = strconv.AppendInt(e.out, r.ContentLength, 10)
	e.out = append(e.out, "\r\n\r\n"...)
	if e.out, err = appendBody(e.out, r.Body, r.ContentLength); err == nil {
		_, err = e.Write(e.out)
	}
	var n int64
	if err == nil {
		e.msg, n, err = readHead(e.r, e.msg[:0])
	}
	var status int
	if err == nil {
		status, err = statusOf(e.msg)
	}
	if err != nil {
		e.Close()
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	h := w.Header()
	if ct := headerValue(e.msg, "Content-Type"); ct != "" {
		h["Content-Type"] = []string{ct}
	}
	if n >= 0 {
		h["Content-Length"] = []string{strconv.FormatInt(n, 10)}
		w.WriteHeader(status)
		if e.msg, err = appendBody(e.msg[:0], e.r, n); err == nil {
			_, err = w.Write(e.msg)
		}
	} else {
		w.WriteHeader(status)
		err = eachChunk(e.r, func(data []byte, last bool) error {
			if _, err := w.Write(data); err != nil || !last {
				return err
			}
			return http.NewResponseController(w).Flush()
		})
	}
	if err != nil {
		e.Close()
		return
	}
	u.put(e)
}

// readHead appends a message's head, up to its blank line, to buf and
// returns it with the length of its body: its Content-Length, 0 without
// one, -1 when it is chunked.
func readHead(r *bufio.Reader, buf []byte) ([]byte, int64, error) {
	start, n := len(buf), int64(0)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return buf, 0, err
		}
		buf = append(buf, line...)
		if len(buf)-start > maxForwardHead {
			return buf, 0, errors.New("message head too long")
		}
		if len(line) <= 2 {
			return buf, n, nil
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if n, err = strconv.ParseInt(string(value), 10, 64); err != nil || n < 0 {
				return buf, 0, fmt.Errorf("bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")) && bytes.EqualFold(value, []byte("chunked")):
			n = -1
		}
	}
}

// appendBody appends the n bytes of a body read from r to buf.
func appendBody(buf []byte, r io.Reader, n int64) ([]byte, error) {
	if n > 64<<20 {
		return buf, fmt.Errorf("body of %d bytes", n)
	}
	start := len(buf)
	buf = append(buf, make([]byte, n)...)
	_, err := io.ReadFull(r, buf[start:])
	return buf, err
}

// relayChunks writes head and then the chunks of a chunked body read from
// r to w as they come, framing included, up to the last chunk's trailer.
// Chunks read together are written together.
func relayChunks(w io.Writer, r *bufio.Reader, head []byte) error {
	buf := head
	for {
		var size int64
		var err error
		if buf, _, size, err = appendChunk(buf, r); err != nil {
			return err
		}
		if size > 0 && r.Buffered() > 0 {
			continue
		}
		if _, err := w.Write(buf); err != nil || size == 0 {
			return err
		}
		buf = buf[:0]
	}
}

// eachChunk calls f with the data of each chunk of a chunked body read
// from r, and whether no more of the body has been read yet, and reads the
// body to its end.
func eachChunk(r *bufio.Reader, f func(data []byte, last bool) error) error {
	var buf []byte
	for {
		b, at, size, err := appendChunk(buf[:0], r)
		if buf = b; err != nil || size == 0 {
			return err
		}
		if err := f(buf[at:at+int(size)], r.Buffered() == 0); err != nil {
			return err
		}
	}
}

// appendChunk appends the next chunk of a chunked body read from r to buf,
// framing included, the last chunk with its trailer, and returns buf, where
// the chunk's data starts in it and its size (0 for the last chunk).
func appendChunk(buf []byte, r *bufio.Reader) (_ []byte, at int, size int64, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return buf, 0, 0, err
	}
	if size, err = chunkSize(line); err != nil {
		return buf, 0, 0, err
	}
	buf = append(buf, line...)
	at = len(buf)
	if size == 0 {
		for len(line) > 2 {
			if line, err = r.ReadSlice('\n'); err != nil {
				return buf, 0, 0, err
			}
			buf = append(buf, line...)
		}
		return buf, at, 0, nil
	}
	buf, err = appendBody(buf, r, size+2)
	return buf, at, size, err
}

// chunkSize parses a chunk's size line, extensions aside; a size of 2 GiB
// or more is refused.
func chunkSize(line []byte) (int64, error) {
	s, _, _ := bytes.Cut(bytes.TrimSpace(line), []byte(";"))
	n, err := strconv.ParseUint(string(s), 16, 31)
	if err != nil {
		return 0, fmt.Errorf("%w: chunk size %q", errProtocol, line)
	}
	return int64(n), nil
}

// statusOf returns the status code of a response head.
func statusOf(head []byte) (int, error) {
	_, rest, _ := bytes.Cut(head, []byte(" "))
	if len(rest) < 3 {
		return 0, errors.New("no status line")
	}
	return strconv.Atoi(string(rest[:3]))
}

// headerValue returns the value of a head's field name, "" when absent.
func headerValue(head []byte, name string) string {
	for len(head) > 0 {
		line := head
		if i := bytes.IndexByte(head, '\n'); i >= 0 {
			line, head = head[:i], head[i+1:]
		} else {
			head = nil
		}
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(k, []byte(name)) {
			return string(bytes.TrimSpace(v))
		}
	}
	return ""
}
