package leanhttp

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// framingHandler writes the response the request's X-Case asks for.
func framingHandler(writeErrs chan<- error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set(servedByField, servedBy(w))
		switch r.Header.Get("X-Case") {
		case "small":
			_, _ = io.WriteString(w, "hello")
		case "empty":
		case "large":
			_, _ = io.WriteString(w, strings.Repeat("L", 3*holdBack))
		case "flush":
			_, _ = io.WriteString(w, "a")
			http.NewResponseController(w).Flush()
			_, _ = io.WriteString(w, "b")
		case "trailers", "trailers after flush":
			h.Set("Trailer", "Server-Timing")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "a")
			if r.Header.Get("X-Case") == "trailers after flush" {
				http.NewResponseController(w).Flush()
			}
			_, _ = io.WriteString(w, "b")
			h.Set("Server-Timing", "total;dur=1.5")
			h.Set(http.TrailerPrefix+"X-Undeclared", "late")
		case "content-length":
			h.Set("Content-Length", "5")
			_, _ = io.WriteString(w, "hello")
			_, err := io.WriteString(w, "!")
			writeErrs <- err
		case "short content-length":
			h.Set("Content-Length", "10")
			_, _ = io.WriteString(w, "hello")
		case "no content":
			w.WriteHeader(http.StatusNoContent)
			_, err := io.WriteString(w, "body")
			writeErrs <- err
		case "line breaks":
			h.Set("X-Split", "a\r\nX-Injected: 1")
			h["X-Lf"] = []string{"b\nX-Injected: 2"}
			_, _ = io.WriteString(w, "sanitized")
		case "late fields":
			h.Set("X-Before", "1")
			w.WriteHeader(http.StatusCreated)
			h.Set("X-After", "1")
			h.Set(servedByField, "changed")
			_, _ = io.WriteString(w, "late")
		}
	}
}

// TestResponseFraming checks the lean path's responses on the wire: the
// framing of bodies of known, unknown and no length, and which fields go
// out.
func TestResponseFraming(t *testing.T) {
	writeErrs := make(chan error, 1)
	ts := startLean(t, newHTTP(framingHandler(writeErrs)))
	c := dialRaw(t, ts.addr)
	// exchange sends a hot request of case on c and returns its response;
	// another request on the connection then checks that the response's
	// framing left it usable.
	exchange := func(t *testing.T, name string, status int, body string) *http.Response {
		t.Helper()
		c.send(hotRequest("", "X-Case: "+name))
		resp := c.expect("POST", status, "lean", body)
		c.send(hotRequest("", "X-Case: small"))
		c.expect("POST", 200, "lean", "hello")
		return resp
	}
	t.Run("small body", func(t *testing.T) {
		resp := exchange(t, "small", 200, "hello")
		if resp.ContentLength != 5 || resp.TransferEncoding != nil {
			t.Errorf("Content-Length %d, Transfer-Encoding %q; want 5, none", resp.ContentLength, resp.TransferEncoding)
		}
		if resp.Header.Get("Date") == "" {
			t.Error("no Date")
		}
	})
	t.Run("empty body", func(t *testing.T) {
		resp := exchange(t, "empty", 200, "")
		if resp.Header.Get("Content-Length") != "0" {
			t.Errorf("Content-Length %q, want 0", resp.Header.Get("Content-Length"))
		}
	})
	t.Run("large body", func(t *testing.T) {
		resp := exchange(t, "large", 200, strings.Repeat("L", 3*holdBack))
		if resp.ContentLength != -1 || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
			t.Errorf("Content-Length %d, Transfer-Encoding %q; want chunked", resp.ContentLength, resp.TransferEncoding)
		}
	})
	t.Run("flush", func(t *testing.T) {
		resp := exchange(t, "flush", 200, "ab")
		if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
			t.Errorf("Transfer-Encoding %q, want chunked", resp.TransferEncoding)
		}
	})
	t.Run("content-length", func(t *testing.T) {
		resp := exchange(t, "content-length", 200, "hello")
		if resp.ContentLength != 5 || resp.TransferEncoding != nil {
			t.Errorf("Content-Length %d, Transfer-Encoding %q; want 5, none", resp.ContentLength, resp.TransferEncoding)
		}
		if err := receive(t, writeErrs, "write error"); !errors.Is(err, http.ErrContentLength) {
			t.Errorf("writing past the Content-Length: %v, want http.ErrContentLength", err)
		}
	})
	t.Run("no content", func(t *testing.T) {
		resp := exchange(t, "no content", http.StatusNoContent, "")
		if resp.Header.Get("Content-Length") != "" || resp.TransferEncoding != nil {
			t.Errorf("a 204 with Content-Length %q, Transfer-Encoding %q", resp.Header.Get("Content-Length"), resp.TransferEncoding)
		}
		if err := receive(t, writeErrs, "write error"); !errors.Is(err, http.ErrBodyNotAllowed) {
			t.Errorf("writing a 204's body: %v, want http.ErrBodyNotAllowed", err)
		}
	})
	t.Run("line breaks", func(t *testing.T) {
		resp := exchange(t, "line breaks", 200, "sanitized")
		if got := resp.Header.Get("X-Split"); got != "a  X-Injected: 1" {
			t.Errorf("X-Split is %q, want its line break turned into spaces", got)
		}
		if got := resp.Header.Get("X-Lf"); got != "b X-Injected: 2" {
			t.Errorf("X-Lf is %q, want its line break turned into a space", got)
		}
		if got := resp.Header.Values("X-Injected"); got != nil {
			t.Errorf("a handler's value injected X-Injected: %q", got)
		}
	})
	t.Run("late fields", func(t *testing.T) {
		resp := exchange(t, "late fields", http.StatusCreated, "late")
		if resp.Header.Get("X-Before") != "1" || resp.Header.Get("X-After") != "" {
			t.Errorf("X-Before %q, X-After %q; want the fields as at WriteHeader", resp.Header.Get("X-Before"), resp.Header.Get("X-After"))
		}
	})
	t.Run("short content-length", func(t *testing.T) {
		// The body ends before its length: the connection must close.
		c := dialRaw(t, ts.addr)
		c.send(hotRequest("", "X-Case: short content-length"))
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if body, err := io.ReadAll(resp.Body); err == nil {
			t.Errorf("read the body %q whole, want it cut short", body)
		}
	})
}

