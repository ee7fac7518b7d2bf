package transport

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
)

func TestParseBindTopic(t *testing.T) {
	tests := []struct {
		topic, ip, model string
		port             int
		ok               bool
	}{
		{"kv@10.0.0.1:8000@llama", "10.0.0.1", "llama", 8000, true},
		{"kv@[fd00::1]:8000@org/model@v2", "fd00::1", "org/model@v2", 8000, true},
		{"kv@[::ffff:10.0.0.1]:8000@m", "10.0.0.1", "m", 8000, true},
		{"kv@::ffff:10.0.0.1:8000@m", "", "", 0, false},
		{"kv@10.0.0.1@llama", "", "", 0, false},
		{"kv@10.0.0.1:0@llama", "", "", 0, false},
		{"kv@host:8000@llama", "", "", 0, false},
		{"kv@10.0.0.1:8000@", "", "", 0, false},
		{"kv-events", "", "", 0, false},
	}
	for _, tt := range tests {
		id, err := parseBindTopic(tt.topic)
		if (err == nil) != tt.ok || id.ip != tt.ip || id.port != tt.port || id.model != tt.model {
			t.Errorf("parseBindTopic(%q) = %+v, %v", tt.topic, id, err)
		}
		if err == nil && BindTopic(tt.ip, tt.port, tt.model) != id.String() {
			t.Errorf("identity %+v prints as %q", id, id.String())
		}
	}
	if got := BindTopic("fd00::1", 8000, "m"); got != "kv@[fd00::1]:8000@m" {
		t.Errorf("BindTopic of an IPv6 engine = %q", got)
	}
}

func TestSamePeer(t *testing.T) {
	tests := []struct {
		peer, ip string
		want     bool
	}{
		{"10.0.0.1", "10.0.0.1", true},
		{"::ffff:10.0.0.1", "10.0.0.1", true},
		{"10.0.0.2", "10.0.0.1", false},
		{"fd00::1", "fd00::1", true},
		{"", "10.0.0.1", true},
		{"garbage", "10.0.0.1", false},
	}
	for _, tt := range tests {
		if got := samePeer(tt.peer, tt.ip); got != tt.want {
			t.Errorf("samePeer(%q, %q) = %v", tt.peer, tt.ip, got)
		}
	}
}

func TestIgnoringAHugeTopicCopiesNoMoreOfItThanTheLogShows(t *testing.T) {
	logs := &kvtest.LogLines{}
	l := &bindLoop{logger: funcr.New(logs.Add, funcr.Options{}), byIdentity: map[bindIdentity]string{},
		streams: map[boundKey]*boundEntry{}, ignoreLimits: map[string]*logLimiter{}, bound: []string{"tcp://*:5557"}}
	for reason, topic := range map[string]string{
		IgnoredBadTopic:   strings.Repeat("x", 1<<20),
		IgnoredUnknownPod: "kv@10.0.0.1:8000@" + strings.Repeat("m", 1<<20),
	} {
		for range logBurst {
			l.onMessage(0, topic, "10.0.0.1", 0, nil)
		}
		// The log is rate-limited from here on.
		const runs = 100
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			l.onMessage(0, topic, "10.0.0.1", 0, nil)
		}
		runtime.ReadMemStats(&after)
		if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 1024 {
			t.Errorf("%s: ignoring a message without logging it allocated %d bytes", reason, per)
		}
		lines := logs.Containing(`"reason"="` + reason + `"`)
		if len(lines) != logBurst {
			t.Fatalf("%s: %d lines logged, want %d", reason, len(lines), logBurst)
		}
		for _, line := range lines {
			if len(line) > 2*maxShown+512 {
				t.Errorf("%s: a log line of %d bytes: %.300s...", reason, len(line), line)
				break
			}
		}
	}
}

func TestBindReceiverReadsABusyEngineAGroupAtATime(t *testing.T) {
	const interval = 300 * time.Millisecond
	port := testsupport.FreePorts(t, 1)[0]
	// A high-water mark above the test's batches: the default of 4 would
	// hold the engine back and have the receiver read again at once.
	recv, err := NewBindReceiver(BindConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port), ReadInterval: interval,
		ReceiveHWM: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(recv.Close)
	ports := kvtest.NewPorts(t)
	cfg := testClientConfig(ports)
	cfg.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports.Router)
	rec := &kvtest.Recorder{}
	if _, err := recv.Follow(BoundStreamConfig{Config: cfg, EnginePort: 8000, Handler: rec}); err != nil {
		t.Fatal(err)
	}
	pub := kvtest.NewPublisher(t, ports, func(c *publisher.PublisherConfig) {
		c.Endpoint, c.Topic = fmt.Sprintf("tcp://127.0.0.1:%d", port), BindTopic("127.0.0.1", 8000, cfg.ModelName)
	})
	checkReadsAGroupAtATime(t, pub, rec, interval, func(f func(*readPacer)) error {
		return recv.do(func(l *bindLoop) error {
			f(&l.pacer)
			return nil
		})
	})
}

func TestBindConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  BindConfig
		want string // substring of the error; "" for a valid config
	}{
		{"defaults", BindConfig{Endpoint: "tcp://*:5557"}, ""},
		{"each message as it comes", BindConfig{Endpoint: "tcp://*:5557", ReadInterval: -1}, ""},
		{"read interval at its bound", BindConfig{Endpoint: "tcp://*:5557", ReadInterval: MaxReadInterval}, ""},
		{"read interval past its bound", BindConfig{Endpoint: "tcp://*:5557", ReadInterval: MaxReadInterval + 1}, "ReadInterval"},
		{"no endpoint", BindConfig{}, "bind"},
		{"negative ranks", BindConfig{Endpoint: "tcp://*:5557", Ranks: -1}, "Ranks -1"},
		{"negative bound", BindConfig{Endpoint: "tcp://*:5557", ReceiveHWM: -1}, "must not be negative"},
		{"ranks past the last port", BindConfig{Endpoint: "tcp://*:65535", Ranks: 2}, "bind"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: unexpected error: %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: error %v, want one mentioning %q", tt.name, err, tt.want)
		}
	}
}
