package redisstate

import (
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
