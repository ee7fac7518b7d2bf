package transport

import "time"

// A stream whose engine keeps restarting, or keeps losing batches, resets
// over and over, and every reset makes the handler drop the stream's state
// and the stream replay from the start. A faulty or hostile engine could
// make that happen thousands of times a second. So a stream that resets
// more than MaxResets times within ResetWindow (publisher restarts and
// unrecoverable gaps; rewinds asked for do not count) is suspended: it
// ignores its engine's messages and replays nothing for ReconnectDelay,
// doubling with every suspension that follows within ResetWindow of the
// last one, up to MaxReconnectDelay. Then it resynchronises as after a
// reconnection, replaying from the last batch it delivered. Resets are thus
// bounded to about MaxResets per ResetWindow and one per suspension.

// resetBudget follows the resets of one stream and its suspension.
type resetBudget struct {
	times     []time.Time // the latest resets, a ring; nil when unbounded
	next      int         // index of the oldest entry of times
	window    time.Duration
	base, cap time.Duration

	suspended bool
	until     time.Time     // end of the suspension
	delay     time.Duration // of the next suspension
	resumedAt time.Time     // end of the last suspension
}

func (b *resetBudget) init(cfg *ZMQClientConfig) {
	if cfg.MaxResets > 0 {
		b.times = make([]time.Time, cfg.MaxResets)
	}
	b.window, b.base, b.cap = cfg.ResetWindow, cfg.ReconnectDelay, cfg.MaxReconnectDelay
	b.delay = b.base
}

// record counts a reset at now and reports whether it is one too many.
func (b *resetBudget) record(now time.Time) bool {
	if len(b.times) == 0 {
		return false
	}
	oldest := b.times[b.next]
	b.times[b.next] = now
	b.next = (b.next + 1) % len(b.times)
	return !oldest.IsZero() && now.Sub(oldest) < b.window
}

// countReset counts a reset and suspends the stream when it resets too
// often.
func (s *stream) countReset(now time.Time) {
	b := &s.resets
	if !b.record(now) || b.suspended {
		return
	}
	if !b.resumedAt.IsZero() && now.Sub(b.resumedAt) >= b.window {
		b.delay = b.base
	}
	b.suspended, b.until = true, now.Add(b.delay)
	s.obs.suspended(b.delay, len(b.times), b.window)
	b.delay = min(2*b.delay, b.cap)
	s.endReplay()
	s.live.clear()
}

// resume ends a suspension at now and resynchronises the stream, as after
// a reconnection.
func (s *stream) resume(now time.Time) {
	b := &s.resets
	b.suspended, b.resumedAt = false, now
	s.obs.resumed()
	if s.connected {
		s.quietFrom(now)
		s.seq.onConnected()
	}
}
