package zmqwire

import "testing"

func TestOffsetEndpointPort(t *testing.T) {
	t.Parallel()
	tests := []struct {
		endpoint string
		rank     int
		want     string // "" when an error is expected
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 3, "tcp://*:5560"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"inproc://cache", 2, "inproc://cache_dp2"},
		{"ipc:///tmp/kv", 0, "ipc:///tmp/kv"},
		{"ipc:///tmp/kv", 1, ""},
		{"tcp://host", 1, ""},
		{"tcp://*:65535", 1, ""},
		{"tcp://*:5557", -1, ""},
	}
	for _, tt := range tests {
		got, err := OffsetEndpointPort(tt.endpoint, tt.rank)
		if tt.want == "" {
			if err == nil {
				t.Errorf("OffsetEndpointPort(%q, %d) = %q, want an error", tt.endpoint, tt.rank, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("OffsetEndpointPort(%q, %d) = %q, %v; want %q", tt.endpoint, tt.rank, got, err, tt.want)
		}
	}
	binds := map[string]bool{"tcp://*:5557": true, "tcp://[::ffff:127.0.0.1]:1": true, "ipc:///x": true,
		"inproc://x": true, "tcp://127.0.0.1:5557": false, "tcp://vllm-0:5557": false}
	for ep, want := range binds {
		if PublisherBinds(ep) != want {
			t.Errorf("PublisherBinds(%q) = %v", ep, !want)
		}
	}
}
