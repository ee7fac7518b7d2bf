// Package leanhttp serves a few hot HTTP/1.1 endpoints with less work per
// request than net/http's server, and hands everything else to net/http.
//
// A Server reads each request's head itself. When the request line is one
// it was told to serve ("POST /v1/completions HTTP/1.1", say) and the head's
// framing is plain (one Host, at most one Content-Length, no
// Transfer-Encoding, no Expect, no folded or malformed field), it serves the
// request with the handler of its net/http server: the handler sees an
// *http.Request and an http.ResponseWriter as it would under net/http.
// Anything else (another path or method, HTTP/1.0, a chunked body, a head
// larger than the read buffer, bytes that are not HTTP at all) goes to the
// net/http server, together with the rest of its connection, before a byte
// of it was consumed: net/http reads it from its first byte and answers it,
// malformed requests included. What the server parses is thus what net/http
// would parse the same way, which a fuzz test checks against net/http's own
// parser; it never decides the framing of a request net/http might read
// otherwise.
//
// What the server saves: the background read net/http starts for every
// request to notice a client that goes away (here it starts only once a
// request has run for watchAfter), the textproto reader's allocations,
// sorting the response's fields, and a goroutine switch per request.
//
// Bounds: a request head larger than the read buffer (readBufferSize) goes
// to net/http, whose limit (MaxHeaderBytes) applies; the net/http server's
// ReadHeaderTimeout bounds reading a head and its IdleTimeout the wait for
// the next request on a connection. Reading a body is bounded by the
// deadline that bounded its head until the handler sets its own (with
// http.ResponseController), as the gateway's handler does; the server's
// ReadTimeout and WriteTimeout do not bound the bodies of the requests
// served here, nor their responses. A client that goes away is noticed
// within watchAfter plus the time its connection takes to report it.
//
// What a handler does not get on the requests served here: informational
// responses (1xx; WriteHeader ignores them), Hijack, and the Content-Type
// net/http sniffs for a response that sets none.
package leanhttp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Server serves the requests of its hot request lines itself and hands
// every other connection to HTTP.
type Server struct {
	// HTTP serves the connections handed to it, and gives this server its
	// Handler, BaseContext, ConnContext, ReadHeaderTimeout and IdleTimeout
	// (ReadTimeout when they are zero, as under net/http), MaxHeaderBytes
	// and ErrorLog.
	HTTP *http.Server
	// Hot lists the requests served here as method and path, e.g.
	// "POST /v1/completions". The path is matched exactly: one with a
	// query or an escape goes to HTTP.
	Hot []string

	lines    []hotLine
	handoff  *handoffListener
	closing  atomic.Bool
	mu       sync.Mutex
	ln       net.Listener
	conns    map[*conn]struct{}
	served   sync.WaitGroup // the HTTP server's Serve
	shutdown chan struct{}  // closed by Shutdown and Close
}

// readBufferSize is the size of a connection's read buffer: a request head
// that does not fit goes to net/http.
const readBufferSize = 8 << 10

// writeBufferSize is the size of a connection's write buffer.
const writeBufferSize = 8 << 10

// watchAfter is how long a request runs before the server starts watching
// its connection for the client going away (and cancels the request's
// context when it does). Requests answered sooner are not watched: a read
// in the background costs as much as the rest of the server's work on a
// request.
const watchAfter = 5 * time.Millisecond

