package kvevent

import (
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// logLines captures a logger's lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, args)
}

func (l *logLines) containing(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

func TestClientLogsAtItsLevelWithPodAndModel(t *testing.T) {
	t.Parallel()
	ports := newTestPorts(t)
	pub := newTestPublisher(t, ports, nil)
	logs := &logLines{}
	cfg := testClientConfig(ports)
	cfg.Logger = funcr.New(logs.add, funcr.Options{})
	cfg.LogLevel = "error"
	rec := &recorder{}
	c := startClient(t, cfg, rec)
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	if got := logs.containing("Connected to KV event publisher"); len(got) != 0 {
		t.Errorf("logged %q at level error", got)
	}

	if err := c.SetLogLevel("debug"); err != nil {
		t.Fatal(err)
	}
	if err := c.Reconnect(); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the reconnection and its replay to be logged", func() bool {
		return len(logs.containing("Connected to KV event publisher")) > 0 && len(logs.containing("Requested replay")) > 0
	})
	connected := logs.containing("Connected to KV event publisher")
	for _, kv := range []string{`"pod"="default/vllm-0"`, `"model"="llama"`, `"dpRank"=0`} {
		if !strings.Contains(connected[0], kv) {
			t.Errorf("log line %s lacks %s", connected[0], kv)
		}
	}
	if err := pub.PublishRaw([]byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the decode error to be logged", func() bool {
		return len(logs.containing("Dropping undecodable KV event batch")) > 0
	})
	if line := logs.containing("Dropping undecodable")[0]; !strings.Contains(line, `"seq"=0`) {
		t.Errorf("decode error %s does not name the seq", line)
	}
}
