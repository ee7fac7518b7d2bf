package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// pipeConn is a podConn reading from r, for tests of the response reader.
func pipeConn(r io.Reader) *podConn {
	return &podConn{br: bufio.NewReaderSize(r, 64)}
}

// readAll reads a response from raw and returns its status, headers (one
// "Name: value" line each) and body.
func readAll(raw string, wrap func(io.Reader) io.Reader) (status int, header []string, body string, err error) {
	c := pipeConn(wrap(strings.NewReader(raw)))
	var res podResponse
	if err := c.readHead(res.reset()); err != nil {
		return 0, nil, "", err
	}
	for res.status < 200 {
		if err := c.readHead(&res); err != nil {
			return 0, nil, "", err
		}
	}
	res.body.conn = c
	for _, f := range res.fields {
		header = append(header, string(res.headerBytes[f.start:f.end]))
	}
	data, err := io.ReadAll(&res.body)
	return res.status, header, string(data), err
}

// reset empties r for a new response.
func (r *podResponse) reset() *podResponse {
	*r = podResponse{}
	return r
}

func TestPodResponseReadsEveryFraming(t *testing.T) {
	tests := []struct {
		name, raw string
		status    int
		header    []string
		body      string
		err       error
	}{
		{"length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\nhello", 200,
			[]string{"Content-Length: 5", "Content-Type: application/json"}, "hello", nil},
		{"chunked with extension and trailer", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n", 200, []string{"Transfer-Encoding: chunked"}, "abcde", nil},
		{"until close", "HTTP/1.1 500 Oops\r\nServer: x\r\n\r\nall of it", 500, []string{"Server: x"}, "all of it", nil},
		{"informational first", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nX-A:  b \r\n\r\n", 204,
			[]string{"X-A: b"}, "", nil},
		{"length cut", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", 200, []string{"Content-Length: 10"}, "hello",
			io.ErrUnexpectedEOF},
		{"chunk cut", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", 200,
			[]string{"Transfer-Encoding: chunked"}, "ab", io.ErrUnexpectedEOF},
		{"no last chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n", 200,
			[]string{"Transfer-Encoding: chunked"}, "ab", io.ErrUnexpectedEOF},
		{"chunk longer than its size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n", 200,
			[]string{"Transfer-Encoding: chunked"}, "ab", errBadResponse},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 200,
			[]string{"Transfer-Encoding: chunked"}, "", errBadResponse},
	}
	for _, tt := range tests {
		for wrapName, wrap := range map[string]func(io.Reader) io.Reader{
			"whole": func(r io.Reader) io.Reader { return r }, "byte by byte": iotest.OneByteReader,
		} {
			status, header, body, err := readAll(tt.raw, wrap)
			if status != tt.status || strings.Join(header, "|") != strings.Join(tt.header, "|") || body != tt.body ||
				!errors.Is(err, tt.err) {
				t.Errorf("%s, %s: %d %q %q %v; want %d %q %q %v", tt.name, wrapName, status, header, body, err,
					tt.status, tt.header, tt.body, tt.err)
			}
		}
	}
}

func TestPodResponseRefusesBrokenHeads(t *testing.T) {
	for _, raw := range []string{
		"HTTP/2 200\r\n\r\n", "HTTP/1.1 2000 OK\r\n\r\n", "HTTP/1.1 abc OK\r\n\r\n", "SSH-2.0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n", "HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "HTTP/1.1 101 Switching\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: " + strings.Repeat("y", 100) + "\r\n\r\n", // beyond the test's 64-byte buffer
		strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", maxInformationalResponses+2) + "HTTP/1.1 200 OK\r\n\r\n",
	} {
		c := pipeConn(strings.NewReader(raw))
		c.nc = nopConn{}
		var res podResponse
		if err := c.readResponse(&res, time.Second); !errors.Is(err, errBadResponse) {
			t.Errorf("%q: %v, want errBadResponse", raw, err)
		}
	}
}

// TestPodResponsesWithoutABodyIgnoreTheirFraming: a 204 or a 304 has no
// body whatever its headers say (RFC 9112, 6.3), as net/http reads it; the
// bytes after its head are not its body.
func TestPodResponsesWithoutABodyIgnoreTheirFraming(t *testing.T) {
	for _, head := range []string{
		"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\n",
	} {
		status, _, body, err := readAll(head+"3\r\nabc\r\n0\r\n\r\n", func(r io.Reader) io.Reader { return r })
		if status < 204 || body != "" || err != nil {
			t.Errorf("%q: %d with body %q, %v; want no body", head, status, body, err)
		}
	}
}

