package leanhttp

import (
	"fmt"
	"io"
	"math/rand/v2"
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
		if r.Method != http.MethodPost || r.URL.Path != hotPath {
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
	c := dialRaw(t, ts.addr)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		// Around watchAfter, and sometimes not at all.
		sleep := time.Duration(0)
		if i%3 != 0 {
			sleep = watchAfter - time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Millisecond)))
		}
		body := fmt.Sprintf(`{"n":%d}`, i)
		_ = c.SetDeadline(time.Now().Add(waitFor))
		c.send(hotRequest(body, "Sleep: "+sleep.String()))
		c.expect("POST", 200, "", body)
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
	kept := make(chan bool, 1) // whether the watch kept the next request's first byte
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
		ok := eventually(func() bool {
			c.watchMu.Lock()
			defer c.watchMu.Unlock()
			return c.stashed
		})
		if ok {
			c.watch() // the second run, which must return without reading
		}
		kept <- ok
	})
	ts := startLean(t, newHTTP(handler))
	c := dialRaw(t, ts.addr)
	c.send(hotRequest("one"))
	c.expect("POST", 200, "", "one")
	c.send(hotRequest("two"))
	if !receive(t, kept, "the first request's end") {
		t.Fatal("the watch did not keep the next request's first byte")
	}
	c.expect("POST", 200, "", "two")
}
