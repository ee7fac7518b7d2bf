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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// waitFor bounds every wait of these tests: generous, for a loaded machine
// running them with -race.
const waitFor = 10 * time.Second

// hotPath is the path of the tests' hot request, POST /v1/completions.
const hotPath = "/v1/completions"

// servedByField is the response field in which the tests' handlers say
// which path served the request: "lean" or "net/http".
const servedByField = "X-Served-By"

func servedBy(w http.ResponseWriter) string {
	if _, ok := w.(*response); ok {
		return "lean"
	}
	return "net/http"
}

// echo answers a request with its body, the path that served it and the
// client's address.
func echo(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(servedByField, servedBy(w))
	w.Header().Set("X-Remote-Addr", r.RemoteAddr)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	_, _ = w.Write(body)
}

// healthz answers GET /healthz with "ok", saying which path served it.
func healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(servedByField, servedBy(w))
	w.Header().Set("X-Remote-Addr", r.RemoteAddr)
	_, _ = io.WriteString(w, "ok")
}

// echoMux serves echo on every path, healthz on GET /healthz.
func echoMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/", echo)
	mux.HandleFunc("GET /healthz", healthz)
	return mux
}

// newHTTP returns the http.Server of handler, with generous timeouts.
func newHTTP(handler http.Handler) *http.Server {
	return &http.Server{Handler: handler, ReadHeaderTimeout: waitFor, IdleTimeout: time.Minute}
}

// testServer is a Server serving on a loopback listener until its test
// ends.
type testServer struct {
	*Server
	addr string
	log  *syncBuffer   // the HTTP server's ErrorLog, unless the test set one
	done chan struct{} // closed when Serve returned
	err  error         // what Serve returned
}

// startLean serves srv's handler through a Server whose hot request is
// POST /v1/completions.
func startLean(t *testing.T, srv *http.Server) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: &Server{HTTP: srv, Hot: []string{"POST " + hotPath}}, addr: ln.Addr().String(),
		log: &syncBuffer{}, done: make(chan struct{})}
	if srv.ErrorLog == nil {
		srv.ErrorLog = log.New(ts.log, "", 0)
	}
	go func() {
		defer close(ts.done)
		ts.err = ts.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = ts.Close()
		wantServerClosed(t, ts.serveErr(t))
	})
	return ts
}

// serveErr waits for Serve to return, and returns its error.
func (ts *testServer) serveErr(t *testing.T) error {
	t.Helper()
	select {
	case <-ts.done:
		return ts.err
	case <-time.After(waitFor):
		t.Fatal("Serve did not return")
		return nil
	}
}

// wantServerClosed checks that Serve returned http.ErrServerClosed.
func wantServerClosed(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// rawConn is a client connection that writes requests as bytes and reads
// responses with http.ReadResponse. Every read and write of it fails after
// waitFor.
type rawConn struct {
	net.Conn
	t  *testing.T
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(waitFor))
	return &rawConn{Conn: nc, t: t, br: bufio.NewReader(nc)}
}

func (c *rawConn) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// response reads the response to a request of method, and its body.
func (c *rawConn) response(method string) (*http.Response, string) {
	c.t.Helper()
	resp, err := http.ReadResponse(c.br, &http.Request{Method: method})
	if err != nil {
		c.t.Fatalf("read response: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("read the body of a %d response: %v", resp.StatusCode, err)
	}
	return resp, string(body)
}

// expect reads a response to a request of method, and checks its status,
// the path that served it and its body.
func (c *rawConn) expect(method string, status int, by, body string) *http.Response {
	c.t.Helper()
	resp, got := c.response(method)
	if resp.StatusCode != status || resp.Header.Get(servedByField) != by || got != body {
		c.t.Fatalf("got %d from %q with body %q, want %d from %q with body %q",
			resp.StatusCode, resp.Header.Get(servedByField), got, status, by, body)
	}
	return resp
}

// expectClosed checks that the server closes the connection, sending
// nothing more.
func (c *rawConn) expectClosed() {
	c.t.Helper()
	b, err := c.br.ReadByte()
	var ne net.Error
	switch {
	case err == nil:
		c.t.Fatalf("read %q, want the connection closed", b)
	case errors.As(err, &ne) && ne.Timeout():
		c.t.Fatalf("the connection is still open after %v", waitFor)
	}
}

// hotRequest returns a POST /v1/completions request with body and fields
// (each "Name: value").
func hotRequest(body string, fields ...string) string {
	return "POST " + hotPath + " HTTP/1.1\r\nHost: test\r\n" + joinFields(fields) +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// getRequest returns a GET request of path with fields (each "Name: value").
func getRequest(path string, fields ...string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: test\r\n" + joinFields(fields) + "\r\n"
}

func joinFields(fields []string) string {
	var b strings.Builder
	for _, f := range fields {
		b.WriteString(f + "\r\n")
	}
	return b.String()
}

// waitUntil polls cond until it holds, and fails the test when it does not
// within waitFor.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !eventually(cond) {
		t.Fatalf("not %s after %v", what, waitFor)
	}
}

