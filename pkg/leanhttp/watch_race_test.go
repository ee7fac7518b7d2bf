package leanhttp

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
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
