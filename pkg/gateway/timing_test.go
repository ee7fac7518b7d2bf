package gateway

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
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