// eventually polls cond until it holds, and reports whether it did within
// waitFor; handlers, which must not fail the test themselves, call it.
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// receive returns what ch receives, and fails the test when it receives
// nothing within waitFor.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("no %s after %v", what, waitFor)
		var zero T
		return zero
	}
}

// TestHotThenHandedOffOnOneConnection checks that the lean path serves a hot
// request, that a request of another path on the same connection then goes
// to net/http with the connection, and that net/http serves the
// connection's later hot requests.
func TestHotThenHandedOffOnOneConnection(t *testing.T) {
	ts := startLean(t, newHTTP(echoMux()))
	c := dialRaw(t, ts.addr)
	c.send(hotRequest(`{"n":1}`))
	resp := c.expect("POST", 200, "lean", `{"n":1}`)
	if got := resp.Header.Get("X-Remote-Addr"); got != c.LocalAddr().String() {
		t.Errorf("the lean path's RemoteAddr is %q, want %q", got, c.LocalAddr())
	}
	c.send(getRequest("/healthz"))
	resp = c.expect("GET", 200, "net/http", "ok")
	if got := resp.Header.Get("X-Remote-Addr"); got != c.LocalAddr().String() {
		t.Errorf("net/http's RemoteAddr is %q, want %q", got, c.LocalAddr())
	}
	for i := range 3 {
		body := `{"n":` + strconv.Itoa(i+2) + `}`
		c.send(hotRequest(body))
		c.expect("POST", 200, "net/http", body)
	}
}

// TestKeepAlive checks that one connection serves many hot requests one
// after the other, all on the lean path.
func TestKeepAlive(t *testing.T) {
	ts := startLean(t, newHTTP(echoMux()))
	c := dialRaw(t, ts.addr)
	for i := range 200 {
		body := strings.Repeat("x", i)
		c.send(hotRequest(body))
		resp := c.expect("POST", 200, "lean", body)
		if resp.Close || resp.Header.Get("X-Remote-Addr") != c.LocalAddr().String() {
			t.Fatalf("request %d: Close %v, from %s, want the same connection kept", i, resp.Close,
				resp.Header.Get("X-Remote-Addr"))
		}
	}
}

// TestPipelined checks that requests written at once are answered in order,
// the hot ones on the lean path, and that the bytes read past a request
// handed to net/http reach it.
func TestPipelined(t *testing.T) {
	ts := startLean(t, newHTTP(echoMux()))
	c := dialRaw(t, ts.addr)
	c.send(hotRequest("one") + hotRequest("two"))
	c.expect("POST", 200, "lean", "one")
	c.expect("POST", 200, "lean", "two")
	c.send(hotRequest("three") + getRequest("/healthz") + hotRequest("four") + hotRequest(""))
	c.expect("POST", 200, "lean", "three")
	c.expect("GET", 200, "net/http", "ok")
	c.expect("POST", 200, "net/http", "four")
	c.expect("POST", 200, "net/http", "")
}

// TestLineBreakAfterPost checks that the line break an old client sends
// after a POST body is skipped, as net/http skips it, whether it comes with
// the body, alone or with the next request, and that the next request is
// still served on the lean path.
func TestLineBreakAfterPost(t *testing.T) {
	ts := startLean(t, newHTTP(echoMux()))
	c := dialRaw(t, ts.addr)
	c.send(hotRequest("one") + "\r\n")
	c.expect("POST", 200, "lean", "one")
	c.send(hotRequest("two"))
	c.expect("POST", 200, "lean", "two")
	c.send("\r\n")
	c.send(hotRequest("three"))
	c.expect("POST", 200, "lean", "three")
	c.send("\r\n" + hotRequest("four"))
	c.expect("POST", 200, "lean", "four")
}

