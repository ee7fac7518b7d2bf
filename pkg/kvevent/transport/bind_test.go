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
	next := 0
	kvtest.RepeatUntil(t, "the engine heard", func() {
		kvtest.Publish(t, pub, 1, next, next+1)
		next++
	}, func() bool { return rec.Count() > 0 })
	testsupport.Eventually(t, "what was published so far delivered", func() bool { return rec.Count() == next })

	// Ten batches 20 ms apart: the receiver reads what comes within an
	// interval of its last read together once the interval has passed,
	// so it reads them at most once per interval they span and once more.
	reads := liveReads(t, recv)
	start := time.Now()
	for i := range 10 {
		if i > 0 {
			time.Sleep(20 * time.Millisecond)
		}
		kvtest.Publish(t, pub, 1, next, next+1)
		next++
	}
	span := time.Since(start)
	testsupport.Eventually(t, "every batch delivered", func() bool { return rec.Count() == next })
	got, _ := rec.Snapshot()
	kvtest.CheckSequence(t, got, 1, 0, next)
	if n, limit := liveReads(t, recv)-reads, 2+int(span/interval); n > limit {
		t.Errorf("ten batches published over %v took %d reads, want at most %d with a read interval of %v", span, n, limit, interval)
	}
}

// liveReads returns how many reads of r's sockets found live messages.
func liveReads(t *testing.T, r *BindReceiver) int {
	var n int
	if err := r.do(func(l *bindLoop) error {
		n = l.liveReads
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestBindReceiverPausesOnlyWhenAllIsApplied(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name     string
		interval time.Duration
		live     bool
		backlog  bool
		want     time.Time
	}{
		{"live messages, all applied", 5 * time.Millisecond, true, false, now.Add(5 * time.Millisecond)},
		{"a stream left with a backlog", 5 * time.Millisecond, true, true, time.Time{}},
		{"no live message (replies, timers)", 5 * time.Millisecond, false, false, time.Time{}},
		{"reading each message as it comes", -1, true, false, time.Time{}},
	}
	for _, tt := range tests {
		if got := nextReadAt(now, tt.interval, tt.live, tt.backlog); !got.Equal(tt.want) {
			t.Errorf("%s: next read at %v, want %v", tt.name, got, tt.want)
		}
	}
}
