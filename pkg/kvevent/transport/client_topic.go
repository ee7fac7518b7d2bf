package transport

import (
	"fmt"
	"strings"
	"time"
)

// topicMismatchReplays is how many replays in a row must deliver batches
// that no live message brought before a stream counts as filtering its live
// messages away. After a connection one such replay is normal (what the
// engine published before the subscription reached it), and a second one
// follows when live messages were lost just before the engine went idle; a
// third, with not one live message in between, is beyond what a working
// subscription shows.
const topicMismatchReplays = 3

// liveSilence follows the replays that delivered batches since the last
// live message.
type liveSilence struct {
	replays int  // replays that delivered a batch since the last live message
	counted bool // the replay in flight is one of them
}

// liveArrived records a live message: the subscription lets the engine's
// messages through, and the quiet-stream probes start over.
func (l *clientLoop) liveArrived(now time.Time) {
	l.quietFrom(now)
	l.silence.replays = 0
	if l.c.counters.topicMismatch.Load() {
		l.c.setTopicMismatch(false)
	}
}

// replayDelivered records that the replay in flight delivered a batch.
func (l *clientLoop) replayDelivered() {
	s := &l.silence
	if s.counted {
		return
	}
	s.counted = true
	s.replays++
	if s.replays == topicMismatchReplays && l.c.topicExplainsSilence() {
		l.c.setTopicMismatch(true)
	}
}

// topicExplainsSilence reports whether the subscription's topic may be why
// no live message arrives: the publisher's topic is unknown (its replay
// replies carry none before vLLM v0.26) or does not start with the
// subscribed one, as ZeroMQ's prefix filter requires.
func (c *ZMQClient) topicExplainsSilence() bool {
	pt := c.counters.publisherTopic.Load()
	return pt == nil || !strings.HasPrefix(*pt, c.cfg.Topic)
}

// notePublisherTopic records the topic frame of a replay reply.
func (c *ZMQClient) notePublisherTopic(topic []byte) {
	if cur := c.counters.publisherTopic.Load(); cur != nil && *cur == string(topic) {
		return
	}
	s := string(topic)
	c.counters.publisherTopic.Store(&s)
}

// setTopicMismatch records whether the stream's live messages are filtered
// out, and logs the change: the start always, as an error, since every
// batch then reaches the handler only through a quiet-stream replay, up to
// MaxReconnectDelay late.
func (c *ZMQClient) setTopicMismatch(on bool) {
	c.counters.topicMismatch.Store(on)
	c.metrics.SetTopicMismatch(on)
	if !on {
		c.logInfo("Live KV events arrive again", "topic", c.cfg.Topic)
		return
	}
	const msg = "KV events arrive only through replay: the subscription filters out every live message"
	if pt := c.counters.publisherTopic.Load(); pt != nil {
		c.logger.Error(fmt.Errorf("subscribed to topic %q, but the publisher's replay replies carry topic %q", c.cfg.Topic, *pt),
			msg, "topic", c.cfg.Topic, "publisherTopic", *pt, "maxDelay", c.cfg.MaxReconnectDelay)
		return
	}
	c.logger.Error(fmt.Errorf("no live message arrived while %d replays delivered new batches; the publisher's replay "+
		"replies do not name its topic (vLLM before v0.26): check that topic %q is a prefix of the engine's", topicMismatchReplays, c.cfg.Topic),
		msg, "topic", c.cfg.Topic, "maxDelay", c.cfg.MaxReconnectDelay)
}
