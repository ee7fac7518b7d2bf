package cache

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// scriptedPod is a TCP server that answers each request head it reads
// with the bytes its answer function returns for it, then closes the
// connection if asked to. It counts connections and requests.
type scriptedPod struct {
	ln       net.Listener
	conns    atomic.Int64
	requests atomic.Int64
	// heads receives the request heads read, the first 64 that are not
	// taken in time.
	heads chan string

	mu     sync.Mutex
	answer func(n int, head string) (answer []byte, closeAfter bool)
}

func newScriptedPod(t testing.TB, answer func(n int, head string) ([]byte, bool)) *scriptedPod {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &scriptedPod{ln: ln, answer: answer, heads: make(chan string, 64)}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.conns.Add(1)
			wg.Go(func() { p.serve(c) })
		}
	})
	return p
}

func (p *scriptedPod) setAnswer(answer func(n int, head string) ([]byte, bool)) {
	p.mu.Lock()
	p.answer = answer
	p.mu.Unlock()
}

func (p *scriptedPod) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		var head strings.Builder
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			head.WriteString(line)
			if line == "\r\n" {
				break
			}
		}
		n := int(p.requests.Add(1))
		select {
		case p.heads <- head.String():
		default:
		}
		p.mu.Lock()
		answer := p.answer
		p.mu.Unlock()
		b, closeAfter := answer(n, head.String())
		if _, err := c.Write(b); err != nil || closeAfter {
			return
		}
	}
}

func (p *scriptedPod) client(limit int64) *pageClient {
	return newPageClient(p.ln.Addr().String(), "/metrics", metricsAccept, 10*time.Second, limit)
}

// okAnswer is a 200 answer with body, framed by Content-Length.
func okAnswer(body string, header ...string) []byte {
	return fmt.Appendf(nil, "HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s", headerLines(header), len(body), body)
}

func headerLines(header []string) string {
	var b strings.Builder
	for _, h := range header {
		b.WriteString(h + "\r\n")
	}
	return b.String()
}

func gzipped(t testing.TB, s string) string {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// getPage reads c's page and fails t unless it is want.
func getPage(t *testing.T, c *pageClient, want string) {
	t.Helper()
	var buf bytes.Buffer
	if err := c.get(t.Context(), &buf); err != nil {
		t.Fatalf("get: %v", err)
	}
	if buf.String() != want {
		t.Fatalf("page %q, want %q", buf.String(), want)
	}
}

// readNumberedPages reads the pod's pages "page 1" to "page n" with one
// client, and fails t unless the pod saw wantConns connections.
func readNumberedPages(t *testing.T, pod *scriptedPod, n int, wantConns int64) {
	t.Helper()
	c := pod.client(maxScrapeBytes)
	defer c.close()
	for i := 1; i <= n; i++ {
		getPage(t, c, fmt.Sprint("page ", i))
	}
	if got := pod.conns.Load(); got != wantConns {
		t.Fatalf("%d connections for %d reads, want %d", got, n, wantConns)
	}
}

// getFails reads c's page and fails t unless the read fails for reason.
func getFails(t *testing.T, c *pageClient, reason string) error {
	t.Helper()
	var buf bytes.Buffer
	err := c.get(t.Context(), &buf)
	if err == nil {
		t.Fatalf("get read %q, want a failure for reason %s", buf.String(), reason)
	}
	if got := readReason(err); got != reason {
		t.Fatalf("get failed for reason %s (%v), want %s", got, err, reason)
	}
	return err
}

func TestPageClientKeepsItsConnectionAndSendsTheRequestOnce(t *testing.T) {
	pod := newScriptedPod(t, func(n int, _ string) ([]byte, bool) { return okAnswer(fmt.Sprint("page ", n)), false })
	readNumberedPages(t, pod, 5, 1)
	head := <-pod.heads
	for _, want := range []string{"GET /metrics HTTP/1.1\r\n", "\r\nHost: " + pod.ln.Addr().String() + "\r\n",
		"\r\nAccept: " + metricsAccept + "\r\n", "\r\nAccept-Encoding: gzip\r\n"} {
		if !strings.Contains(head, want) {
			t.Fatalf("request head %q lacks %q", head, want)
		}
	}
}

func TestPageClientReadsEachFramingAndEncoding(t *testing.T) {
	const page = "vllm:num_requests_running 4\n"
	for _, tt := range []struct {
		name   string
		answer string
	}{
		{"content-length", string(okAnswer(page))},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nvllm:\r\n17\r\nnum_requests_running 4\n\r\n0\r\n\r\n"},
		{"gzip", string(okAnswer(gzipped(t, page), "Content-Encoding: gzip"))},
		{"identity", string(okAnswer(page, "Content-Encoding: identity"))},
		{"after informational answers", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + string(okAnswer(page))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := newScriptedPod(t, func(int, string) ([]byte, bool) { return []byte(tt.answer), false })
			c := pod.client(maxScrapeBytes)
			defer c.close()
			getPage(t, c, page)
			getPage(t, c, page)
			if n := pod.conns.Load(); n != 1 {
				t.Fatalf("%d connections, want one kept", n)
			}
		})
	}
}

