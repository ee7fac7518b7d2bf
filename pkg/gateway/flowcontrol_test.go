package gateway

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/inflight"
)

func TestFlowControlSettingIsReadAndValidated(t *testing.T) {
	tests := []struct {
		name  string
		value string // "" leaves it unset
		want  bool
		bad   bool
	}{
		{"off by default", "", false, false},
		{"on", "true", true, false},
		{"off", "false", false, false},
		{"not a boolean", "sometimes", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{
				config.PodDiscovery.Name:        "static",
				config.StaticEndpointsFile.Name: writeEndpoints(t, "endpoints: []\n"),
			}
			if tt.value != "" {
				env[config.FlowControl.Name] = tt.value
			}
			e := config.NewEnv(func(name string) (string, bool) { v, ok := env[name]; return v, ok })
			cfg := LoadConfig(e)
			if err := e.Err(); (err != nil) != tt.bad {
				t.Fatalf("LoadConfig errors: %v; want errors %v", err, tt.bad)
			}
			if !tt.bad && cfg.FlowControl != tt.want {
				t.Errorf("FlowControl = %v; want %v", cfg.FlowControl, tt.want)
			}
		})
	}
}

func TestFlowControlCountsTheAttemptsSentSinceTheScrapeAsWaiting(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := testsupport.NewClock(t0)
	l, err := inflight.New(inflight.Config{TTL: time.Minute, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultSaturation // at most 5 requests waiting
	load := inflight.NewPodLoad("ns/a")
	send := func() *inflight.Handle {
		return l.Admit("r", "llama").Route(inflight.Route{Pod: load, UncachedTokens: 100, PrefillSeconds: 0.01})
	}
	// An attempt opened before the scrape, which counted it.
	before := send()
	clock.Advance(10 * time.Millisecond)
	scrapedAt := clock.Now()
	pod := func(measured cache.MetricBits, waiting float64) *cache.PodSnapshot {
		return &cache.PodSnapshot{Scrape: cache.ScrapeFresh, Load: load,
			Metrics: cache.PodMetrics{At: scrapedAt, Waiting: waiting, Measured: measured}}
	}
	if !c.admits(pod(cache.HasWaiting, 4), clock.Now()) {
		t.Fatal("4 waiting and nothing sent since the scrape: no capacity, want some")
	}
	clock.Advance(10 * time.Millisecond)
	sent := send()
	if !c.admits(pod(cache.HasWaiting, 4), clock.Now()) {
		t.Fatal("4 waiting and 1 sent since the scrape: no capacity, want some (5 is the most)")
	}
	send()
	if c.admits(pod(cache.HasWaiting, 4), clock.Now()) {
		t.Fatal("4 waiting and 2 sent since the scrape: capacity, want none")
	}
	if !c.hasCapacity(pod(cache.HasWaiting, 4), clock.Now()) {
		t.Fatal("shedding counts the attempts sent since the scrape, want the scrape alone")
	}
	if !c.admits(pod(cache.HasKVCacheUsage, 0), clock.Now()) {
		t.Fatal("an engine exporting no waiting requests is limited by the attempts sent to it")
	}
	// A first token ends the prefills of the attempts opened before it:
	// those run in the engine rather than wait.
	sent.FirstToken()
	if !c.admits(pod(cache.HasWaiting, 4), clock.Now()) {
		t.Fatal("4 waiting and 1 of the 2 sent since the scrape past its first token: no capacity, want some")
	}
	if c.admits(pod(cache.HasWaiting, 6), clock.Now()) {
		t.Fatal("6 waiting: capacity, want none")
	}
	before.Close(inflight.Done, "")
}
