package transport

import (
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
)

func TestLogLimiterLetsABurstThroughThenSumsUpTheInterval(t *testing.T) {
	t.Parallel()
	var l logLimiter
	t0 := time.Unix(1000, 0)
	for i := range logBurst {
		if ok, summary := l.allow(t0.Add(time.Duration(i) * time.Second)); !ok || summary != 0 {
			t.Fatalf("line %d: allow = %v, %d; want the burst through", i, ok, summary)
		}
	}
	for i := range 5 {
		if ok, _ := l.allow(t0.Add(20 * time.Second)); ok {
			t.Fatalf("line %d beyond the burst allowed", logBurst+i)
		}
	}
	if n := l.due(t0.Add(logInterval - time.Second)); n != 0 {
		t.Errorf("summary of %d lines before the interval ended", n)
	}
	if n := l.due(t0.Add(logInterval)); n != 5 {
		t.Errorf("summary of %d lines when the interval ended, want 5", n)
	}
	if n := l.due(t0.Add(2 * logInterval)); n != 0 {
		t.Errorf("summary of %d lines repeated", n)
	}
	ok, summary := l.allow(t0.Add(3 * logInterval))
	if !ok || summary != 0 {
		t.Errorf("first line of a new interval: %v, %d", ok, summary)
	}
}

func TestClientRateLimitsPerBatchErrorLogs(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	logs := &kvtest.LogLines{}
	cfg := testClientConfig(ports)
	cfg.Logger = funcr.New(logs.Add, funcr.Options{})
	c := startClient(t, cfg, &kvtest.Recorder{})
	const bad = 3 * logBurst
	for range bad {
		if err := pub.PublishRaw([]byte{0xc1}); err != nil {
			t.Fatal(err)
		}
	}
	testsupport.Eventually(t, "every undecodable batch counted", func() bool { return c.Stats().DecodeErrors == bad })
	if got := len(logs.Containing("Dropping undecodable KV event batch")); got != logBurst {
		t.Errorf("logged %d of %d undecodable batches, want the first %d", got, bad, logBurst)
	}
	if st := c.Stats(); st.SuppressedLogs != bad-logBurst {
		t.Errorf("stats count %d suppressed lines, want %d", st.SuppressedLogs, bad-logBurst)
	}
}