// Serve accepts connections on ln until Shutdown or Close, and serves each
// as the package describes. It returns http.ErrServerClosed after those,
// or the error that stopped it accepting.
func (s *Server) Serve(ln net.Listener) error {
	if s.HTTP == nil || s.HTTP.Handler == nil {
		return errors.New("leanhttp: the Server needs an http.Server with a Handler")
	}
	defer ln.Close()
	lines, err := hotLines(s.Hot)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closing.Load() {
		// Shutdown or Close came first: as under net/http, there is
		// nothing to serve.
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.lines = lines
	s.shutdown = make(chan struct{})
	s.ln = ln
	s.conns = map[*conn]struct{}{}
	s.handoff = &handoffListener{addr: ln.Addr(), conns: make(chan net.Conn), done: s.shutdown}
	// Added under the lock that stop takes, so that Shutdown and Close,
	// which wait for it after stop, never wait before it is added.
	s.served.Go(func() { _ = s.HTTP.Serve(s.handoff) })
	s.mu.Unlock()
	var delay time.Duration
	for {
		rwc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				// Out of file descriptors and the like: back off as
				// net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		c := s.newConn(rwc)
		if c == nil {
			_ = rwc.Close()
			continue
		}
		go c.serve()
	}
}

// Shutdown stops accepting connections, closes the idle ones, waits for
// the requests in flight to end (here and in the HTTP server) until ctx
// ends, and returns ctx's error when they did not. As under net/http, a
// connection that has not sent a byte yet counts as in flight for
// newConnGrace after its accept: its client may be sending its first
// request.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	// The connections handed to the HTTP server drain meanwhile.
	drained := make(chan error, 1)
	go func() { drained <- s.HTTP.Shutdown(ctx) }()
	wait := time.Millisecond
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for s.wakeIdle() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			wait = min(2*wait, 100*time.Millisecond)
			timer.Reset(wait)
		}
	}
	err := <-drained
	s.served.Wait()
	return err
}

// Close closes the listener and every connection at once.
func (s *Server) Close() error {
	s.stop()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.rwc.Close()
	}
	s.mu.Unlock()
	err := s.HTTP.Close()
	s.served.Wait()
	return err
}

// stop stops accepting connections.
func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Swap(true) {
		return
	}
	if s.shutdown != nil {
		close(s.shutdown)
	}
	if s.ln != nil {
		_ = s.ln.Close()
	}
}

// wakeIdle makes the idle connections' reads return, so that they close,
// and returns how many connections remain.
func (s *Server) wakeIdle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.idle.Load() && !(c.fresh.Load() && time.Since(c.accepted) < newConnGrace) {
			_ = c.rwc.SetReadDeadline(aLongTimeAgo)
		}
	}
	return len(s.conns)
}

// newConnGrace is how long Shutdown waits for a connection's first byte.
const newConnGrace = 5 * time.Second

// aLongTimeAgo is a deadline in the past: it makes a pending read return.
var aLongTimeAgo = time.Unix(1, 0)

func (s *Server) newConn(rwc net.Conn) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return nil
	}
	c := &conn{s: s, rwc: rwc, remote: rwc.RemoteAddr().String(), accepted: time.Now()}
	c.idle.Store(true)
	c.fresh.Store(true)
	c.ctx = context.Background()
	if s.HTTP.BaseContext != nil {
		c.ctx = s.HTTP.BaseContext(s.ln)
	}
	c.ctx = context.WithValue(c.ctx, http.ServerContextKey, s.HTTP)
	c.ctx = context.WithValue(c.ctx, http.LocalAddrContextKey, rwc.LocalAddr())
	if s.HTTP.ConnContext != nil {
		c.ctx = s.HTTP.ConnContext(c.ctx, rwc)
	}
	c.cr.c = c
	c.br = bufio.NewReaderSize(&c.cr, readBufferSize)
	c.bw = bufio.NewWriterSize(rwc, writeBufferSize)
	c.w.c = c
	c.w.header = http.Header{}
	c.body.c = c
	c.watchCond.L = &c.watchMu
	c.watchTimer = time.AfterFunc(time.Hour, c.watch)
	c.watchTimer.Stop()
	s.conns[c] = struct{}{}
	return c
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (s *Server) logf(format string, args ...any) {
	if s.HTTP.ErrorLog != nil {
		s.HTTP.ErrorLog.Printf(format, args...)
		return
	}
	log.Printf(format, args...)
}

// conn is a client connection the server reads.
type conn struct {
	s      *Server
	rwc    net.Conn
	remote string
	ctx    context.Context
	cr     connReader
	br     *bufio.Reader
	bw     *bufio.Writer
	w      response
	body   body
	h      head
	// idle is set while the connection waits for a request's first byte.
	idle atomic.Bool
	// fresh is set until the connection's first byte arrives.
	fresh    atomic.Bool
	accepted time.Time
	// lastPost is set when the last request served was a POST.
	lastPost bool
	// cancel cancels the current request's context.
	cancel context.CancelFunc

	// The watch: a read in the background, once a request has run for
	// watchAfter, that notices the client going away.
	watchTimer *time.Timer
	watchArmed bool // set by the connection's goroutine
	watchMu    sync.Mutex
	watchCond  sync.Cond
	watching   bool // a watch read is in flight
	watched    bool // the request's watch read started
	watchDone  bool // the request ended: no watch read starts
	stash      [1]byte
	stashed    bool // the watch read a byte of the next request
	// Under watchMu: left is set once the watch saw the client of the
	// current request go away; gone is what to close then (CloseWhenGone),
	// and goneClosed is set once it was closed.
	left       bool
	gone       io.Closer
	goneClosed bool
}

