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
	logs := &kvtest.LogLines{}
	cfg := testClientConfig(ports)
	cfg.Logger = funcr.New(logs.Add, funcr.Options{})
	cfg.LogLevel = "error"
	rec := &kvtest.Recorder{}
	c := startClient(t, cfg, rec)
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	if got := logs.Containing("Connected to KV event publisher"); len(got) != 0 {
		t.Errorf("logged %q at level error", got)
	}

	if err := c.SetLogLevel("debug"); err != nil {
		t.Fatal(err)
	}
	if err := c.Reconnect(); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the reconnection and its replay to be logged", func() bool {
		return len(logs.Containing("Connected to KV event publisher")) > 0 && len(logs.Containing("Requested replay")) > 0
	})
	connected := logs.Containing("Connected to KV event publisher")
	for _, kv := range []string{`"pod"="default/vllm-0"`, `"model"="llama"`, `"dpRank"=0`} {
		if !strings.Contains(connected[0], kv) {
			t.Errorf("log line %s lacks %s", connected[0], kv)
		}
	}
	if err := pub.PublishRaw([]byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the decode error to be logged", func() bool {
		return len(logs.Containing("Dropping undecodable KV event batch")) > 0
	})
	if line := logs.Containing("Dropping undecodable")[0]; !strings.Contains(line, `"seq"=0`) {
		t.Errorf("decode error %s does not name the seq", line)
	}
}
