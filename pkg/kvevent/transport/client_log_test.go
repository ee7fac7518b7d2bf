package transport

import (
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
)

func TestClientLogsAtItsLevelWithPodAndModel(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)

	// A logger shifted by V(1) at verbosity 0 logs errors only.
	quiet := &kvtest.LogLines{}
	cfg := testClientConfig(ports)
	cfg.Logger = funcr.New(quiet.Add, funcr.Options{}).V(1)
	c := startClient(t, cfg, &kvtest.Recorder{})
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the connection's replay", func() bool { return c.Stats().ReplaySuccesses >= 1 })
	for _, msg := range []string{"Connected to KV event publisher", "Requested replay"} {
		if got := quiet.Containing(msg); len(got) != 0 {
			t.Errorf("logged %q to a logger that takes errors only", got)
		}
	}

	// At debug verbosity the connection, the redial and the replays show.
	logs := &kvtest.LogLines{}
	cfg = testClientConfig(ports)
	cfg.Logger = funcr.New(logs.Add, funcr.Options{Verbosity: logDebug})
	c = startClient(t, cfg, &kvtest.Recorder{})
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	if err := c.Reconnect(); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the reconnection and its replay to be logged", func() bool {
		return len(logs.Containing("Connected to KV event publisher")) > 1 && len(logs.Containing("Requested replay")) > 0
	})
	connected := logs.Containing("Connected to KV event publisher")
	for _, kv := range []string{`"pod"="default/vllm-0"`, `"model"="llama"`, `"dpRank"=0`} {
		if !strings.Contains(connected[0], kv) {
			t.Errorf("log line %s lacks %s", connected[0], kv)
		}
	}
	if got := logs.Containing("Delivered KV event batch"); len(got) != 0 {
		t.Errorf("logged %q below trace verbosity", got)
	}

	if err := pub.PublishRaw([]byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*kvtest.LogLines{quiet, logs} {
		testsupport.Eventually(t, "the decode error to be logged", func() bool {
			return len(l.Containing("Dropping undecodable KV event batch")) > 0
		})
		if line := l.Containing("Dropping undecodable")[0]; !strings.Contains(line, `"seq"=0`) {
			t.Errorf("decode error %s does not name the seq", line)
		}
	}
}
