package leanhttp

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// holdBack is how much of a response's body of unknown length is held
// before its head is written: a response that ends within it is sent with
// a Content-Length, a longer one (or one flushed before) in chunks.
const holdBack = 4 << 10

// maxKeptFields bounds the fields a connection's header map keeps between
// requests.
const maxKeptFields = 64

// response is the http.ResponseWriter of a request served here. Its head
// is fixed when the handler calls WriteHeader (or first writes or
// flushes), as under net/http: fields changed later are left out, but the
// trailers the head declares.
type response struct {
	c          *conn
	header     http.Header
	status     int
	head       []byte   // the head's fields, written at WriteHeader
	trailers   []string // the names the head declares as trailers
	clen       int64    // the declared Content-Length, -1 when none
	written    int64
	pending    []byte // the body held back
	scratch    []byte
	err        error // the first write error
	closeAfter bool  // the connection closes after the response
	headClose  bool  // the head says Connection: close
	noBody     bool
	chunked    bool
	committed  bool // the head was written to the buffer
	wrote      bool // WriteHeader ran
}

func (w *response) reset(closeAfter bool) {
	if len(w.header) > maxKeptFields {
		w.header = http.Header{}
	} else {
		clear(w.header)
	}
	*w = response{c: w.c, header: w.header, head: w.head[:0], trailers: w.trailers[:0], clen: -1,
		pending: w.pending[:0], scratch: w.scratch[:0], closeAfter: closeAfter}
	if cap(w.pending) > holdBack {
		w.pending = nil
	}
}

func (w *response) Header() http.Header { return w.header }

// GoneCloser is implemented by the http.ResponseWriter of a request served
// here. CloseWhenGone arranges for cl to be closed once the client goes
// away before the handler returns (when the request's context is
// cancelled), at once when it already did; StopClosing withdraws that, and
// reports whether it did so before cl was closed. Together they do what
// context.AfterFunc(r.Context(), close) and its stop function do, without
// allocating.
type GoneCloser interface {
	CloseWhenGone(cl io.Closer)
	StopClosing() bool
}

var _ GoneCloser = (*response)(nil)

// CloseWhenGone is GoneCloser's.
func (w *response) CloseWhenGone(cl io.Closer) { w.c.closeWhenGone(cl) }

// StopClosing is GoneCloser's.
func (w *response) StopClosing() bool { return w.c.stopClosing() }

