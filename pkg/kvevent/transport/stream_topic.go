package transport

import (
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
func (s *stream) liveArrived(now time.Time) {
	s.heard(now)
	s.quietFrom(now)
	s.silence.replays = 0
	if s.obs.topicMismatch() {
		s.obs.setTopicMismatch(false)
	}
}

// replayDelivered records that the replay in flight delivered a batch.
func (s *stream) replayDelivered() {
	ls := &s.silence
	if ls.counted {
		return
	}
	ls.counted = true
	ls.replays++
	if ls.replays == topicMismatchReplays && s.obs.topicExplainsSilence() {
		s.obs.setTopicMismatch(true)
	}
}
