package slo

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
	"github.com/kvgate/kvgate/pkg/redisstate"
	"github.com/kvgate/kvgate/pkg/types"
)

func TestObjectivesComeFromTheGPUProfilesInRedisWhereTheySetThem(t *testing.T) {
	rc := testredis.Start(t).NewClient(t)
	ctx := context.Background()
	for dep, slos := range map[string]cache.ModelSLOs{
		"llama-a100": {TTFT: 2.5, TPOT: 0.05},
		"llama-h100": {TTFT: 1.5},
	} {
		b, err := json.Marshal(cache.ModelGPUProfile{Deployment: dep, Indexes: [][]float64{{1}, {1}},
			Tputs: [][]float64{{1}}, E2E: [][]float64{{1}}, Created: 1, SLOs: slos})
		if err != nil {
			t.Fatal(err)
		}
		if err := rc.Set(ctx, cache.ModelGPUProfileKey("llama", dep), b, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	profiles, err := cache.NewProfiles(endpoint.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := redisstate.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	loader, err := redisstate.NewProfileLoader(rc, profiles, m, redisstate.ProfileLoaderConfig{RefreshInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- loader.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	testsupport.Eventually(t, "both profiles loaded", func() bool { return profiles.Len() == 2 })

	cfg := Config{
		Default: types.SLO{TTFT: 5 * time.Second, TTFTPerPromptToken: time.Millisecond, E2E: time.Minute},
		Models:  map[string]types.SLO{"qwen": {TPOT: 80 * time.Millisecond}},
	}
	o := NewObjectives(cfg, profiles)
	tests := []struct {
		model       string
		deployments []string
		want        types.SLO
		source      Source
	}{
		// The strictest profile TTFT, the profile's TPOT, the default E2E.
		{"llama", []string{"llama-a100", "llama-h100"}, types.SLO{TTFT: 1500 * time.Millisecond, TPOT: 50 * time.Millisecond, E2E: time.Minute}, SourceProfile},
		{"llama", []string{"llama-a100"}, types.SLO{TTFT: 2500 * time.Millisecond, TPOT: 50 * time.Millisecond, E2E: time.Minute}, SourceProfile},
		{"llama", []string{"other"}, cfg.Default, SourceDefault},
		{"qwen", []string{"llama-a100"}, types.SLO{TPOT: 80 * time.Millisecond}, SourceModel},
	}
	for _, tt := range tests {
		got, src := o.For(tt.model, tt.deployments)
		if got != tt.want || src != tt.source {
			t.Errorf("For(%s, %v) = %v from %s, want %v from %s", tt.model, tt.deployments, got, src, tt.want, tt.source)
		}
	}
}

func TestParseModelsReadsPerModelObjectives(t *testing.T) {
	got, err := ParseModels(" llama = ttft:2s, tpot:50ms ; qwen=e2e:30s;none-model=none")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]types.SLO{
		"llama":      {TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond},
		"qwen":       {E2E: 30 * time.Second},
		"none-model": {},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for m, s := range want {
		if got[m] != s {
			t.Errorf("%s: %v, want %v", m, got[m], s)
		}
	}
	for _, bad := range []string{"llama", "=ttft:1s", "a=ttft:1s;a=tpot:1s", "a=ttft:-1s", "a=ttft:1s,ttft:2s", "a=speed:1s", "a=ttft:fast"} {
		if _, err := ParseModels(bad); err == nil {
			t.Errorf("ParseModels(%q) succeeded", bad)
		}
	}
}