// WriteHeader fixes the response's status and head. Informational statuses
// (1xx) are not sent.
func (w *response) WriteHeader(code int) {
	if w.wrote {
		return
	}
	if code < 100 || code > 999 {
		panic("leanhttp: invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code < 200 {
		return
	}
	w.wrote, w.status = true, code
	w.noBody = code == http.StatusNoContent || code == http.StatusNotModified
	hasDate := false
	for k, vs := range w.header {
		if strings.HasPrefix(k, http.TrailerPrefix) || !validName(k) {
			continue
		}
		switch k {
		case "Content-Length":
			if w.noBody || len(vs) == 0 {
				continue
			}
			n, ok := parseLength(vs[0])
			if !ok {
				continue
			}
			w.clen = n
			w.head = appendField(w.head, k, vs[0])
			continue
		case "Transfer-Encoding":
			// The server frames the body.
			continue
		case "Date":
			hasDate = true
		case "Connection":
			for _, v := range vs {
				w.headClose = w.headClose || hasToken(v, "close")
			}
		case "Trailer":
			for _, v := range vs {
				for t := range strings.SplitSeq(v, ",") {
					if t = trimOWS(t); validName(t) {
						w.trailers = append(w.trailers, canonical(t))
					}
				}
			}
		}
		for _, v := range vs {
			w.head = appendField(w.head, k, v)
		}
	}
	if !hasDate {
		w.head = appendField(w.head, "Date", date())
	}
	w.closeAfter = w.closeAfter || w.headClose
}

// appendField appends a header field, its value's line breaks turned into
// spaces as net/http does.
func appendField(b []byte, k, v string) []byte {
	b = append(b, k...)
	b = append(b, ": "...)
	if strings.ContainsAny(v, "\r\n") {
		v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
	}
	b = append(b, v...)
	return append(b, "\r\n"...)
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	switch {
	case w.err != nil:
		return 0, w.err
	case len(p) == 0:
		// As under net/http, writing nothing succeeds whatever the
		// status: a proxy relays a 204's empty body with no error.
		return 0, nil
	case w.noBody:
		return 0, http.ErrBodyNotAllowed
	case w.clen >= 0 && w.written+int64(len(p)) > w.clen:
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if !w.committed {
		if w.clen < 0 && len(w.pending)+len(p) <= holdBack {
			w.pending = append(w.pending, p...)
			return len(p), nil
		}
		w.commit(false)
	}
	w.writeBody(p)
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// FlushError writes what the response holds to the client.
func (w *response) FlushError() error {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(false)
	}
	if w.err == nil {
		w.err = w.c.bw.Flush()
	}
	return w.err
}

// Flush is http.Flusher's FlushError.
func (w *response) Flush() { _ = w.FlushError() }

// SetReadDeadline sets the connection's read deadline, for the handler to
// bound its read of the body.
func (w *response) SetReadDeadline(t time.Time) error { return w.c.rwc.SetReadDeadline(t) }

// SetWriteDeadline sets the connection's write deadline.
func (w *response) SetWriteDeadline(t time.Time) error { return w.c.rwc.SetWriteDeadline(t) }

// commit writes the head to the buffer: framed by its Content-Length, by
// the held-back body's length when the response ended (final) with no
// trailers, else in chunks.
func (w *response) commit(final bool) {
	w.committed = true
	c := w.c
	if c.s.closing.Load() || c.body.remaining > maxDiscard {
		w.closeAfter = true
	}
	b := append(w.scratch[:0], statusLine(w.status)...)
	b = append(b, w.head...)
	switch {
	case w.noBody || w.clen >= 0:
	case final && !w.hasTrailers():
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(len(w.pending)), 10)
		b = append(b, "\r\n"...)
	default:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
		w.chunked = true
	}
	if w.closeAfter && !w.headClose {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	w.scratch = b
	w.write(b)
	if len(w.pending) > 0 {
		w.writeBody(w.pending)
	}
}

// hasTrailers reports whether the response has trailers to send: then, as
// under net/http, it goes in chunks, whose end carries them.
func (w *response) hasTrailers() bool {
	if len(w.trailers) > 0 {
		return true
	}
	for k := range w.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// writeBody writes p, as a chunk when the response is chunked.
func (w *response) writeBody(p []byte) {
	if len(p) == 0 {
		return
	}
	if w.chunked {
		w.scratch = append(strconv.AppendUint(w.scratch[:0], uint64(len(p)), 16), "\r\n"...)
		w.write(w.scratch)
		w.write(p)
		w.write(crlf)
		return
	}
	w.write(p)
}

var crlf = []byte("\r\n")

func (w *response) write(p []byte) {
	if w.err != nil {
		return
	}
	if _, err := w.c.bw.Write(p); err != nil {
		w.err = err
	}
}

// finish ends the response once the handler returned: it writes the head
// when not written yet, the last chunk and the trailers, and flushes.
func (w *response) finish() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(true)
	}
	if w.chunked {
		b := append(w.scratch[:0], "0\r\n"...)
		for _, k := range w.trailers {
			for _, v := range w.header[k] {
				b = appendField(b, k, v)
			}
		}
		for k, vs := range w.header {
			if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && validName(name) {
				for _, v := range vs {
					b = appendField(b, name, v)
				}
			}
		}
		w.scratch = append(b, "\r\n"...)
		w.write(w.scratch)
	} else if w.clen >= 0 && w.written < w.clen {
		// The body is shorter than its head said: only closing the
		// connection tells the client.
		w.closeAfter = true
	}
	if w.err == nil {
		w.err = w.c.bw.Flush()
	}
}

// statusLines holds the status line of each status code that has a name.
var statusLines = func() (t [600]string) {
	for code := range t {
		if text := http.StatusText(code); text != "" {
			t[code] = "HTTP/1.1 " + strconv.Itoa(code) + " " + text + "\r\n"
		}
	}
	return t
}()

func statusLine(code int) string {
	if code < len(statusLines) && statusLines[code] != "" {
		return statusLines[code]
	}
	return "HTTP/1.1 " + strconv.Itoa(code) + " status code " + strconv.Itoa(code) + "\r\n"
}

// dateValue is the Date field's value for one second.
type dateValue struct {
	second int64
	text   string
}

var lastDate atomic.Pointer[dateValue]

// date returns the Date field's value for now.
func date() string {
	now := time.Now()
	if d := lastDate.Load(); d != nil && d.second == now.Unix() {
		return d.text
	}
	d := &dateValue{second: now.Unix(), text: now.UTC().Format(http.TimeFormat)}
	lastDate.Store(d)
	return d.text
}