func TestPageClientRedialsAConnectionThePodClosed(t *testing.T) {
	for _, tt := range []struct {
		name   string
		answer func(n int) ([]byte, bool)
	}{
		// The pod closes the connection after answering, unannounced: the
		// next request finds it closed.
		{"closed while idle", func(n int) ([]byte, bool) { return okAnswer(fmt.Sprint("page ", n)), true }},
		{"Connection: close", func(n int) ([]byte, bool) { return okAnswer(fmt.Sprint("page ", n), "Connection: close"), false }},
		{"body to the connection's end", func(n int) ([]byte, bool) {
			return fmt.Appendf(nil, "HTTP/1.1 200 OK\r\n\r\npage %d", n), true
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := newScriptedPod(t, func(n int, _ string) ([]byte, bool) { return tt.answer(n) })
			readNumberedPages(t, pod, 3, 3)
			if n := pod.requests.Load(); n != 3 {
				t.Fatalf("%d requests for three reads, want three", n)
			}
		})
	}
}

func TestPageClientDialsAnewAfterALongIdle(t *testing.T) {
	pod := newScriptedPod(t, func(n int, _ string) ([]byte, bool) { return okAnswer(fmt.Sprint("page ", n)), false })
	c := pod.client(maxScrapeBytes)
	defer c.close()
	getPage(t, c, "page 1")
	getPage(t, c, "page 2")
	c.idleSince = time.Now().Add(-maxIdleKept - time.Second)
	getPage(t, c, "page 3")
	if n := pod.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want a second one after the idle", n)
	}
	if n := pod.requests.Load(); n != 3 {
		t.Fatalf("%d requests for three reads, want none sent twice", n)
	}
}

