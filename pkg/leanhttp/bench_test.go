package leanhttp

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkServe compares, in one run, a hot request served by leanhttp
// with the same request and handler under a plain net/http server. The
// client is the same for both and costs little: one keep-alive loopback
// connection on which it writes the request's bytes and reads the response
// with http.ReadResponse, one request at a time.
func BenchmarkServe(b *testing.B) {
	const body = `{"model":"m","prompt":"Say hello","max_tokens":16}`
	request := []byte("POST /v1/completions HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench/1\r\n" +
		"Content-Type: application/json\r\nAccept: */*\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	reply := []byte(`{"id":"cmpl-1","object":"text_completion","choices":[{"text":"Hello!","index":0}]}`)
	var lean atomic.Bool // the last request was served on the lean path
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, isLean := w.(*response)
		lean.Store(isLean)
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(reply)
	})
	for _, bc := range []struct {
		name string
		lean bool
		// serve serves srv's handler on ln, and returns what stops it.
		serve func(srv *http.Server, ln net.Listener) (stop func())
	}{
		{"leanhttp", true, func(srv *http.Server, ln net.Listener) func() {
			s := &Server{HTTP: srv, Hot: []string{"POST /v1/completions"}}
			done := make(chan struct{})
			go func() { defer close(done); _ = s.Serve(ln) }()
			return func() { _ = s.Close(); <-done }
		}},
		{"nethttp", false, func(srv *http.Server, ln net.Listener) func() {
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Serve(ln) }()
			return func() { _ = srv.Close(); <-done }
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := &http.Server{Handler: handler, ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute}
			defer bc.serve(srv, ln)()
			nc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			br := bufio.NewReader(nc)
			do := func() {
				if _, err := nc.Write(request); err != nil {
					b.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d, body: %v", resp.StatusCode, err)
				}
				_ = resp.Body.Close()
			}
			do()
			if lean.Load() != bc.lean {
				b.Fatalf("served on the lean path: %v, want %v", lean.Load(), bc.lean)
			}
			b.ReportAllocs()
			for b.Loop() {
				do()
			}
		})
	}
}
