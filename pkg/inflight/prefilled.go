package inflight

import "time"

// maxPrefilled bounds how many ended prefills a pod's load record remembers for
// the scrapes that may still count them (see prefilledLog); at the scrape
// intervals of a gateway, far more than end within one interval.
const maxPrefilled = 256

// prefilled is a prefill that left a pod's queue: when it was started and
// when its end was seen.
type prefilled struct {
	start, end time.Time
}

// prefilledLog remembers the recent prefills of a pod that left its queue,
// oldest end first, so that a decision can tell how many of this gateway's requests
// a scrape of the engine's waiting queue may still count: those started
// before the scrape and ended after it.
type prefilledLog struct {
	entries []prefilled
	// at is the scrape time of the last count, zero when none is kept;
	// counted is how many entries then started before at. Entries added
	// since, which end after any scrape seen, keep it current, so that the
	// decisions between two scrapes cost no scan.
	at      time.Time
	counted int
}

// add records a prefill started at start whose end was seen at end, no
// earlier than the ends already recorded. Past twice maxPrefilled entries it
// forgets the oldest half.
func (l *prefilledLog) add(start, end time.Time) {
	if len(l.entries) == 2*maxPrefilled {
		l.entries = l.entries[:copy(l.entries, l.entries[maxPrefilled:])]
		l.at = time.Time{}
	}
	l.entries = append(l.entries, prefilled{start: start, end: end})
	if !l.at.IsZero() {
		if !end.After(l.at) {
			l.at = time.Time{}
		} else if start.Before(l.at) {
			l.counted++
		}
	}
}

// since returns how many recorded prefills started before scrapedAt and
// ended after it. It forgets those that ended by scrapedAt: a pod's scrapes
// only get newer, and newer ones cannot count them. (Of two decisions
// reading two scrapes at once, the one with the older scrape may then count
// too few, as it would without this log.) Asked again for the same scrape,
// it answers without a scan.
func (l *prefilledLog) since(scrapedAt time.Time) int {
	if !scrapedAt.IsZero() && scrapedAt.Equal(l.at) {
		return l.counted
	}
	l.dropWhile(func(e prefilled) bool { return !e.end.After(scrapedAt) })
	n := 0
	for _, e := range l.entries {
		if e.start.Before(scrapedAt) {
			n++
		}
	}
	l.at, l.counted = scrapedAt, n
	return n
}

// dropWhile forgets the oldest entries while gone holds for them.
func (l *prefilledLog) dropWhile(gone func(prefilled) bool) {
	n := 0
	for n < len(l.entries) && gone(l.entries[n]) {
		n++
	}
	if n > 0 {
		l.entries = l.entries[:copy(l.entries, l.entries[n:])]
	}
}