// TestLineBreaksAfterPostArrivingApart checks that the line breaks after a
// POST body are skipped, up to four as net/http skips them, when they
// arrive apart from each other and from the next request: that request is
// still served on the lean path, not handed to net/http as a malformed one.
func TestLineBreaksAfterPostArrivingApart(t *testing.T) {
	ts := startLean(t, newHTTP(echoMux()))
	c := dialRaw(t, ts.addr)
	c.send(hotRequest("one"))
	c.expect("POST", 200, "lean", "one")
	c.send("\r\n")
	time.Sleep(50 * time.Millisecond) // for the server to read the line break alone
	c.send("\r\n" + hotRequest("two"))
	c.expect("POST", 200, "lean", "two")
}

// TestHeadsSentByteByByte checks that a head arriving a byte at a time,
// its end split across reads, is read on the lean path, and that one with a
// bare LF arriving the same way still goes to net/http.
func TestHeadsSentByteByByte(t *testing.T) {
	ts := startLean(t, newHTTP(echoMux()))
	c := dialRaw(t, ts.addr)
	for _, b := range []byte(hotRequest("slow")) {
		c.send(string(b))
	}
	c.expect("POST", 200, "lean", "slow")
	for _, b := range []byte("GET /healthz HTTP/1.1\nHost: test\n\n") {
		c.send(string(b))
	}
	c.expect("GET", 200, "net/http", "ok")
}

// TestRequestBody checks that a handler reads a body whole, that a small
// body the handler leaves unread is skipped to serve the next request, and
// that the connection of a large one is closed after the response.
func TestRequestBody(t *testing.T) {
	mux := echoMux()
	mux.HandleFunc("POST "+hotPath, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Ignore-Body") == "" {
			echo(w, r)
			return
		}
		w.Header().Set(servedByField, servedBy(w))
		_, _ = io.WriteString(w, "ignored")
	})
	ts := startLean(t, newHTTP(mux))

	t.Run("read", func(t *testing.T) {
		c := dialRaw(t, ts.addr)
		body := strings.Repeat("0123456789abcdef", 64<<10)
		c.send(hotRequest(body))
		c.expect("POST", 200, "lean", body)
		c.send(hotRequest("next"))
		c.expect("POST", 200, "lean", "next")
	})
	t.Run("small unread", func(t *testing.T) {
		c := dialRaw(t, ts.addr)
		c.send(hotRequest(strings.Repeat("z", 4<<10), "X-Ignore-Body: 1"))
		if resp := c.expect("POST", 200, "lean", "ignored"); resp.Close {
			t.Error("the response closes the connection, want it kept")
		}
		c.send(hotRequest("next"))
		c.expect("POST", 200, "lean", "next")
	})
	t.Run("large unread", func(t *testing.T) {
		c := dialRaw(t, ts.addr)
		written := make(chan error, 1)
		go func() {
			// The server may close before it read it all.
			_, err := io.WriteString(c, hotRequest(strings.Repeat("z", maxDiscard+64<<10), "X-Ignore-Body: 1"))
			written <- err
		}()
		if resp := c.expect("POST", 200, "lean", "ignored"); !resp.Close {
			t.Error("the response keeps the connection, want Connection: close")
		}
		c.expectClosed()
		receive(t, written, "end of the request's write")
	})
}

