package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/internal/rawsock"
)

// podPool sends requests to pods over keep-alive HTTP/1.1 connections it
// keeps per pod address, and reads their responses, all in the goroutine
// of the request: unlike net/http's Transport it starts no goroutine per
// connection and hands nothing between goroutines, and it reads a response
// without building an http.Response.
//
// A connection returns to the pool once its response was read to its end
// and the pod did not ask to close it; the pool keeps at most maxIdle
// connections per address, closes those idle for longer than idleTTL (see
// sweep), and checks that a connection idle for a while was not closed by
// the pod (vLLM's server closes idle connections after 5 s) before it
// reuses it, so that a request is not sent on a connection the pod has
// closed.
type podPool struct {
	dialer  net.Dialer
	maxIdle int
	idleTTL time.Duration
	log     klog.Logger

	mu     sync.Mutex
	idle   map[string][]*podConn // by address, the most recently used last
	closed bool
}

// checkIdleAfter is how long a connection must have been idle before it is
// checked for a close by the pod (a system call): engines close idle
// connections after seconds (vLLM after 5 s), so one used moments ago is
// open unless the engine just died, which fails the request as any
// request in flight to it fails.
const checkIdleAfter = 500 * time.Millisecond

// podConnReadBuffer is the read buffer of a connection to a pod: room for
// a response's headers and a typical answer in one read.
const podConnReadBuffer = 32 << 10

// maxResponseHeaderBytes bounds the header block of a pod's response, and
// the trailers of a chunked body.
const maxResponseHeaderBytes = 256 << 10

// maxInformationalResponses bounds the 1xx responses that may precede a
// pod's response.
const maxInformationalResponses = 8

func newPodPool(connectTimeout time.Duration, maxIdle int, idleTTL time.Duration, log klog.Logger) *podPool {
	return &podPool{
		dialer:  net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second},
		maxIdle: maxIdle,
		idleTTL: idleTTL,
		log:     log,
		idle:    map[string][]*podConn{},
	}
}

// podConn is one connection to a pod.
type podConn struct {
	pool *podPool
	addr string
	// nc reads and writes with raw system calls (a *rawsock.Conn) unless
	// the dial returned something other than a TCP connection.
	nc  net.Conn
	raw syscall.RawConn // to check an idle connection without reading it
	dr  deadlineReader
	br  *bufio.Reader
	// reused is set once a response was read on the connection.
	reused    bool
	idleSince time.Time
}

// deadlineReader reads a connection, renewing its read deadline before
// each read when idle is set: idle then bounds every wait for more bytes,
// and end, when set, the whole response: no deadline is set beyond it, and
// a read that meets it fails with errResponseTimeout.
type deadlineReader struct {
	nc   net.Conn
	idle time.Duration
	end  time.Time
}

// errResponseTimeout reports a response that did not end within its
// bound, Config.ResponseTimeout.
var errResponseTimeout = errors.New("the response did not end within its bound")

func (d *deadlineReader) Read(p []byte) (int, error) {
	if d.idle <= 0 {
		return d.nc.Read(p)
	}
	deadline := time.Now().Add(d.idle)
	atEnd := !d.end.IsZero() && deadline.After(d.end)
	if atEnd {
		deadline = d.end
	}
	if err := d.nc.SetReadDeadline(deadline); err != nil {
		return 0, err
	}
	n, err := d.nc.Read(p)
	if atEnd && errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w: %w", errResponseTimeout, err)
	}
	return n, err
}

// errPoolClosed reports a request sent after the pool was closed.
var errPoolClosed = errors.New("the gateway is shutting down")

