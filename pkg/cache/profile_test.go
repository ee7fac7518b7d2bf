package cache

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

func profileJSON(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "profiles", "llama-a100.json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loadTestProfile(t testing.TB) *ModelGPUProfile {
	t.Helper()
	var p ModelGPUProfile
	if err := p.Unmarshal(profileJSON(t)); err != nil {
		t.Fatal(err)
	}
	return &p
}

func TestUnmarshalReadsTheOptimizerFormat(t *testing.T) {
	p := loadTestProfile(t)
	if p.Deployment != "llama-a100" || p.Cost != 1.8 || p.Created != 1730000000.5 || p.SLOs.Percentile != 99 || p.SLOs.TTFT != 0.5 {
		t.Fatalf("decoded %+v", p)
	}
	if !reflect.DeepEqual(p.Indexes[0], []float64{4, 16, 64, 256}) {
		t.Fatalf("indexes kept as given: %v", p.Indexes)
	}
}

// ascending returns the JSON values 1 to n, comma-separated.
func ascending(n int) string {
	v := make([]string, n)
	for i := range v {
		v[i] = strconv.Itoa(i + 1)
	}
	return strings.Join(v, ",")
}

func TestUnmarshalTakesProfilesUpToTheBounds(t *testing.T) {
	values := ascending(MaxProfileIndexValues)
	table := `[` + strings.Repeat(`[`+values+`],`, MaxProfileIndexValues-1) + `[` + values + `]]`
	var p ModelGPUProfile
	if err := p.Unmarshal([]byte(`{"indexes": [[` + values + `], [` + values + `]], "tputs": ` + table +
		`, "e2e": ` + table + `, "ttft": ` + table + `, "tpot": ` + table + `}`)); err != nil {
		t.Fatal(err)
	}
	if pt, err := p.Point(64, 64); err != nil || pt.TPOTSeconds != 64 {
		t.Fatalf("point at the last signature: %+v, %v", pt, err)
	}
}

func TestUnmarshalRejectsUnusableOrOversizedTables(t *testing.T) {
	tests := map[string]string{
		"not json":       `{"indexes": [`,
		"empty dim":      `{"indexes": [[], [1, 2]]}`,
		"not ascending":  `{"indexes": [[1, 4, 2]]}`,
		"repeated value": `{"indexes": [[1, 2, 2]]}`,
		"zero":           `{"indexes": [[0, 2]]}`,
		"three dims":     `{"indexes": [[1], [1], [1]]}`,
		"long dim":       `{"indexes": [[` + ascending(MaxProfileIndexValues+1) + `]]}`,
		"tall table":     `{"tputs": [` + strings.Repeat(`[1],`, MaxProfileIndexValues) + `[1]]}`,
		"wide table":     `{"e2e": [[1], [` + ascending(MaxProfileIndexValues+1) + `]]}`,
	}
	for name, data := range tests {
		t.Run(name, func(t *testing.T) {
			p := ModelGPUProfile{Cost: 7}
			if err := p.Unmarshal([]byte(data)); err == nil {
				t.Fatal("accepted")
			}
			if p.Cost != 7 {
				t.Fatal("a failed Unmarshal changed the profile")
			}
		})
	}
}

func TestGetSignature(t *testing.T) {
	p := loadTestProfile(t)
	tests := []struct {
		name     string
		features []float64
		want     []int
		wantErr  string
	}{
		{"exact values", []float64{16, 128}, []int{1, 2}, ""},
		{"below the range", []float64{1, 0}, []int{0, 0}, ""},
		{"above the range", []float64{10000, 1e6}, []int{3, 4}, ""},
		// Between 16 (2^4) and 64 (2^6) the boundary is 2^5 on the log scale.
		{"just below the log midpoint", []float64{31, 8}, []int{1, 0}, ""},
		{"at the log midpoint", []float64{32, 8}, []int{2, 0}, ""},
		{"one feature", []float64{200}, []int{3}, ""},
		{"no features", nil, nil, "no features"},
		{"negative", []float64{-1, 8}, nil, "non-negative"},
		{"too many", []float64{1, 2, 3}, nil, "3 features for 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := p.GetSignature(tt.features...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("GetSignature(%v) = %v, %v; want %v", tt.features, got, err, tt.want)
			}
		})
	}
}

