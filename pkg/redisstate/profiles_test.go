package redisstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

func TestProfilesRefreshFromRedis(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	ctx := context.Background()
	set := func(key string, value any) {
		t.Helper()
		if err := rc.Set(ctx, key, value, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	profile := func(created, cost float64) string {
		var m map[string]any
		if err := json.Unmarshal(profileJSON(t), &m); err != nil {
			t.Fatal(err)
		}
		m["created"], m["cost"] = created, cost
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	llama := cache.ModelGPUProfileKey("llama", "llama-a100")
	set(llama, profile(100, 1))
	set(cache.ModelGPUProfileKey("broken", "x"), "not a profile")
	set("aibrix:unrelated", "x")

	reg := prometheus.NewRegistry()
	s, err := cache.NewProfiles(endpoint.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	loader, err := NewProfileLoader(rc, s, newTestMetrics(t, reg), ProfileLoaderConfig{RefreshInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, loader)
	local := cache.ModelGPUProfileKey("local", "dep")
	s.UpdateModelProfile(local, &cache.ModelGPUProfile{Cost: 9}, true)

	cost := func() (float64, error) {
		p, err := s.GetModelProfileByDeploymentName("llama-a100", "llama")
		if err != nil {
			return 0, err
		}
		return p.Cost, nil
	}
	testsupport.Eventually(t, "the llama profile to load", func() bool {
		c, err := cost()
		return err == nil && c == 1
	})
	if n := testsupport.MetricValue(t, reg, "kvgate_cache_gpu_profile_rejects_total", nil); n < 1 {
		t.Fatalf("rejected profiles = %v, want at least 1", n)
	}
	// waitRefresh returns once a refresh has started after it was called.
	marker := 0
	waitRefresh := func() {
		t.Helper()
		marker++
		key := cache.ModelGPUProfileKey("marker", ftoa(float64(marker)))
		set(key, profile(1, 1))
		testsupport.Eventually(t, "the marker profile to load", func() bool {
			_, err := s.GetModelProfileByDeploymentName(ftoa(float64(marker)), "marker")
			return err == nil
		})
	}

	set(llama, profile(200, 2)) // newer
	testsupport.Eventually(t, "the newer profile to load", func() bool { c, _ := cost(); return c == 2 })
	set(llama, profile(150, 3)) // older than the one held
	waitRefresh()
	set(llama, "{corrupt") // a bad write keeps the last good profile
	waitRefresh()
	if c, err := cost(); err != nil || c != 2 {
		t.Fatalf("cost = %v, %v; want 2: neither an older nor a corrupt profile replaces it", c, err)
	}
	if err := rc.Del(ctx, llama).Err(); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the profile deleted from Redis to be dropped", func() bool {
		_, err := cost()
		return errors.Is(err, cache.ErrMissingProfile)
	})
	if p, err := s.GetModelProfileByDeploymentName("dep", "local"); err != nil || p.Cost != 9 {
		t.Fatalf("profile set locally was dropped by a refresh: %v", err)
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// profileJSON is a GPU profile in the optimizer's format.
func profileJSON(t testing.TB) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "profiles", "llama-a100.json"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// boundedLoader returns profiles loaded from rc by a loader configured by
// cfg, the loader, whose refresh tests call themselves, and the registry
// of its metrics.
func boundedLoader(t *testing.T, rc *redis.Client, cfg ProfileLoaderConfig) (*cache.Profiles, *ProfileLoader, *prometheus.Registry) {
	t.Helper()
	s, err := cache.NewProfiles(endpoint.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	loader, err := NewProfileLoader(rc, s, newTestMetrics(t, reg), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, loader, reg
}

const profileRejectsMetric = "kvgate_cache_gpu_profile_rejects_total"

func TestProfileLoaderLoadsAtMostMaxProfiles(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	ctx := context.Background()
	for i := range 5 {
		if err := rc.Set(ctx, cache.ModelGPUProfileKey("m", ftoa(float64(i))), profileJSON(t), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s, loader, reg := boundedLoader(t, rc, ProfileLoaderConfig{MaxProfiles: 3})
	must(t, loader.refresh(ctx))
	if s.Len() != 3 {
		t.Fatalf("%d profiles loaded, want 3", s.Len())
	}
	if n := byReason(t, reg, profileRejectsMetric, profileRejectLimit); n != 2 {
		t.Fatalf("profiles skipped beyond the bound = %v, want 2", n)
	}
	must(t, loader.refresh(ctx))
	if s.Len() != 3 {
		t.Fatalf("%d profiles loaded after another refresh, want 3", s.Len())
	}
}

func TestProfileLoaderLoadsTheServedProfilesBeforeTheOthers(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	ctx := context.Background()
	for i := range 50 {
		if err := rc.Set(ctx, cache.ModelGPUProfileKey("m", ftoa(float64(i))), profileJSON(t), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	served := cache.ModelGPUProfileKey("llama", "served")
	if err := rc.Set(ctx, served, profileJSON(t), 0).Err(); err != nil {
		t.Fatal(err)
	}
	s, loader, reg := boundedLoader(t, rc, ProfileLoaderConfig{MaxProfiles: 3, Served: func() []string {
		// A served key without a profile in Redis takes no room; a key
		// of another form is not read.
		return []string{cache.ModelGPUProfileKey("llama", "no-profile"), served, served, "aibrix:unrelated"}
	}})
	for refresh := range 2 {
		must(t, loader.refresh(ctx))
		if s.Lookup("llama", "served") == nil || s.Len() != 3 {
			t.Fatalf("refresh %d: the served profile loaded: %v, %d profiles held; want it and 2 others",
				refresh, s.Lookup("llama", "served") != nil, s.Len())
		}
		if n := byReason(t, reg, profileRejectsMetric, profileRejectLimit); n != float64(48*(refresh+1)) {
			t.Fatalf("refresh %d: profiles skipped beyond the bound = %v, want %d", refresh, n, 48*(refresh+1))
		}
	}
}

func TestProfileLoaderSkipsValuesBeyondTheBound(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	ctx := context.Background()
	good := profileJSON(t)
	s, loader, reg := boundedLoader(t, rc, ProfileLoaderConfig{MaxProfileBytes: len(good)})
	// A key of the profiles' pattern that holds no string.
	if err := rc.HSet(ctx, cache.ModelGPUProfileKey("hash", "x"), "gpu", "x").Err(); err != nil {
		t.Fatal(err)
	}
	// costAfter sets llama's profile to value, refreshes, and returns the
	// cost of the llama profile loaded.
	costAfter := func(value []byte) float64 {
		t.Helper()
		if err := rc.Set(ctx, cache.ModelGPUProfileKey("llama", "llama-a100"), value, 0).Err(); err != nil {
			t.Fatal(err)
		}
		must(t, loader.refresh(ctx))
		p := s.Lookup("llama", "llama-a100")
		if p == nil {
			t.Fatal("no llama profile loaded")
		}
		return p.Cost
	}
	if c := costAfter(good); c != 1.8 {
		t.Fatalf("cost %v, want 1.8: the profile within the bound", c)
	}
	if n := byReason(t, reg, profileRejectsMetric, profileRejectDecode); n != 1 {
		t.Fatalf("profiles skipped as undecodable = %v, want 1: the hash", n)
	}

	// A newer profile one byte too long is skipped, and the one loaded
	// before kept; within the bound again, it loads.
	var m map[string]any
	if err := json.Unmarshal(good, &m); err != nil {
		t.Fatal(err)
	}
	m["created"], m["cost"] = 2e9, 9
	newer, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if c := costAfter(append(newer, bytes.Repeat([]byte{' '}, len(good)+1-len(newer))...)); c != 1.8 {
		t.Fatalf("cost %v, want 1.8: a profile beyond the bound replaced the one loaded", c)
	}
	if n := byReason(t, reg, profileRejectsMetric, profileRejectSize); n != 1 {
		t.Fatalf("profiles skipped for their size = %v, want 1", n)
	}
	if c := costAfter(newer); c != 9 {
		t.Fatalf("cost %v, want 9: the newer profile within the bound", c)
	}
}