// TestHandedOffRequests checks that requests the lean path does not serve
// reach net/http, which answers them, malformed ones with its own errors.
func TestHandedOffRequests(t *testing.T) {
	ts := startLean(t, newHTTP(echoMux()))
	const line = "POST " + hotPath + " HTTP/1.1\r\n"
	for _, tc := range []struct {
		name, request string
		status        int
		by, body      string // body is a prefix of the response's for errors
		closes        bool
	}{
		{"chunked body", line + "Host: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 200, "net/http", "hello", false},
		{"chunked and Content-Length", line + "Host: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
			200, "net/http", "hi", false},
		{"HTTP/1.0", "POST " + hotPath + " HTTP/1.0\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello", 200, "net/http", "hello", true},
		{"head over 8 KiB", hotRequest("big", "X-Pad: "+strings.Repeat("p", readBufferSize)), 200, "net/http", "big", false},
		{"query", "POST " + hotPath + "?stream=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nq", 200, "net/http", "q", false},
		{"other path", "POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\ne", 200, "net/http", "e", false},
		{"obs-fold", line + "Host: t\r\nX-Fold: a\r\n b\r\nContent-Length: 1\r\n\r\nf", 200, "net/http", "f", false},
		{"garbage", "\x00\x01\x02 hello\r\n\r\n", 400, "", "400 Bad Request", true},
		{"missing Host", line + "Content-Length: 0\r\n\r\n", 400, "", "400 Bad Request", true},
		{"two Hosts", line + "Host: a\r\nHost: b\r\n\r\n", 400, "", "400 Bad Request", true},
		{"malformed Host", line + "Host: a/b\r\n\r\n", 400, "", "400 Bad Request", true},
		{"bad Content-Length", line + "Host: t\r\nContent-Length: +1\r\n\r\nx", 400, "", "400 Bad Request", true},
		{"bare LF", line + "Host: t\nContent-Length: 1\n\nl", 200, "net/http", "l", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, ts.addr)
			c.send(tc.request)
			resp, body := c.response("POST")
			if resp.StatusCode != tc.status || resp.Header.Get(servedByField) != tc.by || !strings.HasPrefix(body, tc.body) {
				t.Fatalf("got %d from %q with body %q, want %d from %q with body %q",
					resp.StatusCode, resp.Header.Get(servedByField), body, tc.status, tc.by, tc.body)
			}
			if tc.closes {
				c.expectClosed()
				return
			}
			// net/http serves what follows on the connection.
			c.send(hotRequest("after"))
			c.expect("POST", 200, "net/http", "after")
		})
	}
}

// TestExpectContinue checks that a request expecting 100 Continue goes to
// net/http, which asks for the body when the handler reads it.
func TestExpectContinue(t *testing.T) {
	ts := startLean(t, newHTTP(echoMux()))
	c := dialRaw(t, ts.addr)
	c.send("POST " + hotPath + " HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	c.expect("POST", http.StatusContinue, "", "")
	c.send("hello")
	c.expect("POST", 200, "net/http", "hello")
}

// TestConnectionClose checks that a request asking to close its connection,
// or a handler saying Connection: close, closes the connection after the
// response.
func TestConnectionClose(t *testing.T) {
	mux := echoMux()
	mux.HandleFunc("POST "+hotPath, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Close") != "" {
			w.Header().Set("Connection", "close")
		}
		echo(w, r)
	})
	ts := startLean(t, newHTTP(mux))
	for who, field := range map[string]string{"client": "Connection: close", "handler": "X-Close: 1"} {
		t.Run(who, func(t *testing.T) {
			c := dialRaw(t, ts.addr)
			c.send(hotRequest("bye", field))
			if resp := c.expect("POST", 200, "lean", "bye"); !resp.Close {
				t.Errorf("the response's Connection is %q, want close", resp.Header.Get("Connection"))
			}
			c.expectClosed()
		})
	}
}