// TestPodResponseRefusesControlBytesInHeaderValues: a header value holding
// a control byte other than HTAB is refused, as net/http refuses it, rather
// than relayed to the client; HTAB and bytes beyond ASCII pass.
func TestPodResponseRefusesControlBytesInHeaderValues(t *testing.T) {
	for _, v := range []string{"a\x00b", "a\rb", "a\x01b", "a\x1fb", "a\x7fb"} {
		c := pipeConn(strings.NewReader("HTTP/1.1 200 OK\r\nX-A: " + v + "\r\nContent-Length: 0\r\n\r\n"))
		var res podResponse
		if err := c.readHead(&res); !errors.Is(err, errBadResponse) {
			t.Errorf("value %q: %v, want errBadResponse", v, err)
		}
	}
	_, header, _, err := readAll("HTTP/1.1 200 OK\r\nX-A: a\tb\xc3\xa9\r\nContent-Length: 0\r\n\r\n",
		func(r io.Reader) io.Reader { return r })
	if err != nil || len(header) != 2 || header[0] != "X-A: a\tb\xc3\xa9" {
		t.Errorf("a value with HTAB and UTF-8: %q, %v", header, err)
	}
}

// TestPodResponseRefusesTransferCodingsOtherThanChunked: the gateway drops
// Transfer-Encoding, so a coding besides chunked would reach the client
// undone; like net/http it takes one field saying chunked, in any case,
// and refuses any other.
func TestPodResponseRefusesTransferCodingsOtherThanChunked(t *testing.T) {
	for _, te := range []string{"gzip, chunked", "chunked, chunked", "identity", "chunked\r\nTransfer-Encoding: chunked"} {
		c := pipeConn(strings.NewReader("HTTP/1.1 200 OK\r\nTransfer-Encoding: " + te + "\r\n\r\n0\r\n\r\n"))
		var res podResponse
		if err := c.readHead(&res); !errors.Is(err, errBadResponse) {
			t.Errorf("Transfer-Encoding %q: %v, want errBadResponse", te, err)
		}
	}
	for _, te := range []string{"chunked", "Chunked"} {
		_, _, body, err := readAll("HTTP/1.1 200 OK\r\nTransfer-Encoding: "+te+"\r\n\r\n2\r\nok\r\n0\r\n\r\n",
			func(r io.Reader) io.Reader { return r })
		if body != "ok" || err != nil {
			t.Errorf("Transfer-Encoding %q: body %q, %v; want \"ok\"", te, body, err)
		}
	}
}

// TestAnHTTP10ResponseWithTransferEncodingClosesItsConnection: HTTP/1.0
// has no Transfer-Encoding, so a response that carries one has framing not
// to be trusted, and its connection closes after it even when it asks to
// be kept alive (RFC 9112, 6.1).
func TestAnHTTP10ResponseWithTransferEncodingClosesItsConnection(t *testing.T) {
	for _, raw := range []string{
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok",
	} {
		c := pipeConn(strings.NewReader(raw))
		var res podResponse
		if err := c.readHead(&res); err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		if res.keepAlive {
			t.Errorf("%q: the connection is kept alive", raw)
		}
	}
	c := pipeConn(strings.NewReader("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"))
	var res podResponse
	if err := c.readHead(&res); err != nil || !res.keepAlive {
		t.Errorf("HTTP/1.0 with Content-Length and keep-alive: kept alive %v, %v; want kept", res.keepAlive, err)
	}
}

// nopConn is a net.Conn whose deadlines are ignored.
type nopConn struct{ net.Conn }

func (nopConn) SetReadDeadline(time.Time) error { return nil }

func TestPodBodyRefusesEndlessTrailers(t *testing.T) {
	trailers := strings.Repeat("X-T: "+strings.Repeat("t", 40)+"\r\n", maxResponseHeaderBytes/40)
	_, _, body, err := readAll("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n"+trailers+"\r\n",
		func(r io.Reader) io.Reader { return r })
	if body != "ab" || !errors.Is(err, errBadResponse) {
		t.Fatalf("body %q, err %v; want the chunk's data, then errBadResponse", body, err)
	}
}

func TestPodBodyBufferedNeverPromisesWhatIsNotThere(t *testing.T) {
	// Each chunk arrives alone; between chunks buffered must be 0 so that
	// the relay flushes, and the next chunk is counted once its size line
	// arrived.
	pr, pw := io.Pipe()
	c := pipeConn(pr)
	b := podBody{conn: c, mode: bodyChunked}
	go func() {
		for _, part := range []string{"5\r\nhello", "\r\n", "3\r\nabc\r\n", "0\r\n", "\r\n"} {
			_, _ = pw.Write([]byte(part))
		}
		pw.Close()
	}()
	buf := make([]byte, 16)
	var got []string
	for {
		n, err := b.Read(buf)
		got = append(got, string(buf[:n]))
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if more := b.buffered(); more > 0 && c.br.Buffered() < more {
			t.Fatalf("buffered %d with %d bytes in the buffer", more, c.br.Buffered())
		}
	}
	if strings.Join(got, "") != "helloabc" {
		t.Errorf("read %q", got)
	}
}