// connReader reads the connection, the byte a watch read first.
type connReader struct{ c *conn }

func (r *connReader) Read(p []byte) (int, error) {
	c := r.c
	if c.stashed && len(p) > 0 {
		p[0] = c.stash[0]
		c.stashed = false
		return 1, nil
	}
	return c.rwc.Read(p)
}

// serve reads and serves the connection's requests until one asks to
// close it, a read or write fails, or it goes to the HTTP server.
func (c *conn) serve() {
	s := c.s
	handedOff := false
	defer func() {
		s.forget(c)
		if !handedOff {
			_ = c.rwc.Close()
		}
	}()
	// As under net/http, ReadHeaderTimeout bounds the first head from the
	// accept, IdleTimeout the wait for a later one's first byte.
	c.setReadTimeout(s.readHeaderTimeout())
	for first := true; ; first = false {
		c.idle.Store(true)
		if s.closing.Load() && !first {
			return
		}
		if !first {
			c.setReadTimeout(s.idleTimeout())
		}
		if _, err := c.br.Peek(1); err != nil {
			return
		}
		if c.lastPost {
			emptied, ok := c.skipLineBreaks()
			if !ok {
				return
			}
			if emptied {
				continue
			}
		}
		c.idle.Store(false)
		c.fresh.Store(false)
		n, ok := c.readHead(first)
		if !ok {
			return
		}
		if n == 0 || n > s.maxHeadSize() || !parseHead(peeked(c.br, n), c.s.lines, &c.h) {
			handedOff = c.handOff()
			return
		}
		_, _ = c.br.Discard(n)
		if !c.serveRequest() {
			return
		}
	}
}

// skipLineBreaks drops the line breaks some old clients send after a POST
// body, as net/http does (RFC 9112, 2.2), and reports whether that emptied
// the buffer. Like net/http it waits for 4 bytes, so that line breaks
// arriving apart from the next request are dropped all the same: every
// request is longer. ok is false when the connection ended or timed out
// before them, as net/http then serves nothing more.
func (c *conn) skipLineBreaks() (emptied, ok bool) {
	c.lastPost = false
	b, err := c.br.Peek(4)
	if err != nil {
		return false, false
	}
	n := 0
	for n < len(b) && (b[n] == '\r' || b[n] == '\n') {
		n++
	}
	_, _ = c.br.Discard(n)
	return n > 0 && c.br.Buffered() == 0, true
}

func peeked(br *bufio.Reader, n int) []byte {
	b, _ := br.Peek(n)
	return b
}

// readHead waits until the buffer holds a whole request head and returns
// its length; 0 when the buffer fills first or the bytes cannot be the head
// of a request served here (a bare LF, which may end net/http's head
// earlier, cannot). It reports false when the connection failed or timed
// out first. timed says the read deadline already bounds the head. Each
// byte is scanned once however the head arrives, byte by byte included.
func (c *conn) readHead(timed bool) (int, bool) {
	scanned := 0 // the bytes before hold no head end and no bare LF
	for {
		b, _ := c.br.Peek(c.br.Buffered())
		from := max(scanned-len(crlfcrlf)+1, 0)
		if i := bytes.Index(b[from:], crlfcrlf); i >= 0 {
			return from + i + len(crlfcrlf), true
		}
		if len(b) == readBufferSize || hasBareLF(b, scanned) {
			return 0, true
		}
		scanned = len(b)
		if !timed {
			c.setReadTimeout(c.s.readHeaderTimeout())
			timed = true
		}
		if _, err := c.br.Peek(len(b) + 1); err != nil {
			// A head cut short by the client or the timeout: net/http
			// would serve no request either.
			return 0, false
		}
	}
}

var crlfcrlf = []byte("\r\n\r\n")