// TestHandlerPanics checks that a handler panicking with
// http.ErrAbortHandler after a flush cuts its response, silently, that
// another panic is logged and closes its connection, and that the server
// serves other connections after both.
func TestHandlerPanics(t *testing.T) {
	mux := echoMux()
	mux.HandleFunc("POST "+hotPath, func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Panic") {
		case "abort":
			w.Header().Set(servedByField, servedBy(w))
			_, _ = io.WriteString(w, "partial")
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		case "boom":
			panic("boom")
		}
		echo(w, r)
	})
	ts := startLean(t, newHTTP(mux))

	c := dialRaw(t, ts.addr)
	c.send(hotRequest("", "X-Panic: abort"))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("read the response's head: %v", err)
	}
	if resp.Header.Get(servedByField) != "lean" || len(resp.TransferEncoding) == 0 {
		t.Errorf("served by %q with Transfer-Encoding %q, want lean and chunked",
			resp.Header.Get(servedByField), resp.TransferEncoding)
	}
	body, err := io.ReadAll(resp.Body)
	if err == nil || string(body) != "partial" {
		t.Errorf("read the body %q, %v; want partial, then an error", body, err)
	}

	c = dialRaw(t, ts.addr)
	c.send(hotRequest("", "X-Panic: boom"))
	if _, err := http.ReadResponse(c.br, nil); err == nil {
		t.Error("read a response to a request whose handler panicked")
	}
	if log := ts.log.String(); !strings.Contains(log, "boom") || strings.Contains(log, http.ErrAbortHandler.Error()) {
		t.Errorf("the log is %q, want the panic boom, not the abort", log)
	}

	c = dialRaw(t, ts.addr)
	c.send(hotRequest("still"))
	c.expect("POST", 200, "lean", "still")
}

// TestClientGoneCancelsContext checks that a request's context is cancelled
// when its client goes away while the handler runs.
func TestClientGoneCancelsContext(t *testing.T) {
	started := make(chan struct{}, 1)
	ended := make(chan error, 1)
	ts := startLean(t, newHTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if servedBy(w) != "lean" {
			ended <- errors.New("served by net/http")
			return
		}
		started <- struct{}{}
		select {
		case <-r.Context().Done():
			ended <- r.Context().Err()
		case <-time.After(waitFor):
			ended <- errors.New("the context is not done")
		}
	})))
	c := dialRaw(t, ts.addr)
	c.send(hotRequest(""))
	receive(t, started, "start of the handler")
	_ = c.Close()
	if err := receive(t, ended, "end of the handler"); !errors.Is(err, context.Canceled) {
		t.Errorf("the handler ended with %v, want context.Canceled", err)
	}
}

// closerFunc is an io.Closer that runs a function.
type closerFunc func()

func (f closerFunc) Close() error { f(); return nil }

// TestClientGoneClosesWhatTheHandlerNamed checks GoneCloser: what a handler
// asks to be closed is closed when its client goes away, whether before or
// after it asked, and StopClosing says so; a request that ends with its
// client there closes nothing.
func TestClientGoneClosesWhatTheHandlerNamed(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		askAfterGone, goAway bool
	}{
		{"client gone while the handler waits", false, true},
		{"client gone before the handler asks", true, true},
		{"client stays", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			started, closed := make(chan struct{}, 1), make(chan struct{}, 1)
			ended := make(chan bool, 1)
			ts := startLean(t, newHTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				gc, ok := w.(GoneCloser)
				if !ok || servedBy(w) != "lean" {
					t.Error("the request was not served here")
					return
				}
				started <- struct{}{}
				closer := closerFunc(func() { closed <- struct{}{} })
				switch {
				case tc.askAfterGone:
					<-r.Context().Done()
					gc.CloseWhenGone(closer)
				case tc.goAway:
					gc.CloseWhenGone(closer)
					<-r.Context().Done()
				default:
					// The watch reads the connection, the client there.
					gc.CloseWhenGone(closer)
					if !eventually(func() bool { return watchReading(w.(*response).c) }) {
						t.Error("the watch did not start")
					}
				}
				ended <- gc.StopClosing()
				if !tc.goAway {
					echo(w, r)
				}
			})))
			c := dialRaw(t, ts.addr)
			c.send(hotRequest(""))
			receive(t, started, "start of the handler")
			if tc.goAway {
				_ = c.Close()
			}
			stopped := receive(t, ended, "end of the handler")
			if tc.goAway {
				receive(t, closed, "the close")
				if stopped {
					t.Error("StopClosing reports it withdrew a closer that was closed")
				}
				return
			}
			c.expect("POST", 200, "lean", "")
			if !stopped || len(closed) != 0 {
				t.Errorf("StopClosing = %v, %d closes; want true and none with the client still there", stopped, len(closed))
			}
		})
	}
}

// blockingMux is echoMux with a hot request whose handler, when the request
// says X-Block, tells started and waits for release.
func blockingMux(started chan<- struct{}, release <-chan struct{}) *http.ServeMux {
	mux := echoMux()
	mux.HandleFunc("POST "+hotPath, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			started <- struct{}{}
			<-release
		}
		echo(w, r)
	})
	return mux
}

