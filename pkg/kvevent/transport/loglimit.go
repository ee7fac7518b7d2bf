package transport

import "time"

// Per-message error logs are rate-limited, per stream and kind of error (or
// per bound receiver and reason of an ignored message): the first
// logBurst lines of an interval of logInterval are logged, the rest are
// counted and summed up in one line when the interval ends. The errors
// themselves are all counted in the metrics and statistics either way.
const (
	logBurst    = 10
	logInterval = time.Minute
)

// maxShown bounds the bytes of a string from an engine (a topic) that logs,
// errors and statistics show, so that a frame of megabytes is not copied
// into them: a longer string is cut there and ends with "...".
const maxShown = 256

// shown returns s as logs, errors and statistics show it (see maxShown).
func shown[T ~string | ~[]byte](s T) string {
	if len(s) > maxShown {
		return string(s[:maxShown]) + "..."
	}
	return string(s)
}

// logLimiter decides which lines of one kind are logged. Its owner
// goroutine alone uses it.
type logLimiter struct {
	start      time.Time // of the current interval; zero before the first line
	logged     int       // lines logged in the current interval
	suppressed int       // lines dropped in the current interval
}

// allow reports whether a line may be logged at now. When an interval ended
// with lines suppressed, it also returns their number, for a summary to be
// logged first.
func (l *logLimiter) allow(now time.Time) (ok bool, summary int) {
	summary = l.roll(now)
	if l.logged < logBurst {
		l.logged++
		return true, summary
	}
	l.suppressed++
	return false, summary
}

// roll starts a new interval when the current one is over, and returns the
// lines suppressed in the one that ended.
func (l *logLimiter) roll(now time.Time) int {
	if !l.start.IsZero() && now.Sub(l.start) < logInterval {
		return 0
	}
	n := l.suppressed
	l.start, l.logged, l.suppressed = now, 0, 0
	return n
}

// due returns the lines suppressed in an interval that is over at now, and
// starts afresh; 0 when the interval is still running or nothing was
// suppressed.
func (l *logLimiter) due(now time.Time) int {
	if l.suppressed == 0 {
		return 0
	}
	return l.roll(now)
}