// hasBareLF reports whether b, from its byte at from on, holds a line feed
// that no carriage return precedes.
func hasBareLF(b []byte, from int) bool {
	for i := from; i < len(b); i++ {
		if b[i] == '\n' && (i == 0 || b[i-1] != '\r') {
			return true
		}
	}
	return false
}

// setReadTimeout sets the connection's read deadline d from now, or none
// when d is not positive.
func (c *conn) setReadTimeout(d time.Duration) {
	var t time.Time
	if d > 0 {
		t = time.Now().Add(d)
	}
	_ = c.rwc.SetReadDeadline(t)
}

// readHeaderTimeout and idleTimeout are the HTTP server's, or its
// ReadTimeout when they are zero, as net/http reads them.
func (s *Server) readHeaderTimeout() time.Duration {
	if d := s.HTTP.ReadHeaderTimeout; d != 0 {
		return d
	}
	return s.HTTP.ReadTimeout
}

func (s *Server) idleTimeout() time.Duration {
	if d := s.HTTP.IdleTimeout; d != 0 {
		return d
	}
	return s.HTTP.ReadTimeout
}

// maxHeadSize is the size of the largest request head the HTTP server
// reads (its MaxHeaderBytes, and the slop net/http allows): a larger one
// goes to it, which refuses it.
func (s *Server) maxHeadSize() int {
	n := s.HTTP.MaxHeaderBytes
	if n <= 0 {
		n = http.DefaultMaxHeaderBytes
	}
	return n + 4096
}

// handOff passes the connection, with the bytes read so far, to the HTTP
// server, and reports whether it took it.
func (c *conn) handOff() bool {
	_ = c.rwc.SetReadDeadline(time.Time{})
	buffered, _ := c.br.Peek(c.br.Buffered())
	hc := &handedConn{Conn: c.rwc, pending: append([]byte(nil), buffered...)}
	return c.s.handoff.deliver(hc)
}

// serveRequest serves the request whose head c.h holds, and reports
// whether the connection serves another.
func (c *conn) serveRequest() (keep bool) {
	h := &c.h
	c.watchMu.Lock()
	c.left, c.gone, c.goneClosed = false, nil, false
	c.watchMu.Unlock()
	ctx, cancel := context.WithCancel(c.ctx)
	c.cancel = cancel
	defer cancel()
	r := (&http.Request{
		Method:        h.method,
		URL:           &url.URL{Path: h.path},
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h.header,
		ContentLength: h.contentLength,
		Close:         h.close,
		Host:          h.host,
		RemoteAddr:    c.remote,
		RequestURI:    h.path,
		Body:          http.NoBody,
	}).WithContext(ctx)
	c.lastPost = h.method == http.MethodPost
	c.body.reset(h.contentLength)
	if h.contentLength > 0 {
		r.Body = &c.body
	} else {
		c.armWatch()
	}
	c.w.reset(h.close)
	aborted := c.runHandler(r)
	c.stopWatch()
	if aborted {
		return false
	}
	c.w.finish()
	if c.w.err != nil || c.w.closeAfter {
		c.closeWrite()
		return false
	}
	if c.body.remaining > 0 && !c.body.discard() {
		return false
	}
	return true
}

// runHandler runs the handler on r, and reports whether it panicked: with
// http.ErrAbortHandler to cut the response, or otherwise, which is logged.
func (c *conn) runHandler(r *http.Request) (aborted bool) {
	defer func() {
		if v := recover(); v != nil {
			aborted = true
			if v != http.ErrAbortHandler {
				buf := make([]byte, 64<<10)
				buf = buf[:runtime.Stack(buf, false)]
				c.s.logf("leanhttp: panic serving %s: %v\n%s", c.remote, v, buf)
			}
		}
	}()
	c.s.HTTP.Handler.ServeHTTP(&c.w, r)
	return false
}

// closeWrite ends a connection answered with Connection: close as net/http
// does: it half-closes it and reads what the client still sends for a
// moment, so that the client reads the response before it sees the
// connection reset.
func (c *conn) closeWrite() {
	cw, ok := c.rwc.(interface{ CloseWrite() error })
	if !ok || c.br.Buffered() == 0 && c.body.remaining == 0 {
		return
	}
	_ = cw.CloseWrite()
	_ = c.rwc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.Copy(io.Discard, c.rwc)
}