// TestShutdown checks that Shutdown closes idle connections at once (one
// that has sent nothing yet after newConnGrace), lets the requests in
// flight end and be answered, then returns, and that Serve then returns
// http.ErrServerClosed.
func TestShutdown(t *testing.T) {
	shutdown := func(ts *testServer) <-chan error {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			done <- ts.Shutdown(ctx)
		}()
		return done
	}
	t.Run("idle", func(t *testing.T) {
		ts := startLean(t, newHTTP(echoMux()))
		lean, handed := answeredPair(t, ts)
		silent := dialRaw(t, ts.addr)
		done := shutdown(ts)
		lean.expectClosed()
		handed.expectClosed()
		silent.expectClosed()
		if err := receive(t, done, "return from Shutdown"); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		wantServerClosed(t, ts.serveErr(t))
	})
	t.Run("new connection", func(t *testing.T) {
		ts := startLean(t, newHTTP(echoMux()))
		c := dialRaw(t, ts.addr)
		waitUntil(t, "the connection accepted", func() bool {
			ts.mu.Lock()
			defer ts.mu.Unlock()
			return len(ts.conns) == 1
		})
		done := shutdown(ts)
		waitRefusing(t, ts.addr)
		// The client sends its first request after Shutdown began: it is
		// served, and the connection closes after it.
		c.send(hotRequest("late"))
		if resp := c.expect("POST", 200, "lean", "late"); !resp.Close {
			t.Error("the response to a request served during Shutdown does not close the connection")
		}
		c.expectClosed()
		if err := receive(t, done, "return from Shutdown"); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	t.Run("in flight", func(t *testing.T) {
		started, release := make(chan struct{}, 1), make(chan struct{})
		ts := startLean(t, newHTTP(blockingMux(started, release)))
		c := dialRaw(t, ts.addr)
		c.send(hotRequest("last", "X-Block: 1"))
		receive(t, started, "start of the handler")
		done := shutdown(ts)
		waitRefusing(t, ts.addr)
		select {
		case err := <-done:
			t.Fatalf("Shutdown returned %v while a request ran", err)
		default:
		}
		close(release)
		if resp := c.expect("POST", 200, "lean", "last"); !resp.Close {
			t.Error("the response of a request that ended in Shutdown keeps its connection")
		}
		c.expectClosed()
		if err := receive(t, done, "return from Shutdown"); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		wantServerClosed(t, ts.serveErr(t))
	})
}

// answeredPair opens two idle connections to ts, one answered on the lean
// path and one handed to net/http.
func answeredPair(t *testing.T, ts *testServer) (lean, handed *rawConn) {
	t.Helper()
	lean = dialRaw(t, ts.addr)
	lean.send(hotRequest("x"))
	lean.expect("POST", 200, "lean", "x")
	handed = dialRaw(t, ts.addr)
	handed.send(getRequest("/healthz"))
	handed.expect("GET", 200, "net/http", "ok")
	return lean, handed
}

// waitRefusing waits until the listener at addr refuses connections.
func waitRefusing(t *testing.T, addr string) {
	t.Helper()
	waitUntil(t, "refusing connections", func() bool {
		nc, err := net.Dial("tcp", addr)
		if err == nil {
			_ = nc.Close()
		}
		return err != nil
	})
}

// TestClose checks that Close closes every connection at once, the ones
// with a request in flight included, and that Serve then returns
// http.ErrServerClosed.
func TestClose(t *testing.T) {
	started, release := make(chan struct{}, 1), make(chan struct{})
	ts := startLean(t, newHTTP(blockingMux(started, release)))
	t.Cleanup(func() { close(release) })
	busy := dialRaw(t, ts.addr)
	busy.send(hotRequest("", "X-Block: 1"))
	receive(t, started, "start of the handler")
	idle, handed := answeredPair(t, ts)
	if err := ts.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	busy.expectClosed()
	idle.expectClosed()
	handed.expectClosed()
	wantServerClosed(t, ts.serveErr(t))
	if _, err := net.Dial("tcp", ts.addr); err == nil {
		t.Error("the listener accepts connections after Close")
	}
}

// TestStoppedBeforeServe checks that Serve, called after Shutdown or Close
// or racing them, returns http.ErrServerClosed and closes its listener, as
// under net/http, and that Shutdown and Close return meanwhile.
func TestStoppedBeforeServe(t *testing.T) {
	for _, stop := range []struct {
		name string
		f    func(*Server) error
	}{
		{"Shutdown", func(s *Server) error { return s.Shutdown(context.Background()) }},
		{"Close", (*Server).Close},
	} {
		t.Run(stop.name+" first", func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			s := &Server{HTTP: newHTTP(echoMux()), Hot: []string{"POST " + hotPath}}
			if err := stop.f(s); err != nil {
				t.Errorf("%s: %v", stop.name, err)
			}
			wantServerClosed(t, s.Serve(ln))
			if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
				t.Error("the listener accepts connections after Serve returned")
			}
		})
		t.Run(stop.name+" racing", func(t *testing.T) {
			for range 50 {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				s := &Server{HTTP: newHTTP(echoMux()), Hot: []string{"POST " + hotPath}}
				served := make(chan error, 1)
				go func() { served <- s.Serve(ln) }()
				if err := stop.f(s); err != nil {
					t.Errorf("%s: %v", stop.name, err)
				}
				wantServerClosed(t, receive(t, served, "Serve's return"))
			}
		})
	}
}