func TestPageClientFollowsRedirectsWithinThePodOnly(t *testing.T) {
	pod := newScriptedPod(t, nil)
	addr := pod.ln.Addr().String()
	pod.setAnswer(func(_ int, head string) ([]byte, bool) {
		switch {
		case strings.HasPrefix(head, "GET /metrics "):
			return []byte("HTTP/1.1 307 Temporary Redirect\r\nLocation: /metrics/\r\nContent-Length: 0\r\n\r\n"), false
		case strings.HasPrefix(head, "GET /metrics/ "):
			return []byte("HTTP/1.1 301 Moved Permanently\r\nLocation: http://" + addr + "/v2/metrics?x=1\r\nContent-Length: 3\r\n\r\nabc"), false
		case strings.HasPrefix(head, "GET /v2/metrics?x=1 "):
			return []byte("HTTP/1.1 308 Permanent Redirect\r\nLocation: ?x=2\r\nContent-Length: 0\r\n\r\n"), false
		case strings.HasPrefix(head, "GET /v2/metrics?x=2 "):
			return okAnswer("moved"), false
		}
		return []byte("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"), false
	})
	c := pod.client(maxScrapeBytes)
	defer c.close()
	getPage(t, c, "moved")
	if n := pod.conns.Load(); n != 1 {
		t.Fatalf("%d connections, want the redirects followed on one", n)
	}

	for _, tt := range []struct{ name, answer, want string }{
		{"another address", "HTTP/1.1 302 Found\r\nLocation: http://192.0.2.1:8000/metrics\r\nContent-Length: 0\r\n\r\n", "not a page of the same address"},
		{"another scheme", "HTTP/1.1 302 Found\r\nLocation: https://" + addr + "/metrics\r\nContent-Length: 0\r\n\r\n", "not a page of the same address"},
		{"no location", "HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n", "not a page of the same address"},
		{"a loop", "HTTP/1.1 302 Found\r\nLocation: /metrics\r\nContent-Length: 0\r\n\r\n", "more than 3 redirects"},
		{"an error status", "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy", "HTTP status 503 Service Unavailable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod.setAnswer(func(int, string) ([]byte, bool) { return []byte(tt.answer), false })
			before := pod.requests.Load()
			err := getFails(t, c, readStatus)
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to say %q", err, tt.want)
			}
			if n := pod.requests.Load() - before; n > maxPageRedirects+1 {
				t.Fatalf("%d requests for one read, want at most %d", n, maxPageRedirects+1)
			}
		})
	}
	pod.setAnswer(func(int, string) ([]byte, bool) { return okAnswer("back"), false })
	getPage(t, c, "back")
}

