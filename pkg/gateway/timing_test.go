package gateway

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/internal/budget"
)

func TestServerTimingFormatsMillisecondsToTheMicrosecond(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{412*time.Microsecond + 900*time.Nanosecond, "gateway;dur=0.412"},
		{1500 * time.Millisecond, "gateway;dur=1500.000"},
		{0, "gateway;dur=0.000"},
	} {
		if got := string(appendTiming(nil, ServerTimingGateway, tc.d)); got != tc.want {
			t.Errorf("appendTiming(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestResponsesAddTheGatewaysOwnTimeToThePodsServerTiming(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	f.engine("a").setAnswer(func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set(HeaderServerTiming, "engine;dur=5")
		defaultAnswer(w, r, body)
	})
	start := time.Now()
	resp, body := post(t, f.url+"/v1/completions", tokenPrompt([]uint32{1, 2, 3}), nil)
	total := time.Since(start)
	timings := resp.Header.Values(HeaderServerTiming)
	if resp.StatusCode != http.StatusOK || len(timings) != 2 || timings[0] != "engine;dur=5" {
		t.Fatalf("got %d with Server-Timing %q: %s; want 200 with the engine's metric, then the gateway's", resp.StatusCode, timings, body)
	}
	gw, _, _ := strings.Cut(timings[1], ",")
	ms, ok := strings.CutPrefix(gw, "gateway;dur=")
	dur, err := strconv.ParseFloat(ms, 64)
	if !ok || err != nil || dur <= 0 || dur > float64(total.Microseconds())/1000 {
		t.Errorf("gateway metric %q: want a positive duration within the request's %v", timings[1], total)
	}
	if n := f.metric("kvgate_gateway_overhead_seconds_count"); n != 1 {
		t.Errorf("overhead observed %v times, want once", n)
	}
}

// slotListener listens on loopback through a timedListener holding at most
// n connections, its metrics registered in reg.
func slotListener(t *testing.T, n int) (*timedListener, *prometheus.Registry) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, budget.New(0))
	if err != nil {
		t.Fatal(err)
	}
	l := newTimedListener(ln, time.Minute, n, m)
	t.Cleanup(func() { l.Close() })
	return l, reg
}

// TestAHijackedConnectionGivesBackItsSlotWhenClosed: net/http hands a
// hijacked connection to its handler, whose Close gives the slot back.
func TestAHijackedConnectionGivesBackItsSlotWhenClosed(t *testing.T) {
	l, reg := slotListener(t, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		_ = rw.Flush()
		_ = c.Close()
	}), ReadHeaderTimeout: readHeaderTimeout}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	hijacked := &http.Client{Timeout: testsupport.WaitTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 3 {
		// With one slot, each request after the first needs the slot the
		// hijacked connection before it gave back.
		resp, err := hijacked.Get("http://" + l.Addr().String())
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
	}
	testsupport.EventuallyWhy(t, "the hijacked connections to be closed", func() (string, bool) {
		n := testsupport.MetricValue(t, reg, "kvgate_gateway_client_connections", nil)
		return fmt.Sprint(n), n == 0
	})
}