// TestReadHeaderTimeout checks that a client that sends a head partly, or
// nothing, has its connection closed once the ReadHeaderTimeout passed (or
// the ReadTimeout, when that is zero, as net/http does).
func TestReadHeaderTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	for _, tc := range []struct {
		name    string
		srv     *http.Server
		first   bool // a request is answered before the partial one
		partial string
	}{
		{"partial head", &http.Server{ReadHeaderTimeout: timeout, IdleTimeout: time.Minute}, false, "POST " + hotPath + " HTTP/1.1\r\nHost: t\r\n"},
		{"partial head after a request", &http.Server{ReadHeaderTimeout: timeout, IdleTimeout: time.Minute}, true, "POST " + hotPath + " HTTP/1.1\r\nHost: t\r\n"},
		{"nothing", &http.Server{ReadHeaderTimeout: timeout, IdleTimeout: time.Minute}, false, ""},
		{"partial head, ReadTimeout", &http.Server{ReadTimeout: timeout}, false, "POST " + hotPath + " HTTP/1.1\r\nHost: t\r\n"},
		{"nothing, ReadTimeout", &http.Server{ReadTimeout: timeout}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.srv.Handler = echoMux()
			ts := startLean(t, tc.srv)
			start := time.Now()
			c := dialRaw(t, ts.addr)
			if tc.first {
				c.send(hotRequest("x"))
				c.expect("POST", 200, "lean", "x")
				start = time.Now()
			}
			if tc.partial != "" {
				c.send(tc.partial)
			}
			c.expectClosed()
			if d := time.Since(start); d < timeout {
				t.Errorf("closed after %v, before the timeout", d)
			}
		})
	}
}

// TestIdleTimeout checks that a connection waiting for its next request
// is closed once the IdleTimeout passed.
func TestIdleTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	ts := startLean(t, &http.Server{Handler: echoMux(), ReadHeaderTimeout: waitFor, IdleTimeout: timeout})
	c := dialRaw(t, ts.addr)
	start := time.Now()
	c.send(hotRequest("x"))
	c.expect("POST", 200, "lean", "x")
	c.expectClosed()
	if d := time.Since(start); d < timeout {
		t.Errorf("closed after %v, before the IdleTimeout", d)
	}
}

// watchReading reports whether the watch of c's connection has a read in
// flight.
func watchReading(c *conn) bool {
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	return c.watching
}

