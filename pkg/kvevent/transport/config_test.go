package transport

import (
	"strings"
	"testing"
)

func TestValidateConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		adjust func(*ZMQClientConfig)
		want   string // substring of the error; "" for a valid config
	}{
		{"defaults", func(*ZMQClientConfig) {}, ""},
		{"host name", func(c *ZMQClientConfig) { c.PodIP = "vllm-0.vllm.default.svc" }, ""},
		{"IPv6", func(c *ZMQClientConfig) { c.PodIP = "fd00::12" }, ""},
		{"explicit endpoints need no IP", func(c *ZMQClientConfig) {
			c.PodIP, c.PubEndpoint, c.ReplayEndpoint = "", "ipc:///run/kv.pub", "ipc:///run/kv.replay"
		}, ""},
		{"no replay", func(c *ZMQClientConfig) { c.RouterPort = 0 }, ""},
		{"empty pod key", func(c *ZMQClientConfig) { c.PodKey = "" }, "PodKey is empty"},
		{"bad IP", func(c *ZMQClientConfig) { c.PodIP = "10.0.0.1:80" }, "PodIP"},
		{"negative rank", func(c *ZMQClientConfig) { c.DPRank = -1 }, "DPRank -1"},
		{"rank pushes the port out of range", func(c *ZMQClientConfig) { c.PubPort, c.DPRank = 65535, 1 }, "PubPort 65535"},
		{"bad router port", func(c *ZMQClientConfig) { c.RouterPort = -3 }, "RouterPort -3"},
		{"bad endpoint", func(c *ZMQClientConfig) { c.PubEndpoint = "10.0.0.1:5557" }, "PubEndpoint"},
		{"bad replay endpoint", func(c *ZMQClientConfig) { c.ReplayEndpoint = "tcp://" }, "ReplayEndpoint"},
		{"zero poll timeout", func(c *ZMQClientConfig) { c.PollTimeout = 0 }, "PollTimeout"},
		{"zero replay timeout", func(c *ZMQClientConfig) { c.ReplayTimeout = 0 }, "ReplayTimeout"},
		{"backoff cap below start", func(c *ZMQClientConfig) { c.MaxReconnectDelay = c.ReconnectDelay / 2 }, "MaxReconnectDelay"},
		{"heartbeat timeout below interval", func(c *ZMQClientConfig) { c.HeartbeatTimeout = c.HeartbeatInterval / 2 }, "HeartbeatTimeout"},
		{"no pending buffer", func(c *ZMQClientConfig) { c.MaxPendingBatches = 0 }, "MaxPendingBatches"},
		{"negative HWM", func(c *ZMQClientConfig) { c.ReceiveHWM = -1 }, "ReceiveHWM"},
		{"reading each message as it comes", func(c *ZMQClientConfig) { c.ReadInterval = 0 }, ""},
		{"negative read interval", func(c *ZMQClientConfig) { c.ReadInterval = -1 }, "ReadInterval"},
		{"read interval past its bound", func(c *ZMQClientConfig) { c.ReadInterval = MaxReadInterval + 1 }, "ReadInterval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultZMQClientConfig("ns/pod", "10.0.0.1", "m")
			tt.adjust(c)
			err := ValidateConfig(c)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error %v, want one mentioning %q", err, tt.want)
			}
		})
	}
	if err := ValidateConfig(nil); err == nil {
		t.Error("nil config accepted")
	}
	c := DefaultZMQClientConfig("", "", "m")
	c.PollTimeout = 0
	if err := ValidateConfig(c); err == nil || !strings.Contains(err.Error(), "PodKey") || !strings.Contains(err.Error(), "PollTimeout") {
		t.Errorf("error %v, want every problem reported", err)
	}
}

func TestClientEndpoints(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		adjust           func(*ZMQClientConfig)
		wantPub, wantRep string
	}{
		{"defaults", func(*ZMQClientConfig) {}, "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"},
		{"rank offsets both ports", func(c *ZMQClientConfig) { c.DPRank, c.PubPort, c.RouterPort = 2, 6000, 7000 },
			"tcp://10.0.0.1:6002", "tcp://10.0.0.1:7002"},
		{"IPv6 is bracketed", func(c *ZMQClientConfig) { c.PodIP = "fd00::12" }, "tcp://[fd00::12]:5557", "tcp://[fd00::12]:5558"},
		{"router port 0 disables replay", func(c *ZMQClientConfig) { c.RouterPort = 0 }, "tcp://10.0.0.1:5557", ""},
		{"explicit endpoints win", func(c *ZMQClientConfig) { c.PubEndpoint, c.ReplayEndpoint = "ipc:///a", "ipc:///b" },
			"ipc:///a", "ipc:///b"},
		{"explicit PUB without replay endpoint has no replay", func(c *ZMQClientConfig) { c.PubEndpoint = "ipc:///a" },
			"ipc:///a", ""},
	}
	for _, tt := range tests {
		c := DefaultZMQClientConfig("ns/pod", "10.0.0.1", "m")
		tt.adjust(c)
		pub, rep := c.endpoints()
		if pub != tt.wantPub || rep != tt.wantRep {
			t.Errorf("%s: endpoints %q, %q; want %q, %q", tt.name, pub, rep, tt.wantPub, tt.wantRep)
		}
	}
}
