package cache

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/pkg/internal/rawsock"
)

// A pod's loop reads one page at a time from one address, every interval:
// pageClient does it over a connection of its own, kept from one read to
// the next. net/http's client would hand each request to a connection's
// writing goroutine and the answer back from its reading one, waking other
// threads for each; here the loop's goroutine writes the request and reads
// the answer itself, which makes reading a page a third cheaper
// (BenchmarkPageClientGet).
//
// What it takes on that net/http's client would do: HTTP/1.1 with
// keep-alive (a connection the pod closed while idle is redialled and the
// request sent once more, as a GET may be), gzip-encoded pages inflated,
// informational answers skipped, redirects followed within the pod's own
// address (at most maxPageRedirects), and the loop's context ending a read
// at once. Bounds: the whole read, dial included, within the timeout; the
// page within its limit once inflated; the answer's bytes on the wire
// within pageWireBytes of the limit.

// maxPageRedirects bounds the redirects followed in one read of a page.
const maxPageRedirects = 3

// maxInformationalAnswers bounds the 1xx answers skipped before a page.
const maxInformationalAnswers = 5

// pageWireBytes bounds the bytes read off the connection for one answer, a
// page of limit bytes: its head, its framing and its body as sent (it may be
// compressed, or chunked, whose framing net/http keeps in proportion).
func pageWireBytes(limit int64) int64 { return 2*limit + 64<<10 }

// maxDrainedBytes is the most of a body that is read past to keep its
// connection: an answer that was not read whole, such as an error page,
// with more left closes the connection instead.
const maxDrainedBytes = 4 << 10

// maxIdleKept is the longest a connection waits between two reads and is
// still used for the next: servers close idle connections, vLLM's
// (uvicorn) after 5 s, and a request sent on one the server closed is
// lost and sent again. Longer intervals (the model list's) dial anew.
const maxIdleKept = 4 * time.Second

// pageClient reads pages from one pod's address. It is used by one
// goroutine at a time, but for interrupt, which a context's end calls.
type pageClient struct {
	url    string // for errors
	host   string // host:port, dialled and named in the Host header
	path   string // the page's path and query
	accept string
	// authorization, when set, is the value of the Authorization header
	// sent with every request; never logged nor put in errors.
	authorization string
	timeout       time.Duration
	limit         int64
	// dial, when set, replaces the TCP dial: a test's connections.
	dial func(ctx context.Context, deadline time.Time) (net.Conn, error)

	// mu guards nc against interrupt, which sets its deadline in the past.
	mu   sync.Mutex
	nc   net.Conn
	wire wireBudget
	br   *bufio.Reader
	req  []byte
	// idleSince is when the connection's last answer ended.
	idleSince time.Time
}

// gzipReaders holds the readers that inflated pages, for the next ones: a
// reader keeps some 40 KB of state, too much to keep one per pod.
var gzipReaders sync.Pool

// newPageClient returns a client reading http://host/path, host being
// host:port, with Accept header accept, each read within timeout and each
// page at most limit bytes.
func newPageClient(host, path, accept string, timeout time.Duration, limit int64) *pageClient {
	return &pageClient{url: "http://" + host + path, host: host, path: path, accept: accept, timeout: timeout, limit: limit}
}

// get reads the page into buf. Any status but 200 is an error. Errors are
// *readError and name the URL.
func (c *pageClient) get(ctx context.Context, buf *bytes.Buffer) error {
	deadline := time.Now().Add(c.timeout)
	defer context.AfterFunc(ctx, c.interrupt)()
	path := c.path
	for redirects := 0; ; redirects++ {
		next, err := c.exchange(ctx, path, deadline, buf)
		if err != nil {
			c.close()
			return c.failed(ctx, err)
		}
		if next == "" {
			return nil
		}
		if redirects == maxPageRedirects {
			c.close()
			return &readError{reason: readStatus, err: fmt.Errorf("GET %s: more than %d redirects", c.url, maxPageRedirects)}
		}
		path = next
	}
}