// TestKeepAliveAfterWatch checks that a connection serves its next request
// after one that ran long enough to be watched, with no timeouts set, as
// with them.
func TestKeepAliveAfterWatch(t *testing.T) {
	handler := func(w http.ResponseWriter, r *http.Request) {
		if rw, ok := w.(*response); ok && r.Header.Get("X-Wait-Watch") != "" {
			w.Header().Set("X-Watched", strconv.FormatBool(eventually(func() bool { return watchReading(rw.c) })))
		}
		echo(w, r)
	}
	for name, srv := range map[string]*http.Server{
		"no timeouts": {Handler: http.HandlerFunc(handler)},
		"timeouts":    {Handler: http.HandlerFunc(handler), ReadHeaderTimeout: waitFor, IdleTimeout: time.Minute},
	} {
		t.Run(name, func(t *testing.T) {
			ts := startLean(t, srv)
			c := dialRaw(t, ts.addr)
			c.send(hotRequest("", "X-Wait-Watch: 1"))
			if resp := c.expect("POST", 200, "lean", ""); resp.Header.Get("X-Watched") != "true" {
				t.Fatal("the watch did not start")
			}
			c.send(hotRequest("next"))
			c.expect("POST", 200, "lean", "next")
		})
	}
}

// TestResponseController checks that a handler on the lean path sets its
// connection's deadlines and flushes through an http.ResponseController.
func TestResponseController(t *testing.T) {
	errs := make(chan []error, 1)
	ts := startLean(t, newHTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(servedByField, servedBy(w))
		rc := http.NewResponseController(w)
		errs <- []error{
			rc.SetReadDeadline(time.Now().Add(time.Minute)),
			rc.SetWriteDeadline(time.Now().Add(time.Minute)),
			rc.Flush(),
		}
		_, _ = io.WriteString(w, "flushed")
	})))
	c := dialRaw(t, ts.addr)
	c.send(hotRequest(""))
	resp := c.expect("POST", 200, "lean", "flushed")
	if len(resp.TransferEncoding) == 0 {
		t.Error("a flushed response is not chunked")
	}
	for i, err := range receive(t, errs, "the handler's errors") {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
}

// TestRequestContext checks that the lean path's requests carry the context
// values net/http's do: the server, the local address, and what the
// BaseContext and ConnContext hooks add.
func TestRequestContext(t *testing.T) {
	type key string
	var srv *http.Server
	srv = newHTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		local, _ := ctx.Value(http.LocalAddrContextKey).(net.Addr)
		w.Header().Set(servedByField, servedBy(w))
		_, _ = io.WriteString(w, strings.Join([]string{
			"server=" + strconv.FormatBool(ctx.Value(http.ServerContextKey) == srv),
			"local=" + strconv.FormatBool(local != nil && local.String() == r.Host),
			"base=" + strconv.FormatBool(ctx.Value(key("base")) == "b"),
			"conn=" + strconv.FormatBool(ctx.Value(key("conn")) == "c"),
		}, " "))
	}))
	srv.BaseContext = func(net.Listener) context.Context {
		return context.WithValue(context.Background(), key("base"), "b")
	}
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, key("conn"), "c")
	}
	ts := startLean(t, srv)
	const want = "server=true local=true base=true conn=true"
	c := dialRaw(t, ts.addr)
	host := "Host: " + ts.addr
	c.send(strings.Replace(hotRequest(""), "Host: test", host, 1))
	c.expect("POST", 200, "lean", want)
	c.send(strings.Replace(getRequest("/"), "Host: test", host, 1))
	c.expect("GET", 200, "net/http", want)
}

// TestMaxHeaderBytes checks that a head the net/http server's
// MaxHeaderBytes refuses goes to net/http, which refuses it, though it fits
// the lean path's buffer.
func TestMaxHeaderBytes(t *testing.T) {
	srv := newHTTP(echoMux())
	srv.MaxHeaderBytes = 1 // net/http allows 4 KiB more
	ts := startLean(t, srv)
	c := dialRaw(t, ts.addr)
	c.send(hotRequest("small"))
	c.expect("POST", 200, "lean", "small")
	c.send(hotRequest("big", "X-Pad: "+strings.Repeat("p", 5<<10)))
	resp, _ := c.response("POST")
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("got %d from %q, want 431 from net/http", resp.StatusCode, resp.Header.Get(servedByField))
	}
}

// TestServeChecksHotRequests checks that Serve refuses a hot request it
// could not serve as net/http would.
func TestServeChecksHotRequests(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := &Server{HTTP: newHTTP(echoMux()), Hot: []string{"POST /v1/completions?stream=1"}}
	if err := s.Serve(ln); err == nil || errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve returned %v, want an error for the hot request", err)
	}
}
