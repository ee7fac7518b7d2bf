package transport

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
)

func TestClientExportsItsMetrics(t *testing.T) {
	t.Parallel()
	reg, metrics := newTestMetrics(t)
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	kvtest.Publish(t, pub, 1, 0, 4)
	if err := pub.PublishRaw([]byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	kvtest.AwaitBuffered(t, ports, 4) // sent before the client subscribes: all 5 come from the replay
	cfg := testClientConfig(ports)
	cfg.Metrics = metrics
	cfg.ReconnectDelay, cfg.MaxReconnectDelay = time.Minute, time.Minute // no quiet-stream probe during the test
	rec := &kvtest.Recorder{}
	c := startClient(t, cfg, rec)
	testsupport.Eventually(t, "the batches", func() bool { return c.Stats().BatchesReceived >= 5 })

	stream := "dp_rank=0,pod_key=" + cfg.PodKey
	checks := []struct {
		name, labels string
		want         float64
	}{
		{"events_received_total", "dp_rank=0,event_type=BLOCK_STORED,pod_key=" + cfg.PodKey, 4},
		{"events_processed_total", "dp_rank=0,event_type=BLOCK_STORED,pod_key=" + cfg.PodKey, 4},
		{"batches_received_total", stream, 5},
		{"replayed_batches_total", stream, 5},
		{"errors_total", "dp_rank=0,error_type=decode,pod_key=" + cfg.PodKey, 1},
		{"connections_total", stream, 1},
		{"connection_status", stream, 1},
		{"last_sequence_id", stream, 4},
		{"replay_requests_total", stream, 1},
		{"replay_success_total", stream, 1},
		{"event_processing_duration_seconds", stream, 4},
	}
	for _, c := range checks {
		if got := series(t, reg, c.name)[c.labels]; got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	c.Close()
	if got := series(t, reg, "events_received_total"); len(got) != 0 {
		t.Errorf("events_received_total %v after Close, want no series", got)
	}
}