// failed returns err as a *readError, its reason found from what failed.
func (c *pageClient) failed(ctx context.Context, err error) error {
	switch _, ok := errors.AsType[*readError](err); {
	case ok:
		return err
	case ctx.Err() != nil:
		return &readError{reason: readConnection, err: fmt.Errorf("GET %s: %w", c.url, ctx.Err())}
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
		return &readError{reason: readTimeout, err: fmt.Errorf("GET %s: no whole answer within %v: %w", c.url, c.timeout, err)}
	case errors.Is(err, errWireBudget):
		return &readError{reason: readTooLarge, err: fmt.Errorf("GET %s: %w", c.url, err)}
	}
	return &readError{reason: readConnection, err: fmt.Errorf("GET %s: %w", c.url, err)}
}

// exchange sends one GET of path and reads its answer: the page into buf,
// or the path a redirect names, returned. A connection kept from an earlier
// read that turns out closed before any byte of the answer is replaced and
// the request sent again.
func (c *pageClient) exchange(ctx context.Context, path string, deadline time.Time, buf *bytes.Buffer) (string, error) {
	if c.nc != nil && time.Since(c.idleSince) > maxIdleKept {
		c.close()
	}
	reused := c.nc != nil
	if !reused {
		if err := c.connect(ctx, deadline); err != nil {
			return "", err
		}
	} else if err := c.arm(ctx, c.nc, deadline); err != nil {
		return "", err
	}
	next, err := c.roundTrip(path, buf)
	if err != nil && reused && c.wire.untouched() && closedByPeer(err) {
		c.close()
		if err := c.connect(ctx, deadline); err != nil {
			return "", err
		}
		next, err = c.roundTrip(path, buf)
	}
	return next, err
}

// closedByPeer reports whether err is what writing to or reading from a
// connection the peer closed returns.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (c *pageClient) connect(ctx context.Context, deadline time.Time) error {
	var nc net.Conn
	var err error
	if c.dial != nil {
		nc, err = c.dial(ctx, deadline)
	} else {
		d := net.Dialer{Deadline: deadline, KeepAlive: 30 * time.Second}
		if nc, err = d.DialContext(ctx, "tcp", c.host); err == nil {
			nc = rawsock.Wrap(nc)
		}
	}
	if err != nil {
		return err
	}
	if err := c.arm(ctx, nc, deadline); err != nil {
		_ = nc.Close()
		return err
	}
	c.wire.r = nc
	if c.br == nil {
		c.br = bufio.NewReaderSize(&c.wire, 4<<10)
	} else {
		c.br.Reset(&c.wire)
	}
	return nil
}

// arm makes nc the connection interrupt ends, with deadline, unless ctx
// already ended: then interrupt may have run before nc was known.
func (c *pageClient) arm(ctx context.Context, nc net.Conn, deadline time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	c.nc = nc
	return nc.SetDeadline(deadline)
}

// interrupt ends the read in progress, if any.
func (c *pageClient) interrupt() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nc != nil {
		_ = c.nc.SetDeadline(aLongTimeAgo)
	}
}

// aLongTimeAgo is a deadline in the past: it ends a pending read or write.
var aLongTimeAgo = time.Unix(1, 0)

// close closes the connection, if any; the next read dials anew.
func (c *pageClient) close() {
	c.mu.Lock()
	nc := c.nc
	c.nc = nil
	c.mu.Unlock()
	if nc != nil {
		_ = nc.Close()
	}
}

// roundTrip writes a GET of path and reads the answer on the connection.
func (c *pageClient) roundTrip(path string, buf *bytes.Buffer) (string, error) {
	c.req = append(c.req[:0], "GET "...)
	c.req = append(c.req, path...)
	c.req = append(c.req, " HTTP/1.1\r\nHost: "...)
	c.req = append(c.req, c.host...)
	c.req = append(c.req, "\r\nUser-Agent: kvgate\r\nAccept: "...)
	c.req = append(c.req, c.accept...)
	if c.authorization != "" {
		c.req = append(c.req, "\r\nAuthorization: "...)
		c.req = append(c.req, c.authorization...)
	}
	c.req = append(c.req, "\r\nAccept-Encoding: gzip\r\n\r\n"...)
	c.wire.n = pageWireBytes(c.limit)
	c.wire.start = c.wire.n
	if _, err := c.nc.Write(c.req); err != nil {
		return "", err
	}
	resp, err := c.readAnswer()
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		next, err := c.redirect(path, resp)
		c.finish(resp)
		return next, err
	}
	if err := c.readPage(resp, buf); err != nil {
		return "", err
	}
	c.finish(resp)
	return "", nil
}