func TestPageClientRefusesWhatItCannotRead(t *testing.T) {
	const limit = 1 << 10
	for _, tt := range []struct {
		name, reason string
		answer       func() []byte
	}{
		{"a page past the limit", readTooLarge, func() []byte { return okAnswer(strings.Repeat("x", limit+1)) }},
		{"a page past the limit once inflated", readTooLarge, func() []byte {
			return okAnswer(gzipped(t, strings.Repeat("x", limit+1)), "Content-Encoding: gzip")
		}},
		{"a head past the wire's bound", readTooLarge, func() []byte {
			return []byte("HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("p", int(pageWireBytes(limit))) + "\r\n\r\n")
		}},
		{"a body that is not the gzip it says", readBadBody, func() []byte { return okAnswer("plain text", "Content-Encoding: gzip") }},
		{"a body in another encoding", readBadBody, func() []byte { return okAnswer("x", "Content-Encoding: br") }},
		{"a malformed status line", readConnection, func() []byte { return []byte("HTTP/1.1 two hundred\r\n\r\n") }},
		{"endless informational answers", readConnection, func() []byte {
			return bytes.Repeat([]byte("HTTP/1.1 100 Continue\r\n\r\n"), maxInformationalAnswers+1)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var bad atomic.Bool
			bad.Store(true)
			pod := newScriptedPod(t, func(int, string) ([]byte, bool) {
				if bad.Load() {
					return tt.answer(), false
				}
				return okAnswer("fine"), false
			})
			c := pod.client(limit)
			defer c.close()
			getFails(t, c, tt.reason)
			bad.Store(false)
			getPage(t, c, "fine")
		})
	}
}

func TestPageClientTimesOutAndEndsWithItsContext(t *testing.T) {
	pod := newScriptedPod(t, func(int, string) ([]byte, bool) { return []byte("HTTP/1.1 200 OK\r\n"), false })
	c := newPageClient(pod.ln.Addr().String(), "/metrics", metricsAccept, 100*time.Millisecond, maxScrapeBytes)
	defer c.close()
	getFails(t, c, readTimeout)
	<-pod.heads

	// A read the pod leaves hanging ends when its context does, long
	// before its timeout.
	c = newPageClient(pod.ln.Addr().String(), "/metrics", metricsAccept, time.Hour, maxScrapeBytes)
	defer c.close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.get(ctx, &bytes.Buffer{}) }()
	<-pod.heads
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("get = %v, want the context's end", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("get still waiting 30s after its context ended")
	}
	// So does a dial, and a read whose context already ended sends nothing.
	if err := c.get(ctx, &bytes.Buffer{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("get with an ended context = %v, want the context's end", err)
	}
	if n := pod.requests.Load(); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
}

// BenchmarkPageClientGet measures a scrape's read of a real vLLM page (50
// KB, gzip-encoded as vLLM sends it) over a kept loopback connection, from
// a pod answering with canned bytes: the request, the answer's head and
// the inflated body; the pod's goroutine, in the same process, included.
func BenchmarkPageClientGet(b *testing.B) {
	page := gzipped(b, string(readExposition(b, "vllm_v1_dp2.txt")))
	answer := okAnswer(page, "Content-Type: text/plain; version=0.0.4; charset=utf-8", "Content-Encoding: gzip")
	pod := newScriptedPod(b, func(int, string) ([]byte, bool) { return answer, false })
	c := pod.client(maxScrapeBytes)
	defer c.close()
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		if err := c.get(b.Context(), &buf); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzPageClientReadsAnyAnswerWithinItsBounds answers a page client's
// first request with any bytes, on a connection the pod then closes: the
// read ends with a page within the limit or fails for one of the failure
// counter's reasons, and the client reads the next page, well formed. The
// connections are in memory (cannedConn), so that fuzzing leaves no
// sockets behind in TIME_WAIT.
func FuzzPageClientReadsAnyAnswerWithinItsBounds(f *testing.F) {
	const limit = 256
	for _, seed := range []string{
		string(okAnswer("page")),
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\npage\r\n0\r\n\r\n",
		string(okAnswer(gzipped(f, "page"), "Content-Encoding: gzip")),
		"HTTP/1.1 100 Continue\r\n\r\n" + string(okAnswer("page")),
		"HTTP/1.1 307 Temporary Redirect\r\nLocation: /metrics/\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\npage",
		"HTTP/1.1 200 OK\r\n\r\n" + strings.Repeat("x", limit+1),
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n",
		"HTTP/1.1 503 Busy\r\nConnection: close\r\n\r\nbusy",
	} {
		f.Add([]byte(seed))
	}
	reasons := map[string]bool{readConnection: true, readTimeout: true, readStatus: true, readTooLarge: true, readBadBody: true}
	f.Fuzz(func(t *testing.T, answer []byte) {
		c := newPageClient("pod:8000", "/metrics", metricsAccept, 10*time.Second, limit)
		dials := 0
		c.dial = func(context.Context, time.Time) (net.Conn, error) {
			dials++
			if dials == 1 {
				return &cannedConn{answer: bytes.NewReader(answer)}, nil
			}
			return &cannedConn{answer: bytes.NewReader(okAnswer("fine"))}, nil
		}
		var buf bytes.Buffer
		if err := c.get(t.Context(), &buf); err != nil {
			if r := readReason(err); !reasons[r] {
				t.Fatalf("failed for reason %q: %v", r, err)
			}
		} else if buf.Len() > limit {
			t.Fatalf("read a page of %d bytes, beyond the limit of %d", buf.Len(), limit)
		}
		getPage(t, c, "fine")
	})
}

// cannedConn is a connection in memory whose peer answers with the bytes
// of answer whatever it is sent, then closes it.
type cannedConn struct {
	answer *bytes.Reader
}

func (c *cannedConn) Read(p []byte) (int, error)       { return c.answer.Read(p) }
func (c *cannedConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *cannedConn) Close() error                     { return nil }
func (c *cannedConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *cannedConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *cannedConn) SetDeadline(time.Time) error      { return nil }
func (c *cannedConn) SetReadDeadline(time.Time) error  { return nil }
func (c *cannedConn) SetWriteDeadline(time.Time) error { return nil }
