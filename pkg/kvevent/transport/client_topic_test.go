package transport

import (
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
)

func TestClientReportsLiveMessagesItsTopicFiltersOut(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		layout  publisher.ReplayLayout
		logged  string // what the error log says of the publisher's topic
		topicOK bool   // the replies carry the publisher's topic
	}{
		{"vLLM v0.26 replies name the topic", publisher.ReplayWithTopic, `"publisherTopic"="kv-events"`, true},
		{"older replies do not", publisher.ReplayWithoutTopic, "do not name its topic", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ports := kvtest.NewPorts(t)
			pub := kvtest.NewPublisher(t, ports, func(c *publisher.PublisherConfig) {
				c.Topic, c.ReplayLayout = "kv-events", tc.layout
			})
			reg, metrics := newTestMetrics(t)
			logs := &kvtest.LogLines{}
			cfg := testClientConfig(ports)
			cfg.Topic, cfg.Metrics, cfg.Logger = "other", metrics, funcr.New(logs.Add, funcr.Options{})
			c := startClient(t, cfg, &kvtest.Recorder{})
			if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
				t.Fatal(err)
			}

			next := 0
			publishUntil(t, pub, &next, "the mismatch to be reported", func() bool { return c.Stats().TopicMismatch })

			s := c.Stats()
			if s.BatchesReceived == 0 || s.ReplayedBatches != s.BatchesReceived {
				t.Errorf("delivered %d batches, %d of them replayed; want every one replayed", s.BatchesReceived, s.ReplayedBatches)
			}
			if s.PublisherTopicKnown != tc.topicOK || tc.topicOK && s.PublisherTopic != "kv-events" {
				t.Errorf("publisher topic %q (known %v)", s.PublisherTopic, s.PublisherTopicKnown)
			}
			stream := "dp_rank=0,pod_key=" + cfg.PodKey
			if got := series(t, reg, "topic_mismatch")[stream]; got != 1 {
				t.Errorf("topic_mismatch = %v, want 1", got)
			}
			// More replays keep delivering; the warning is not repeated.
			replays := s.ReplaySuccesses
			publishUntil(t, pub, &next, "three more replays", func() bool { return c.Stats().ReplaySuccesses >= replays+3 })
			lines := logs.Containing("KV events arrive only through replay")
			if len(lines) != 1 {
				t.Fatalf("logged the mismatch %d times, want once: %q", len(lines), lines)
			}
			for _, want := range []string{`"pod"="default/vllm-0"`, `"topic"="other"`, tc.logged} {
				if !strings.Contains(lines[0], want) {
					t.Errorf("log line %s lacks %s", lines[0], want)
				}
			}
		})
	}
}

func TestClientWhoseTopicIsAPrefixReceivesLiveAndReportsNoMismatch(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, func(c *publisher.PublisherConfig) { c.Topic = "kv-events" })
	// Batch 0 comes through the first replay, which names the topic.
	kvtest.Publish(t, pub, 1, 0, 1)
	kvtest.AwaitBuffered(t, ports, 0)
	cfg := testClientConfig(ports)
	cfg.Topic = "kv"
	c := startClient(t, cfg, &kvtest.Recorder{})
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	next := 1
	publishUntil(t, pub, &next, "a live batch", func() bool { s := c.Stats(); return s.BatchesReceived > s.ReplayedBatches })
	if s := c.Stats(); s.TopicMismatch || !s.PublisherTopicKnown || s.PublisherTopic != "kv-events" {
		t.Errorf("stats %+v; want no mismatch and publisher topic kv-events", s)
	}
}

// TestTopicMismatchNeedsReplaysInARowThatTheTopicExplains drives the
// detection directly: replays that deliver, live messages in between, and
// what the publisher's replies said of its topic.
func TestTopicMismatchNeedsReplaysInARowThatTheTopicExplains(t *testing.T) {
	t.Parallel()
	const replay, live = "replay", "live"
	tests := []struct {
		name       string
		subscribed string
		publisher  *string // topic of the replies; nil: not carried
		steps      []string
		want       bool
	}{
		{"three replays, topic unknown", "other", nil, []string{replay, replay, replay}, true},
		{"three replays, topic differs", "other", ptr("kv-events"), []string{replay, replay, replay}, true},
		{"three replays, topic is a prefix", "kv", ptr("kv-events"), []string{replay, replay, replay}, false},
		{"three replays, empty topic matches all", "", ptr("kv-events"), []string{replay, replay, replay}, false},
		{"three replays, a long topic is a prefix of a longer one", strings.Repeat("k", 300), ptr(strings.Repeat("k", 1<<20)),
			[]string{replay, replay, replay}, false},
		{"three replays, a long topic differs late", strings.Repeat("k", 300), ptr(strings.Repeat("k", 299) + "x"),
			[]string{replay, replay, replay}, true},
		{"two replays", "other", nil, []string{replay, replay}, false},
		{"a live message between", "other", nil, []string{replay, replay, live, replay, replay}, false},
		{"a live message after", "other", nil, []string{replay, replay, replay, live}, false},
		{"reported again after a live message", "other", nil, []string{replay, replay, replay, live, replay, replay, replay}, true},
	}
	for _, tt := range tests {
		cfg := DefaultZMQClientConfig("default/p", "127.0.0.1", "llama")
		cfg.Topic, cfg.Logger = tt.subscribed, logr.Discard()
		c, err := NewZMQClient(cfg, &kvtest.Recorder{})
		if err != nil {
			t.Fatal(err)
		}
		if tt.publisher != nil {
			c.obs.publisherTopic([]byte(*tt.publisher))
		}
		s := c.idle.s
		for _, step := range tt.steps {
			if step == live {
				s.liveArrived(s.probeAt)
				continue
			}
			s.silence.counted = false // a new replay, as startReplay sends
			s.replayDelivered()
			s.replayDelivered() // a second batch of the same replay counts once
		}
		if got := c.Stats().TopicMismatch; got != tt.want {
			t.Errorf("%s: TopicMismatch = %v, want %v", tt.name, got, tt.want)
		}
		c.Close()
	}
}

func ptr(s string) *string { return &s }

// publishUntil publishes batches of publisher 1 from *next on, one per
// round of repeatUntil, until cond holds.
func publishUntil(t testing.TB, pub *publisher.Publisher, next *int, what string, cond func() bool) {
	t.Helper()
	kvtest.RepeatUntil(t, what, func() {
		kvtest.Publish(t, pub, 1, *next, *next+1)
		*next++
	}, cond)
}

func TestStatsShowAtMostTheStartOfAHugePublisherTopic(t *testing.T) {
	t.Parallel()
	cfg := DefaultZMQClientConfig("default/p", "127.0.0.1", "llama")
	cfg.Logger = logr.Discard()
	c, err := NewZMQClient(cfg, &kvtest.Recorder{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, topic := range []string{strings.Repeat("t", 1<<20), "kv-events", strings.Repeat("u", 1<<20)} {
		c.obs.publisherTopic([]byte(topic))
		want := topic
		if len(topic) > maxShown {
			want = topic[:maxShown] + "..."
		}
		if s := c.Stats(); !s.PublisherTopicKnown || s.PublisherTopic != want {
			t.Errorf("after a topic of %d bytes, stats show one of %d bytes (%.8q...), want %d", len(topic), len(s.PublisherTopic),
				s.PublisherTopic, len(want))
		}
	}
}
