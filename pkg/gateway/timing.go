package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/connlimit"
	"github.com/kvgate/kvgate/pkg/internal/rawsock"
)

// phase is a part of the gateway's time on a request. The parts follow
// each other: together they are the whole time, from the first byte of the
// request read to the last byte of the response written.
type phase int

const (
	// phaseRead: the request read (headers and body), decoded and
	// checked.
	phaseRead phase = iota
	// phaseTokenize: the prompt tokenized and its output predicted.
	phaseTokenize
	// phaseRoute: the pod chosen and the request sent to it, retries on
	// other pods included.
	phaseRoute
	// phaseUpstream: the wait for the pod's response headers, the engine's
	// time to first byte.
	phaseUpstream
	// phaseRelay: the response relayed, from its headers to the last byte
	// written to the client; for a stream, the engine's generation too.
	phaseRelay
	numPhases
)

// phaseNames name the phases in Server-Timing and in
// kvgate_gateway_request_phase_seconds.
var phaseNames = [numPhases]string{"read", "tokenize", "route", "upstream", "relay"}

// Server-Timing metrics the gateway adds beside its phases.
const (
	// ServerTimingGateway is the gateway's own time: the whole time less
	// the wait for the pod's response headers, up to the moment the
	// response's headers are written.
	ServerTimingGateway = "gateway"
	// serverTimingTotal, a trailer of streamed responses, is the whole
	// time to the last byte.
	serverTimingTotal = "total"
)

// clock times the phases of one request.
type clock struct {
	// start is when the request's first byte was read.
	start time.Time
	// conn is the request's client connection, nil when it is no
	// timedConn.
	conn *timedConn
	mark time.Time // the end of the last phase timed
	// end is the response's bound, set by boundResponse: zero until then.
	end   time.Time
	spent [numPhases]time.Duration
	// reached says which phases were timed.
	reached [numPhases]bool
}

// begin starts the clock at the request's first byte, when its connection
// knows it, else now.
func (c *clock) begin(r *http.Request) {
	now := time.Now()
	c.start = now
	if tc, ok := r.Context().Value(connKey{}).(*timedConn); ok {
		c.conn = tc
		if t := tc.firstRead(); !t.IsZero() && t.Before(now) {
			c.start = t
		}
	}
	c.mark = c.start
}

// boundResponse makes end the latest moment a write of the response to the
// client may end.
func (c *clock) boundResponse(end time.Time) {
	c.end = end
	if c.conn != nil {
		c.conn.end.Store(end.UnixNano())
	}
}

// unboundResponse lifts the bound of boundResponse: the writes that follow
// have the write timeout each.
func (c *clock) unboundResponse() {
	c.end = time.Time{}
	if c.conn != nil {
		c.conn.end.Store(0)
	}
}

// overBound reports whether the response's bound (boundResponse) has
// passed. The relay asks before it writes to the client: past the bound, a
// write would fail at once and close the connection, where the response is
// to end with the error the bound calls for.
func (c *clock) overBound() bool { return !c.end.IsZero() && !time.Now().Before(c.end) }

// pastResponseEnd reports whether the client's connection was closed
// because a write to it met the bound of boundResponse.
func (c *clock) pastResponseEnd() bool { return c.conn != nil && c.conn.pastEnd.Load() }

// lap ends phase p now: the time since the last lap is p's.
func (c *clock) lap(p phase) {
	now := time.Now()
	c.spent[p] += now.Sub(c.mark)
	c.reached[p] = true
	c.mark = now
}

// total returns the time from the first byte to the last lap.
func (c *clock) total() time.Duration { return c.mark.Sub(c.start) }

// own returns the gateway's own time so far: the whole time less the wait
// for the pod.
func (c *clock) own() time.Duration { return c.total() - c.spent[phaseUpstream] }

// appendServerTiming appends the Server-Timing value of the phases timed
// so far: the gateway's own time, then each phase, in milliseconds with
// microsecond precision, e.g. "gateway;dur=0.210, read;dur=0.020, ...".
func (c *clock) appendServerTiming(b []byte) []byte {
	b = appendTiming(b, ServerTimingGateway, c.own())
	for p := range numPhases {
		if c.reached[p] {
			b = append(b, ", "...)
			b = appendTiming(b, phaseNames[p], c.spent[p])
		}
	}
	return b
}

// appendTiming appends one Server-Timing metric, name;dur=milliseconds.
func appendTiming(b []byte, name string, d time.Duration) []byte {
	b = append(b, name...)
	b = append(b, ";dur="...)
	return strconv.AppendFloat(b, float64(d.Microseconds())/1000, 'f', 3, 64)
}