// conn returns an idle connection to addr that the pod has not closed, or
// a new one, dialled under ctx and the connect timeout.
func (p *podPool) conn(ctx context.Context, addr string) (*podConn, error) {
	now := time.Now()
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errPoolClosed
		}
		conns := p.idle[addr]
		if len(conns) == 0 {
			p.mu.Unlock()
			break
		}
		c := conns[len(conns)-1]
		conns[len(conns)-1] = nil
		p.idle[addr] = conns[:len(conns)-1]
		p.mu.Unlock()
		if idle := now.Sub(c.idleSince); idle < p.idleTTL && (idle < checkIdleAfter || c.open()) {
			return c, nil
		}
		c.close()
	}
	nc, err := p.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &podConn{pool: p, addr: addr, nc: rawsock.Wrap(nc)}
	if sc, ok := c.nc.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	c.dr.nc = c.nc
	c.br = bufio.NewReaderSize(&c.dr, podConnReadBuffer)
	return c, nil
}

// open reports whether the pod has neither closed the idle connection nor
// sent anything on it, peeking at it without blocking.
func (c *podConn) open() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	if c.raw == nil {
		return true
	}
	alive := false
	var b [1]byte
	err := c.raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = n < 0 && (err == syscall.EAGAIN || err == syscall.EWOULDBLOCK)
		return true
	})
	return err == nil && alive
}

// release returns the connection to its pool, or closes it when the pool
// has enough idle connections to the pod or is closed, or when the pod sent
// bytes beyond the response just read: no request asked for them, and the
// next request on the connection would read them as its response (a
// connection idle for long enough is checked for them in open, one just
// used is not). net/http's Transport drops such a connection too.
func (c *podConn) release() {
	p := c.pool
	if n := c.br.Buffered(); n > 0 {
		if l := p.log.V(2); l.Enabled() {
			l.Info("Closing a connection to a pod that sent more than its response", "pod", c.addr, "bytes", n)
		}
		c.close()
		return
	}
	c.reused = true
	c.idleSince = time.Now()
	p.mu.Lock()
	if !p.closed && len(p.idle[c.addr]) < p.maxIdle {
		p.idle[c.addr] = append(p.idle[c.addr], c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		c.close()
	}
}

func (c *podConn) close() { _ = c.nc.Close() }

// Close is close, for leanhttp.GoneCloser.
func (c *podConn) Close() error { return c.nc.Close() }

// sweep closes the connections idle for longer than the pool's idle TTL.
func (p *podPool) sweep(now time.Time) {
	var stale []*podConn
	p.mu.Lock()
	for addr, conns := range p.idle {
		// The oldest are first.
		n := 0
		for n < len(conns) && now.Sub(conns[n].idleSince) >= p.idleTTL {
			n++
		}
		if n == 0 {
			continue
		}
		stale = append(stale, conns[:n]...)
		if n == len(conns) {
			delete(p.idle, addr)
		} else {
			p.idle[addr] = append(conns[:0:0], conns[n:]...)
		}
	}
	p.mu.Unlock()
	for _, c := range stale {
		c.close()
	}
}

// Run sweeps the pool every half of its idle TTL until ctx ends, then
// closes it: every idle connection is closed, and so is every connection
// released after.
func (p *podPool) Run(ctx context.Context) error {
	t := time.NewTicker(max(p.idleTTL/2, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.close()
			return nil
		case now := <-t.C:
			p.sweep(now)
		}
	}
}

// close closes the idle connections and makes the pool refuse new ones.
func (p *podPool) close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = map[string][]*podConn{}
	p.mu.Unlock()
	for _, conns := range idle {
		for _, c := range conns {
			c.close()
		}
	}
}

// send writes the request, head then body, in one system call when it
// can; the pod must answer within firstByte of the write's start, and end
// its response within total, by c.dr.end (see deadlineReader).
func (c *podConn) send(head, body []byte, firstByte, total time.Duration) error {
	start := time.Now()
	if err := c.nc.SetDeadline(start.Add(min(firstByte, total))); err != nil {
		return err
	}
	c.dr.idle, c.dr.end = 0, start.Add(total)
	if rs, ok := c.nc.(*rawsock.Conn); ok {
		_, err := rs.WriteTwo(head, body)
		return err
	}
	bufs := net.Buffers{head, body}
	_, err := bufs.WriteTo(c.nc)
	return err
}

