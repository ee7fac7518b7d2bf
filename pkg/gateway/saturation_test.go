package gateway

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/config"
)

func TestSaturationRule(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c := DefaultSaturation
	both := cache.HasWaiting | cache.HasKVCacheUsage
	pod := func(age time.Duration, waiting, kv float64) cache.PodSnapshot {
		return cache.PodSnapshot{Scrape: cache.ScrapeFresh,
			Metrics: cache.PodMetrics{At: now.Add(-age), Waiting: waiting, KVCacheUsage: kv, Measured: both}}
	}
	idle := pod(10*time.Millisecond, 0, 0.1)
	tests := []struct {
		name      string
		snaps     []cache.PodSnapshot
		saturated bool
	}{
		{"no endpoints", nil, true},
		{"an idle pod", []cache.PodSnapshot{idle}, false},
		{"queue at the threshold", []cache.PodSnapshot{pod(0, 5, 0.1)}, false},
		{"queue above the threshold", []cache.PodSnapshot{pod(0, 6, 0.1)}, true},
		{"KV cache at the threshold", []cache.PodSnapshot{pod(0, 0, 0.8)}, false},
		{"KV cache above the threshold", []cache.PodSnapshot{pod(0, 0, 0.81)}, true},
		{"metrics as old as allowed", []cache.PodSnapshot{pod(200*time.Millisecond, 0, 0)}, false},
		{"stale metrics", []cache.PodSnapshot{pod(201*time.Millisecond, 0, 0)}, true},
		{"the last scrape failed", []cache.PodSnapshot{func() cache.PodSnapshot { s := idle; s.Scrape = cache.ScrapeStale; return s }()}, true},
		{"never scraped", []cache.PodSnapshot{{Scrape: cache.ScrapeNone}}, true},
		{"ejected", []cache.PodSnapshot{func() cache.PodSnapshot { s := idle; s.Ejected = true; return s }()}, true},
		{"unexported metrics do not limit", []cache.PodSnapshot{{Scrape: cache.ScrapeFresh,
			Metrics: cache.PodMetrics{At: now, Waiting: 0, KVCacheUsage: 0}}}, false},
		{"one pod of several has capacity", []cache.PodSnapshot{pod(0, 9, 0.1), pod(0, 0, 0.95), idle}, false},
		{"every pod lacks capacity, each for its reason", []cache.PodSnapshot{pod(0, 9, 0.1), pod(0, 0, 0.95),
			pod(time.Second, 0, 0)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.saturated(tt.snaps, now); got != tt.saturated {
				t.Errorf("saturated = %v; want %v", got, tt.saturated)
			}
		})
	}
}

func TestSaturationSettingsAreValidated(t *testing.T) {
	base := map[string]string{
		config.PodDiscovery.Name:        "static",
		config.StaticEndpointsFile.Name: writeEndpoints(t, "endpoints: []\n"),
	}
	tests := []struct {
		name string
		env  map[string]string
		want SaturationConfig
		bad  bool
	}{
		{"defaults", nil, DefaultSaturation, false},
		{"set", map[string]string{config.SaturationQueueDepth.Name: "0", config.SaturationKVCacheUtilization.Name: "1",
			config.SaturationMetricsStaleness.Name: "500"},
			SaturationConfig{QueueDepth: 0, KVCacheUtilization: 1, MetricsStaleness: 500 * time.Millisecond}, false},
		{"negative queue depth", map[string]string{config.SaturationQueueDepth.Name: "-1"}, SaturationConfig{}, true},
		{"KV above 1", map[string]string{config.SaturationKVCacheUtilization.Name: "1.5"}, SaturationConfig{}, true},
		{"KV negative", map[string]string{config.SaturationKVCacheUtilization.Name: "-0.1"}, SaturationConfig{}, true},
		{"staleness within the scrape interval", map[string]string{config.SaturationMetricsStaleness.Name: "50"},
			SaturationConfig{}, true},
		{"staleness zero", map[string]string{config.SaturationMetricsStaleness.Name: "0"}, SaturationConfig{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tt.env {
				env[k] = v
			}
			e := config.NewEnv(func(name string) (string, bool) { v, ok := env[name]; return v, ok })
			cfg := LoadConfig(e)
			if err := e.Err(); (err != nil) != tt.bad {
				t.Fatalf("LoadConfig errors: %v; want errors %v", err, tt.bad)
			}
			if !tt.bad && cfg.Saturation != tt.want {
				t.Errorf("Saturation = %+v; want %+v", cfg.Saturation, tt.want)
			}
		})
	}
	if err := (SaturationConfig{QueueDepth: 1, KVCacheUtilization: 0.5}).validate(); err == nil {
		t.Error("a zero staleness passed validation")
	}
}