// connKey is the context key of a request's timedConn.
type connKey struct{}

// timedListener accepts connections that remember when the first byte of
// their current request was read, for the gateway's Server-Timing and
// phase metrics to start there rather than when net/http runs the
// handler, and that bound each write by writeTimeout, and by the end of
// the response being relayed, counting the connections they closed. It
// holds at most maxConns connections open (see package connlimit), whose
// TCP sockets are read and written with raw system calls (package
// rawsock).
type timedListener struct {
	*connlimit.Listener
	writeTimeout time.Duration
	metrics      *metrics
	// responseTimeouts counts the connections closed at a response's end.
	responseTimeouts prometheus.Counter
}

func newTimedListener(ln net.Listener, writeTimeout time.Duration, maxConns int, m *metrics) *timedListener {
	return &timedListener{Listener: connlimit.New(rawsock.Listener{Listener: ln}, maxConns, m.connWaits, m.conns), writeTimeout: writeTimeout, metrics: m,
		responseTimeouts: m.upstreamFails.WithLabelValues(failResponseTimeout)}
}

func (l *timedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &timedConn{Conn: c, l: l}, nil
}

// withConn is the http.Server.ConnContext that hands a request its
// timedConn, which a connection leanhttp hands to net/http wraps.
func withConn(ctx context.Context, c net.Conn) context.Context {
	if w, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = w.NetConn()
	}
	if tc, ok := c.(*timedConn); ok {
		return context.WithValue(ctx, connKey{}, tc)
	}
	return ctx
}

// timedConn is a client connection that records when a read first
// returned bytes since the last request ended, and closes itself when a
// write blocks for writeTimeout or reaches end.
type timedConn struct {
	net.Conn
	// first is the time of that read in Unix nanoseconds, 0 when none
	// returned bytes since.
	first atomic.Int64
	// end, in Unix nanoseconds, is when the response being relayed must
	// have been written, 0 when unbounded: no write's deadline passes it.
	// It is set once the request was sent to a pod, and lifted when the
	// next request's first byte is read or its handler starts, so that it
	// bounds the response's last writes after its handler returned.
	end atomic.Int64
	l   *timedListener
	// timedOut is set once a write met its deadline: the connection is
	// closed and every later write fails. pastEnd is set first when the
	// deadline was end.
	timedOut atomic.Bool
	pastEnd  atomic.Bool
}

// Write writes p within the write timeout, and by end.
func (c *timedConn) Write(p []byte) (int, error) {
	if c.timedOut.Load() {
		return 0, c.writeTimeoutError()
	}
	deadline := time.Now().Add(c.l.writeTimeout)
	end := c.end.Load()
	atEnd := end != 0 && deadline.UnixNano() > end
	if atEnd {
		deadline = time.Unix(0, end)
	}
	if err := c.Conn.SetWriteDeadline(deadline); err != nil {
		return 0, err
	}
	n, err := c.Conn.Write(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if atEnd {
			c.pastEnd.Store(true)
		}
		if !c.timedOut.Swap(true) {
			if atEnd {
				c.l.responseTimeouts.Inc()
			} else {
				c.l.metrics.writeTimeouts.Inc()
			}
			_ = c.Conn.Close()
		}
		return n, c.writeTimeoutError()
	}
	return n, err
}

func (c *timedConn) writeTimeoutError() error {
	if c.pastEnd.Load() {
		return fmt.Errorf("the response was not written within its bound: %w", os.ErrDeadlineExceeded)
	}
	return fmt.Errorf("the client read nothing for %v: %w", c.l.writeTimeout, os.ErrDeadlineExceeded)
}

func (c *timedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.first.Load() == 0 {
		c.first.Store(time.Now().UnixNano())
		c.end.Store(0)
	}
	return n, err
}

// firstRead returns when the current request's first byte was read, zero
// when unknown.
func (c *timedConn) firstRead() time.Time {
	if ns := c.first.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// requestDone marks the end of a request's handler: the next read that
// returns bytes starts the next request.
func (c *timedConn) requestDone() { c.first.Store(0) }

// CloseWrite half-closes a TCP connection, as net/http does before closing
// one it answered with Connection: close.
func (c *timedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// serveRequest serves r with h, telling r's connection when r's handler
// starts, which lifts the bound of the response before (see timedConn.end),
// and when it ended.
func serveRequest(h http.Handler, w http.ResponseWriter, r *http.Request) {
	tc, _ := r.Context().Value(connKey{}).(*timedConn)
	if tc != nil {
		tc.end.Store(0)
	}
	h.ServeHTTP(w, r)
	if tc != nil {
		tc.requestDone()
	}
}
