package gateway

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
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