// podRoundTrip sends a request to addr on a connection of p, the first
// byte of its answer due within firstByte, and wants "ok" back; it returns
// the connection, released to p.
func podRoundTrip(t *testing.T, p *podPool, addr string, firstByte time.Duration) *podConn {
	t.Helper()
	c, err := p.conn(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	head := []byte("POST /v1/completions HTTP/1.1\r\nHost: " + addr + "\r\nContent-Length: 2\r\n\r\n")
	if err := c.send(head, []byte("{}"), firstByte, time.Hour); err != nil {
		t.Fatal(err)
	}
	var res podResponse
	if err := c.readResponse(&res, time.Minute); err != nil {
		t.Fatal(err)
	}
	if data, err := io.ReadAll(&res.body); err != nil || string(data) != "ok" {
		t.Fatalf("body %q, %v", data, err)
	}
	res.finish()
	return c
}

func TestPodPoolReusesConnectionsAndDropsThoseThePodClosed(t *testing.T) {
	var mu sync.Mutex
	conns := map[net.Conn]http.ConnState{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		mu.Lock()
		conns[c] = s
		mu.Unlock()
	}
	srv.Start()
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	p := newPodPool(time.Second, 4, time.Minute, klog.Logger{})
	defer p.close()
	roundTrip := func() *podConn { return podRoundTrip(t, p, addr, time.Minute) }
	first := roundTrip()
	if second := roundTrip(); second != first {
		t.Fatal("a second request dialled a new connection, want the idle one reused")
	}
	// The engine closes the idle connection.
	srv.CloseClientConnections()
	testsupport.EventuallyWhy(t, "the server to close its connection", func() (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range conns {
			if s != http.StateClosed {
				return s.String(), false
			}
		}
		return "", true
	})
	first.idleSince = time.Now().Add(-time.Second) // idle long enough to be checked
	if third := roundTrip(); third == first {
		t.Fatal("the connection the server closed was reused")
	}
	p.sweep(time.Now().Add(2 * time.Minute))
	p.mu.Lock()
	idle := len(p.idle[addr])
	p.mu.Unlock()
	if idle != 0 {
		t.Errorf("%d connections idle beyond the TTL left after a sweep", idle)
	}
}

// TestPodPoolClosesAConnectionWithBytesBeyondItsResponse: an engine that
// sends more than its response leaves bytes no request asked for; the
// connection is closed rather than pooled, so that the next request, sent
// at once (too soon to be checked), does not read them as its response.
func TestPodPoolClosesAConnectionWithBytesBeyondItsResponse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Every answer, "ok", comes with a second response in the same write.
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				br := bufio.NewReader(nc)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					_, _ = io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"+
						"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged")
				}
			}()
		}
	}()
	addr := ln.Addr().String()
	p := newPodPool(time.Second, 4, time.Minute, klog.Logger{})
	defer p.close()
	first := podRoundTrip(t, p, addr, time.Minute)
	if second := podRoundTrip(t, p, addr, time.Minute); second == first {
		t.Error("the connection with bytes beyond its response was reused")
	}
	p.mu.Lock()
	idle := len(p.idle[addr])
	p.mu.Unlock()
	if idle != 0 {
		t.Errorf("%d connections with bytes beyond their response pooled", idle)
	}
}

// A connection's deadline for its last response passes while it idles in
// the pool: the peek still finds it open, and the next request on it is
// answered. The engine takes 10 ms to answer, so that the read waits for
// it under its deadline.
func TestPodPoolReusesAConnectionWhoseLastDeadlinePassed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(10 * time.Millisecond)
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	p := newPodPool(time.Second, 4, time.Minute, klog.Logger{})
	defer p.close()
	// Long enough for a round trip on a loaded machine.
	const firstByte = time.Second
	roundTrip := func() *podConn { return podRoundTrip(t, p, addr, firstByte) }
	first := roundTrip()
	time.Sleep(firstByte)                          // the first response's deadline, set before it was sent, passes
	first.idleSince = time.Now().Add(-time.Second) // idle long enough to be peeked at
	if second := roundTrip(); second != first {
		t.Error("the idle connection was not reused")
	}
}

func FuzzPodResponseReadsWhatNetHTTPReads(f *testing.F) {
	f.Add("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
	f.Add("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
	f.Add("HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nno")
	f.Add("HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
	f.Fuzz(func(t *testing.T, raw string) {
		status, _, body, err := readAll(raw, func(r io.Reader) io.Reader { return r })
		resp, herr := http.ReadResponse(bufio.NewReader(strings.NewReader(raw)), &http.Request{Method: http.MethodPost})
		if err != nil || herr != nil {
			return
		}
		hbody, herr := io.ReadAll(resp.Body)
		if herr != nil {
			return
		}
		// net/http reads a body without framing from an HTTP/1.0
		// response and closes; both read to the end.
		if status != resp.StatusCode || body != string(hbody) && !bytes.HasPrefix([]byte(raw), []byte("HTTP/1.0")) {
			t.Fatalf("%q: %d %q; net/http %d %q", raw, status, body, resp.StatusCode, hbody)
		}
	})
}