// TestWritingNothingAfterNoContentSucceeds checks that after a 204 or a
// 304, a Write of no bytes succeeds, as under net/http (a proxy relays the
// empty body of such a response), while one of some bytes still fails with
// http.ErrBodyNotAllowed.
func TestWritingNothingAfterNoContentSucceeds(t *testing.T) {
	type writeErrs struct{ empty, some error }
	errs := make(chan writeErrs, 1)
	ts := startLean(t, newHTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(servedByField, servedBy(w))
		status, _ := strconv.Atoi(r.Header.Get("X-Status"))
		w.WriteHeader(status)
		var e writeErrs
		_, e.empty = w.Write(nil)
		_, e.some = w.Write([]byte("body"))
		errs <- e
	})))
	c := dialRaw(t, ts.addr)
	for _, status := range []int{http.StatusNoContent, http.StatusNotModified} {
		c.send(hotRequest("", "X-Status: "+strconv.Itoa(status)))
		c.expect("POST", status, "lean", "")
		if e := receive(t, errs, "write errors"); e.empty != nil || !errors.Is(e.some, http.ErrBodyNotAllowed) {
			t.Errorf("after %d: writing nothing: %v, want nil; writing a body: %v, want http.ErrBodyNotAllowed",
				status, e.empty, e.some)
		}
	}
}

// TestTrailers checks, with net/http's client, that the fields a response
// declares in Trailer, and those named with http.TrailerPrefix, arrive as
// trailers, whether the handler flushed or not.
func TestTrailers(t *testing.T) {
	ts := startLean(t, newHTTP(framingHandler(nil)))
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	for _, name := range []string{"trailers after flush", "trailers"} {
		t.Run(name, func(t *testing.T) {
			req, err := http.NewRequest("POST", "http://"+ts.addr+hotPath, strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Case", name)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil || string(body) != "ab" || resp.Header.Get(servedByField) != "lean" {
				t.Fatalf("body %q, %v, served by %q; want ab from lean", body, err, resp.Header.Get(servedByField))
			}
			if got := resp.Trailer.Get("Server-Timing"); got != "total;dur=1.5" {
				t.Errorf("the Server-Timing trailer is %q, want total;dur=1.5 (trailers %q)", got, resp.Trailer)
			}
			if got := resp.Trailer.Get("X-Undeclared"); got != "late" {
				t.Errorf("the X-Undeclared trailer is %q, want late (trailers %q)", got, resp.Trailer)
			}
			if resp.Header.Get("Server-Timing") != "" {
				t.Error("the Server-Timing trailer is in the head")
			}
		})
	}
}