func TestProfileTables(t *testing.T) {
	p := loadTestProfile(t)
	if v, err := p.ThroughputRPS(1, 2); err != nil || v != 6.5 {
		t.Fatalf("ThroughputRPS(1,2) = %v, %v", v, err)
	}
	if v, err := p.LatencySeconds(2, 4); err != nil || v != 3.6 {
		t.Fatalf("LatencySeconds(2,4) = %v, %v", v, err)
	}
	if v, err := p.TTFTSeconds(0, 0); err != nil || v != 0.02 {
		t.Fatalf("TTFTSeconds(0,0) = %v, %v", v, err)
	}
	if v, err := p.TPOTSeconds(3, 4); err != nil || v != 0.031 {
		t.Fatalf("TPOTSeconds(3,4) = %v, %v", v, err)
	}
	for _, sig := range [][]int{{4, 0}, {0, 5}, {-1, 0}, {1}} {
		if _, err := p.ThroughputRPS(sig...); err == nil {
			t.Errorf("ThroughputRPS%v accepted", sig)
		}
	}
	empty := &ModelGPUProfile{}
	for _, c := range []struct {
		get  func(...int) (float64, error)
		want error
	}{
		{empty.ThroughputRPS, ErrProfileNoThroughput}, {empty.LatencySeconds, ErrProfileNoE2E},
		{empty.TTFTSeconds, ErrProfileNoTTFT}, {empty.TPOTSeconds, ErrProfileNoTPOT},
	} {
		if _, err := c.get(0, 0); !errors.Is(err, c.want) {
			t.Errorf("error = %v, want %v", err, c.want)
		}
	}
}

// newTestProfiles returns empty profiles whose deployment label is
// deploymentLabel ("" for the default).
func newTestProfiles(t testing.TB, deploymentLabel string) *Profiles {
	t.Helper()
	p, err := NewProfiles(endpoint.Options{DeploymentLabel: deploymentLabel}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestUpdateModelProfileKeepsTheNewest(t *testing.T) {
	s := newTestProfiles(t, "")
	key := ModelGPUProfileKey("llama", "llama-a100")
	s.UpdateModelProfile(key, &ModelGPUProfile{Created: 10, Cost: 1}, false)
	s.UpdateModelProfile(key, &ModelGPUProfile{Created: 5, Cost: 2}, false)
	if p, _ := s.GetModelProfileByDeploymentName("llama-a100", "llama"); p.Cost != 1 {
		t.Fatalf("an older profile replaced a newer one")
	}
	s.UpdateModelProfile(key, &ModelGPUProfile{Created: 5, Cost: 3}, true)
	if p, _ := s.GetModelProfileByDeploymentName("llama-a100", "llama"); p.Cost != 3 {
		t.Fatalf("a forced update was ignored")
	}
	s.UpdateModelProfile(key, nil, false)
	_, err := s.GetModelProfileByDeploymentName("llama-a100", "llama")
	var mp *MissingProfileError
	if !errors.As(err, &mp) || mp.ProfileKey != "aibrix:profile_llama_llama-a100" || !errors.Is(err, ErrMissingProfile) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestGetModelProfileByPodUsesTheDeploymentName(t *testing.T) {
	s := newTestProfiles(t, "gpu-deployment")
	s.UpdateModelProfile(ModelGPUProfileKey("llama", "llama-a100"), loadTestProfile(t), false)
	if _, err := s.GetModelProfileByPod(testPod("ns", "p", "llama", "10.0.0.1", withLabel("gpu-deployment", "llama-a100")), "llama"); err != nil {
		t.Fatalf("by label: %v", err)
	}
	if _, err := s.GetModelProfileByPod(testPod("ns", "p", "llama", "10.0.0.1", withLabel("gpu-deployment", "llama-h100")), "llama"); !errors.Is(err, ErrMissingProfile) {
		t.Fatalf("other deployment: %v", err)
	}
	if _, err := s.GetModelProfileByPod(testPod("ns", "p", "llama", "10.0.0.1"), "llama"); !errors.Is(err, ErrMissingProfile) {
		t.Fatalf("no deployment name: %v", err)
	}
}
