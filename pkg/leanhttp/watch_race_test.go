package leanhttp

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// TestWatchNeverReadsTheNextRequest serves requests that end around the
// moment the watch starts, one after the other on one connection, so that
// the watch's timer fires just as requests end. A watch read left running
// into the next request would take that request's first byte, and net/http
// or the parser would see a request line cut short: every request must be
// answered whole and in order.
func TestWatchNeverReadsTheNextRequest(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/completions" {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(r.Body)
		if d, _ := time.ParseDuration(r.Header.Get("Sleep")); d > 0 {
			time.Sleep(d)
		}
		_, _ = w.Write(body)
	})
	ts := startLean(t, newHTTP(handler))
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	br := bufio.NewReader(nc)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		// Around watchAfter, and sometimes not at all.
		sleep := time.Duration(0)
		if i%3 != 0 {
			sleep = watchAfter - time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Millisecond)))
		}
		body := fmt.Sprintf(`{"n":%d}`, i)
		req := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nSleep: %v\r\nContent-Length: %d\r\n\r\n%s",
			sleep, len(body), body)
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(nc, req); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || string(got) != body {
			t.Fatalf("request %d: %d %q %v, want 200 %q", i, resp.StatusCode, got, err, body)
		}
	}
}

// TestAWatchReadsOnceARequest: a client that sends its next request as
// soon as it has the response, while the handler still runs, has that
// request's first byte kept by the watch. A second run of the watch for the
// same request (a run of the timer's function left over from an earlier
// request) must not read again: it would keep the second byte in the
// first's place, and the next request would lose its first byte.
func TestAWatchReadsOnceARequest(t *testing.T) {
	first := true
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "a request line cut short: "+r.Method, http.StatusMethodNotAllowed)
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
		if !first {
			return
		}
		first = false
		_ = http.NewResponseController(w).Flush()
		c := w.(*response).c
		waitUntil(t, "the watch to keep the next request's first byte", func() bool {
			c.watchMu.Lock()
			defer c.watchMu.Unlock()
			return c.stashed
		})
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.watch()
		}()
		receive(t, done, "the second run of the watch")
	})
	ts := startLean(t, newHTTP(handler))
	c := dialRaw(t, ts.addr)
	c.send(hotRequest("one"))
	c.expect("POST", 200, "", "one")
	c.send(hotRequest("two"))
	c.expect("POST", 200, "", "two")
}
