package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// conn is a keep-alive HTTP/1.1 client connection that sends prepared
// requests and reads their responses without allocating per request, so
// that the load generator's own CPU stays small beside what it measures.
// It understands what the targets answer: bodies framed by Content-Length
// or chunked (with or without trailers).
type conn struct {
	addr string
	nc   net.Conn
	r    *bufio.Reader
	bufs net.Buffers
	// tail keeps the last bytes of the body, for streams to prove they
	// ended with [DONE].
	tail []byte
}

// response is what conn.do reads of a response.
type response struct {
	status int
	// timing is the gateway's Server-Timing header values and trailers,
	// the part the caller asked to keep.
	timing []byte
	// done reports that the body ended with the SSE end marker.
	done bool
}

func dial(addr string) (*conn, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &conn{addr: addr, nc: nc, r: bufio.NewReaderSize(nc, 64<<10), tail: make([]byte, 0, 32)}, nil
}

func (c *conn) close() { _ = c.nc.Close() }

// sseDone ends an OpenAI stream.
var sseDone = []byte("data: [DONE]\n\n")

// errProtocol reports a response the client cannot read.
var errProtocol = errors.New("malformed response")

// do sends the request whose bytes are parts and reads the response,
// keeping the Server-Timing values in res.timing when keepTiming is set.
func (c *conn) do(parts [][]byte, res *response, keepTiming bool) error {
	c.bufs = append(c.bufs[:0], parts...)
	if _, err := c.bufs.WriteTo(c.nc); err != nil {
		return err
	}
	res.status, res.done = 0, false
	res.timing = res.timing[:0]
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return fmt.Errorf("%w: status line %q", errProtocol, line)
	}
	if res.status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return fmt.Errorf("%w: status line %q", errProtocol, line)
	}
	length, chunked, closing, err := c.headers(res, keepTiming)
	if err != nil {
		return err
	}
	c.tail = c.tail[:0]
	switch {
	case chunked:
		err = c.chunkedBody(res, keepTiming)
	case length >= 0:
		err = c.discard(length)
	default:
		return fmt.Errorf("%w: a body framed by the connection's end", errProtocol)
	}
	if err != nil {
		return err
	}
	res.done = bytes.HasSuffix(c.tail, sseDone)
	if closing {
		return errors.New("the server closed the connection")
	}
	return nil
}

// headers reads the header block, returning the body's framing.
func (c *conn) headers(res *response, keepTiming bool) (length int, chunked, closing bool, err error) {
	length = -1
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return 0, false, false, err
		}
		if len(line) <= 2 {
			return length, chunked, closing, nil
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, false, false, fmt.Errorf("%w: header %q", errProtocol, line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return 0, false, false, fmt.Errorf("%w: Content-Length %q", errProtocol, value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(value, []byte("close"))
		case keepTiming && bytes.EqualFold(name, []byte("Server-Timing")):
			res.timing = append(append(res.timing, value...), ',')
		}
	}
}

// chunkedBody reads a chunked body and its trailers.
func (c *conn) chunkedBody(res *response, keepTiming bool) error {
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		n, err := chunkSize(line)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		if err := c.discard(int(n)); err != nil {
			return err
		}
		if _, err := c.r.Discard(2); err != nil {
			return err
		}
	}
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) <= 2 {
			return nil
		}
		if name, value, ok := bytes.Cut(line, []byte(":")); ok && keepTiming && bytes.EqualFold(name, []byte("Server-Timing")) {
			res.timing = append(append(res.timing, bytes.TrimSpace(value)...), ',')
		}
	}
}

// discard skips n bytes of body, keeping the last ones in c.tail.
func (c *conn) discard(n int) error {
	for n > 0 {
		b, err := c.r.Peek(min(n, c.r.Size()))
		if len(b) == 0 {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		c.keepTail(b)
		_, _ = c.r.Discard(len(b))
		n -= len(b)
	}
	return nil
}

func (c *conn) keepTail(b []byte) {
	if len(b) >= cap(c.tail) {
		c.tail = append(c.tail[:0], b[len(b)-cap(c.tail):]...)
		return
	}
	if over := len(c.tail) + len(b) - cap(c.tail); over > 0 {
		c.tail = append(c.tail[:0], c.tail[over:]...)
	}
	c.tail = append(c.tail, b...)
}

// requestHead returns the start of a POST to path on host with a body of n
// bytes, and header lines extra (each ending in CRLF).
func requestHead(host, path string, n int, extra string) []byte {
	return []byte("POST " + path + " HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(n) + "\r\n" + extra + "\r\n")
}