// readAnswer reads the head of the answer, past informational ones.
func (c *pageClient) readAnswer() (*http.Response, error) {
	for range maxInformationalAnswers + 1 {
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
	}
	return nil, fmt.Errorf("more than %d informational answers", maxInformationalAnswers)
}

// redirect returns the path a redirect to the pod's own address names, or
// an error for any other answer but 200.
func (c *pageClient) redirect(path string, resp *http.Response) (string, error) {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		base, err := url.Parse("http://" + c.host + path)
		loc, locErr := url.Parse(resp.Header.Get("Location"))
		if err == nil && locErr == nil && resp.Header.Get("Location") != "" {
			if to := base.ResolveReference(loc); to.Scheme == "http" && to.Host == c.host {
				return to.RequestURI(), nil
			}
		}
		return "", &readError{reason: readStatus, err: fmt.Errorf("GET %s: HTTP status %s to %q, not a page of the same address",
			c.url, resp.Status, clipForLog(resp.Header.Get("Location")))}
	}
	return "", &readError{reason: readStatus, err: fmt.Errorf("GET %s: HTTP status %s", c.url, resp.Status)}
}

// readPage reads the body of resp, inflated if gzip-encoded, into buf.
func (c *pageClient) readPage(resp *http.Response, buf *bytes.Buffer) error {
	body := io.Reader(resp.Body)
	switch enc := resp.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := newGzipReader(resp.Body)
		if err != nil {
			return c.bodyError(err)
		}
		defer gzipReaders.Put(zr)
		body = zr
	default:
		return &readError{reason: readBadBody, err: fmt.Errorf("GET %s: Content-Encoding %q, want gzip or none", c.url, clipForLog(enc))}
	}
	buf.Reset()
	n, err := buf.ReadFrom(io.LimitReader(body, c.limit+1))
	if err != nil {
		return c.bodyError(err)
	}
	if n > c.limit {
		return &readError{reason: readTooLarge, err: fmt.Errorf("GET %s: body exceeds %d bytes", c.url, c.limit)}
	}
	return nil
}

// newGzipReader returns a reader inflating r, from gzipReaders when it
// holds one; it goes back there after use.
func newGzipReader(r io.Reader) (*gzip.Reader, error) {
	if zr, ok := gzipReaders.Get().(*gzip.Reader); ok {
		if err := zr.Reset(r); err != nil {
			gzipReaders.Put(zr)
			return nil, err
		}
		return zr, nil
	}
	return gzip.NewReader(r)
}

// bodyError returns the error of reading a body, a *readError when the
// body, not the connection, is at fault.
func (c *pageClient) bodyError(err error) error {
	var corrupt flate.CorruptInputError
	if errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) || errors.As(err, &corrupt) {
		return &readError{reason: readBadBody, err: fmt.Errorf("GET %s: inflate the body: %w", c.url, err)}
	}
	return fmt.Errorf("read body: %w", err)
}

// finish reads what is left of resp's body, up to maxDrainedBytes, and
// keeps the connection for the next read only if that reached its end and
// the pod keeps it open.
func (c *pageClient) finish(resp *http.Response) {
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrainedBytes+1))
	if err != nil || n > maxDrainedBytes || resp.Close || c.br.Buffered() > 0 {
		c.close()
	}
	c.idleSince = time.Now()
}

// errWireBudget reports an answer longer on the wire than its bound.
var errWireBudget = errors.New("the answer exceeds its bound in bytes")

// wireBudget reads a connection, at most n bytes before failing with
// errWireBudget; start is n as the answer began.
type wireBudget struct {
	r        io.Reader
	n, start int64
}

func (w *wireBudget) Read(p []byte) (int, error) {
	if w.n <= 0 {
		return 0, errWireBudget
	}
	if int64(len(p)) > w.n {
		p = p[:w.n]
	}
	n, err := w.r.Read(p)
	w.n -= int64(n)
	return n, err
}

// untouched reports whether no byte of the answer has been read.
func (w *wireBudget) untouched() bool { return w.n == w.start }
