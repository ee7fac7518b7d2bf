package transport

import "time"

// DefaultReadInterval is ZMQClientConfig.ReadInterval's and
// BindConfig.ReadInterval's default: a batch waits at most this long
// before it is read, and the batches of an engine that publishes more
// often (scheduler steps shorter than this) are read a few at a time.
const DefaultReadInterval = 5 * time.Millisecond

// MaxReadInterval bounds ZMQClientConfig.ReadInterval and
// BindConfig.ReadInterval: a batch held longer would leave the index that
// far behind its engine, and routing on it.
const MaxReadInterval = time.Second

// readPacer spaces the reads of a live socket while its engines keep
// sending, so that the goroutine reading it wakes once for several
// messages.
//
// A message that arrives within the interval after a read that found
// messages is held until the interval has passed, then read with
// everything that came meanwhile, and the engines count as busy: after
// each read, the goroutine then pauses for the interval without watching
// the socket, and when the pause ends only looks whether a message came.
// Finding none, it counts the engines quiet again and goes back to
// waiting on the socket, reading the next message as soon as it comes. A
// goroutine whose engines send less often than the interval so pays no
// wake-up for the pacing, and one whose engines keep sending wakes once
// an interval.
type readPacer struct {
	interval time.Duration
	// next is when the socket may next be read; zero when at once.
	next time.Time
	// busy is set while the engines keep sending within the interval.
	busy bool
	// held is set while a message waits for next.
	held bool
	// resumed is set when a pause has just ended, until the poll after it.
	resumed bool
	timer   *time.Timer
	// reads counts the reads that found messages.
	reads int
}

// mayRead reports whether the live socket, found readable at now, may be
// read; if not, the message is held until wait's channel fires, and the
// engines count as busy.
func (p *readPacer) mayRead(now time.Time) bool {
	p.held = now.Before(p.next)
	p.busy = p.busy || p.held
	return !p.held
}

// read records a read of the live socket at now, which found messages
// (live) or none, and left a backlog (more waiting to be read or applied)
// or not: after a backlog the next read may come at once, after other
// messages the interval later; a read that found none changes nothing.
func (p *readPacer) read(now time.Time, live, backlog bool) {
	p.held = false
	switch {
	case backlog || p.interval <= 0:
		p.next = time.Time{}
	case live:
		p.next = now.Add(p.interval)
	}
	if live {
		p.reads++
	}
}

// wait returns a channel that fires when the goroutine may poll its
// sockets again, or nil when it may now: it pauses while a message is held
// or the engines are busy, until next. When the channel fires the caller
// calls resume; when it does something else first, stop.
func (p *readPacer) wait() <-chan time.Time {
	if !p.held && !p.busy {
		return nil
	}
	d := time.Until(p.next)
	if d <= 0 {
		return nil
	}
	if p.timer == nil {
		p.timer = time.NewTimer(d)
	} else {
		p.timer.Reset(d)
	}
	return p.timer.C
}

// resume records that a pause has ended.
func (p *readPacer) resume() { p.resumed = true }

// stop stops a wait's timer.
func (p *readPacer) stop() {
	if p.timer != nil {
		p.timer.Stop()
	}
}

// pollTimeout returns how long the poll may wait: timeout, or not at all
// right after a pause, when it only looks.
func (p *readPacer) pollTimeout(timeout time.Duration) time.Duration {
	if p.resumed {
		return 0
	}
	return timeout
}

// polled records whether a poll found the live socket readable: right
// after a pause, finding it empty means the engines have gone quiet.
func (p *readPacer) polled(readable bool) {
	if p.resumed {
		p.resumed = false
		p.busy = p.busy && readable
	}
}