// podResponse is what the gateway reads of a pod's response before its
// body: the status, the headers, and how the body is framed. Its storage
// is reused from one response to the next.
type podResponse struct {
	status int
	// headerBytes holds the header lines, each "Name: value" without its
	// line ending, names checked and values trimmed; fields locate them.
	headerBytes []byte
	fields      []headerField
	// contentType is the Content-Type header's value.
	contentType string
	body        podBody
	// keepAlive is unset when the pod closes the connection after the
	// response.
	keepAlive bool
}

// headerField locates one header line in podResponse.headerBytes.
type headerField struct {
	start, colon, end int
}

// name and value return a header line's name and value.
func (r *podResponse) name(f headerField) []byte  { return r.headerBytes[f.start:f.colon] }
func (r *podResponse) value(f headerField) []byte { return r.headerBytes[f.colon+2 : f.end] }

// errBadResponse reports a response that breaks HTTP/1.1.
var errBadResponse = errors.New("malformed response")

// readResponse reads the status and the headers of the response to the
// request sent; idle then bounds every wait for the body. The header
// lines are copied into res, whose storage is reused.
func (c *podConn) readResponse(res *podResponse, idle time.Duration) error {
	res.status, res.body = 0, podBody{}
	for informational := 0; ; informational++ {
		if informational > maxInformationalResponses {
			return fmt.Errorf("%w: more than %d informational responses", errBadResponse, maxInformationalResponses)
		}
		if err := c.readHead(res); err != nil {
			return err
		}
		// Informational responses (100 Continue, 103 Early Hints) precede
		// the response.
		if res.status >= 200 || res.status == 101 {
			break
		}
	}
	if res.status == 101 {
		return fmt.Errorf("%w: 101 Switching Protocols to a POST", errBadResponse)
	}
	if err := c.nc.SetReadDeadline(time.Time{}); err != nil {
		return err
	}
	c.dr.idle = idle
	res.body.conn = c
	return nil
}

// readHead reads one status line and header block.
func (c *podConn) readHead(res *podResponse) error {
	res.fields = res.fields[:0]
	res.headerBytes = res.headerBytes[:0]
	res.contentType = ""
	res.keepAlive = true
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return err
	}
	// HTTP/1.x 200 Reason
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' ||
		(len(line) > 12 && line[12] != ' ' && line[12] != '\r' && line[12] != '\n') {
		return fmt.Errorf("%w: status line %q", errBadResponse, clip(line))
	}
	http10 := line[7] == '0'
	res.keepAlive = !http10
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil || status < 100 {
		return fmt.Errorf("%w: status line %q", errBadResponse, clip(line))
	}
	res.status = status
	length, chunked := int64(-1), false
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return fmt.Errorf("%w: a header line longer than %d bytes", errBadResponse, c.br.Size())
			}
			return err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		if len(res.headerBytes)+len(line) > maxResponseHeaderBytes {
			return fmt.Errorf("%w: headers longer than %d bytes", errBadResponse, maxResponseHeaderBytes)
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || !validHeaderName(name) {
			return fmt.Errorf("%w: header line %q", errBadResponse, clip(line))
		}
		value = bytes.Trim(value, " \t")
		if !validHeaderValue(value) {
			return fmt.Errorf("%w: a control byte in header line %q", errBadResponse, clip(line))
		}
		f := headerField{start: len(res.headerBytes), colon: len(res.headerBytes) + len(name)}
		res.headerBytes = append(append(append(res.headerBytes, name...), ": "...), value...)
		f.end = len(res.headerBytes)
		res.fields = append(res.fields, f)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || n < 0 || (length >= 0 && n != length) {
				return fmt.Errorf("%w: Content-Length %q", errBadResponse, clip(value))
			}
			length = n
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			// As under net/http, one field saying chunked alone: the
			// gateway drops the field, so another coding would reach the
			// client as if the body were not coded.
			if chunked || !bytes.EqualFold(value, []byte("chunked")) {
				return fmt.Errorf("%w: unsupported Transfer-Encoding %q", errBadResponse, clip(value))
			}
			chunked = true
		case bytes.EqualFold(name, []byte("Connection")):
			for tok := range bytes.SplitSeq(value, []byte(",")) {
				switch tok = bytes.TrimSpace(tok); {
				case bytes.EqualFold(tok, []byte("close")):
					res.keepAlive = false
				case http10 && bytes.EqualFold(tok, []byte("keep-alive")):
					res.keepAlive = true
				}
			}
		case bytes.EqualFold(name, []byte("Content-Type")):
			res.contentType = string(value)
		}
	}
	if http10 && chunked {
		// HTTP/1.0 has no Transfer-Encoding: its framing is not to be
		// trusted, and the connection closes after it (RFC 9112, 6.1).
		res.keepAlive = false
	}
	res.body = podBody{}
	switch {
	case status == 204 || status == 304 || status < 200:
		// No body, whatever the framing headers say (RFC 9112, 6.3).
		res.body.mode = bodyLength
	case chunked:
		res.body.mode = bodyChunked
	case length >= 0:
		res.body.mode, res.body.remaining = bodyLength, length
	default:
		res.body.mode = bodyUntilClose
		res.keepAlive = false
	}
	return nil
}