// armWatch starts the watch of the connection after watchAfter, unless the
// client already sent more (it pipelines).
func (c *conn) armWatch() {
	if c.watchArmed || c.br.Buffered() > 0 || c.stashed {
		return
	}
	c.watchMu.Lock()
	c.watchDone, c.watched = false, false
	c.watchMu.Unlock()
	c.watchArmed = true
	c.watchTimer.Reset(watchAfter)
}

// watch reads the connection in the background until the client sends a
// byte (kept for the next request), goes away (the request's context is
// cancelled) or stopWatch ends the read. A request gets one read at most:
// a run of the timer's function left over from an earlier request may
// start it early, but never after stopWatch, and never a second one, which
// would take the place of the byte the first kept.
func (c *conn) watch() {
	c.watchMu.Lock()
	if c.watchDone || c.watched {
		c.watchMu.Unlock()
		return
	}
	c.watching, c.watched = true, true
	_ = c.rwc.SetReadDeadline(time.Time{})
	c.watchMu.Unlock()
	n, err := c.rwc.Read(c.stash[:])
	c.watchMu.Lock()
	c.watching = false
	if n > 0 {
		c.stashed = true
	}
	var gone io.Closer
	if err != nil && !c.watchDone {
		c.cancel()
		c.left = true
		gone, c.gone, c.goneClosed = c.gone, nil, c.gone != nil
	}
	c.watchCond.Broadcast()
	c.watchMu.Unlock()
	if gone != nil {
		_ = gone.Close()
	}
}

// closeWhenGone closes cl once the watch sees the client go away, at once
// when it already did.
func (c *conn) closeWhenGone(cl io.Closer) {
	c.watchMu.Lock()
	if !c.left {
		c.gone = cl
		c.watchMu.Unlock()
		return
	}
	c.goneClosed = true
	c.watchMu.Unlock()
	_ = cl.Close()
}

// stopClosing withdraws closeWhenGone's closer, and reports whether it did
// so before the closer was closed.
func (c *conn) stopClosing() bool {
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	c.gone = nil
	return !c.goneClosed
}

// stopWatch ends the watch of the connection, waiting for its read.
func (c *conn) stopWatch() {
	if !c.watchArmed {
		return
	}
	c.watchArmed = false
	c.watchTimer.Stop()
	c.watchMu.Lock()
	c.watchDone = true
	if c.watching {
		_ = c.rwc.SetReadDeadline(aLongTimeAgo)
		for c.watching {
			c.watchCond.Wait()
		}
		_ = c.rwc.SetReadDeadline(time.Time{})
	}
	c.watchMu.Unlock()
}

// body is the body of a request served here, of a known length.
type body struct {
	c         *conn
	remaining int64
	err       error
}

func (b *body) reset(n int64) { b.remaining, b.err = n, nil }

func (b *body) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.remaining == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.remaining {
		p = p[:b.remaining]
	}
	n, err := b.c.br.Read(p)
	b.remaining -= int64(n)
	if b.remaining == 0 {
		b.c.armWatch()
		return n, nil
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

func (b *body) Close() error { return nil }

// maxDiscard bounds the unread body the server reads past to serve the
// connection's next request: with more left, it closes the connection.
const maxDiscard = 256 << 10

// discard reads the rest of the body, up to maxDiscard, and reports whether
// the connection can serve another request.
func (b *body) discard() bool {
	if b.err != nil || b.remaining > maxDiscard {
		return false
	}
	if d := b.c.s.readHeaderTimeout(); d > 0 {
		_ = b.c.rwc.SetReadDeadline(time.Now().Add(d))
	}
	_, err := b.c.br.Discard(int(b.remaining))
	b.remaining = 0
	return err == nil
}

// handoffListener is the HTTP server's listener: it accepts the
// connections the server hands it.
type handoffListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  <-chan struct{}
}

// deliver hands c to the HTTP server, and reports whether it took it.
func (l *handoffListener) deliver(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error { return nil }

func (l *handoffListener) Addr() net.Addr { return l.addr }

// handedConn is a connection handed to the HTTP server: its reads return
// the bytes the server had read first.
type handedConn struct {
	net.Conn
	pending []byte
}

func (c *handedConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// NetConn returns the connection the server accepted.
func (c *handedConn) NetConn() net.Conn { return c.Conn }

// CloseWrite half-closes the connection when it can, as net/http does
// before closing one it answered with Connection: close.
func (c *handedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
