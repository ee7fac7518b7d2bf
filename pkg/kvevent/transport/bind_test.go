package transport

import "testing"

func TestParseBindTopic(t *testing.T) {
	tests := []struct {
		topic, ip, model string
		port             int
		ok               bool
	}{
		{"kv@10.0.0.1:8000@llama", "10.0.0.1", "llama", 8000, true},
		{"kv@[fd00::1]:8000@org/model@v2", "fd00::1", "org/model@v2", 8000, true},
		{"kv@::ffff:10.0.0.1:8000@m", "", "", 0, false},
		{"kv@10.0.0.1@llama", "", "", 0, false},
		{"kv@10.0.0.1:0@llama", "", "", 0, false},
		{"kv@host:8000@llama", "", "", 0, false},
		{"kv@10.0.0.1:8000@", "", "", 0, false},
		{"kv-events", "", "", 0, false},
	}
	for _, tt := range tests {
		ip, port, model, err := parseBindTopic(tt.topic)
		if (err == nil) != tt.ok || ip != tt.ip || port != tt.port || model != tt.model {
			t.Errorf("parseBindTopic(%q) = %q, %d, %q, %v", tt.topic, ip, port, model, err)
		}
	}
}