// validHeaderName reports whether name is an HTTP token.
func validHeaderName(name []byte) bool {
	if len(name) == 0 {
		return false
	}
	for _, c := range name {
		if c <= ' ' || c >= 0x7f || bytes.IndexByte([]byte(`"(),/:;<=>?@[\]{}`), c) >= 0 {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether a header value holds no control byte
// but HTAB, as RFC 9110 (5.5) has it and net/http checks: a NUL or a bare
// CR relayed to a client could be read there as the end of the field.
func validHeaderValue(v []byte) bool {
	for _, c := range v {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// clip returns at most the first 64 bytes of b, for an error message.
func clip(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

// Framings of a response body.
const (
	bodyLength     = iota // Content-Length bytes (none for 204 and 304)
	bodyChunked           // chunked transfer coding
	bodyUntilClose        // until the pod closes the connection
)

// podBody reads a response body as its framing says, from the connection
// the response came on; it returns io.EOF at the body's proper end and
// io.ErrUnexpectedEOF when the connection ends before.
type podBody struct {
	conn      *podConn
	mode      int
	remaining int64 // bodyLength: bytes left; bodyChunked: of the chunk
	done      bool
	// chunkEnded is set between a chunk's data and its line ending.
	chunkEnded bool
	// err is a framing error met while looking ahead, returned by the
	// next Read.
	err error
}

func (b *podBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.done {
		return 0, io.EOF
	}
	br := b.conn.br
	switch b.mode {
	case bodyLength:
		if b.remaining == 0 {
			b.done = true
			return 0, io.EOF
		}
		if int64(len(p)) > b.remaining {
			p = p[:b.remaining]
		}
		n, err := br.Read(p)
		b.remaining -= int64(n)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if b.remaining == 0 && err == nil {
			b.done = true
		}
		return n, err
	case bodyUntilClose:
		n, err := br.Read(p)
		if err == io.EOF {
			b.done = true
		}
		return n, err
	}
	if b.remaining == 0 {
		if err := b.nextChunk(); err != nil {
			return 0, err
		}
		if b.done {
			return 0, io.EOF
		}
	}
	if int64(len(p)) > b.remaining {
		p = p[:b.remaining]
	}
	n, err := br.Read(p)
	b.remaining -= int64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if b.remaining == 0 {
		b.chunkEnded = true
	}
	return n, err
}

// nextChunk reads the line ending of the chunk read and the size line of
// the next one; a chunk of size 0 ends the body, after its trailers, which
// are read and dropped.
func (b *podBody) nextChunk() error {
	br := b.conn.br
	if b.chunkEnded {
		if err := crlf(br); err != nil {
			return err
		}
		b.chunkEnded = false
	}
	// A size line longer than the read buffer fails ReadSlice: the buffer
	// bounds it, extensions included.
	line, err := br.ReadSlice('\n')
	if err != nil {
		return unexpected(err, "chunk size line")
	}
	line = bytes.TrimRight(line, "\r\n")
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(line)), 16, 63)
	if err != nil {
		return fmt.Errorf("%w: chunk size %q", errBadResponse, clip(line))
	}
	if n > 0 {
		b.remaining = int64(n)
		return nil
	}
	for trailers := 0; ; {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return unexpected(err, "trailer")
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			b.done = true
			return nil
		}
		if trailers += len(line); trailers > maxResponseHeaderBytes {
			return fmt.Errorf("%w: trailers longer than %d bytes", errBadResponse, maxResponseHeaderBytes)
		}
	}
}

// crlf reads the line ending after a chunk's data.
func crlf(br *bufio.Reader) error {
	c, err := br.ReadByte()
	if err == nil && c == '\r' {
		c, err = br.ReadByte()
	}
	if err != nil {
		return unexpected(err, "chunk end")
	}
	if c != '\n' {
		return fmt.Errorf("%w: chunk data longer than its size", errBadResponse)
	}
	return nil
}

// unexpected turns the end of the connection within a body's framing into
// io.ErrUnexpectedEOF, and reports a line beyond the read buffer.
func unexpected(err error, what string) error {
	switch {
	case err == io.EOF:
		return io.ErrUnexpectedEOF
	case errors.Is(err, bufio.ErrBufferFull):
		return fmt.Errorf("%w: %s too long", errBadResponse, what)
	}
	return err
}

// buffered returns how many bytes of the body can be read without waiting
// for the pod: those of the current chunk (or of the body) that the
// connection's buffer holds, the next chunk's when its size line is there.
func (b *podBody) buffered() int {
	if b.done || b.err != nil {
		return 0
	}
	br := b.conn.br
	switch b.mode {
	case bodyUntilClose:
		return br.Buffered()
	case bodyLength:
		return int(min(b.remaining, int64(br.Buffered())))
	}
	if b.remaining == 0 {
		if !b.sizeLineBuffered() {
			return 0
		}
		if b.err = b.nextChunk(); b.err != nil || b.done {
			return 0
		}
	}
	return int(min(b.remaining, int64(br.Buffered())))
}

// ended reports that the body was read to its proper end.
func (b *podBody) ended() bool { return b.done && b.err == nil }

// sizeLineBuffered reports whether the connection's buffer holds the end
// of the chunk read, if any, and the whole size line of the next chunk:
// and, when that chunk is the last, its trailers.
func (b *podBody) sizeLineBuffered() bool {
	br := b.conn.br
	p, _ := br.Peek(br.Buffered())
	if b.chunkEnded {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			return false
		}
		p = p[i+1:]
	}
	i := bytes.IndexByte(p, '\n')
	if i < 0 {
		return false
	}
	size := bytes.TrimSpace(bytes.TrimRight(p[:i], "\r\n"))
	if j := bytes.IndexByte(size, ';'); j >= 0 {
		size = bytes.TrimSpace(size[:j])
	}
	if len(bytes.TrimLeft(size, "0")) > 0 {
		return true
	}
	// The last chunk: its trailers end with an empty line.
	for p = p[i+1:]; ; {
		j := bytes.IndexByte(p, '\n')
		if j < 0 {
			return false
		}
		if len(bytes.TrimRight(p[:j], "\r")) == 0 {
			return true
		}
		p = p[j+1:]
	}
}

// finish ends the response's use of its connection: the connection goes
// back to the pool when the body was read to its end and the pod keeps it
// open, and is closed otherwise.
func (r *podResponse) finish() {
	c := r.body.conn
	if c == nil {
		return
	}
	r.body.conn = nil
	if r.body.mode == bodyLength && r.body.remaining == 0 {
		r.body.done = true
	}
	if r.body.done && r.keepAlive {
		c.release()
		return
	}
	c.close()
}
