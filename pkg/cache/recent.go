package cache

import "time"

// counter indexes the monotonically increasing values of a vLLM exposition
// that the Store turns into recent rates and means.
type counter int

const (
	cPromptTokens counter = iota
	cPrefixHits
	cPrefixQueries
	cTTFTSum
	cTTFTCount
	cTPOTSum
	cTPOTCount
	cE2ESum
	cE2ECount
	cPrefillSum
	cPrefillCount
	numCounters
)

// counters holds one scrape's counter values; has marks the ones present.
type counters struct {
	v   [numCounters]float64
	has uint32
}

func (c *counters) add(k counter, v float64) {
	c.v[k] += v
	c.has |= 1 << k
}

func (c counters) get(k counter) (float64, bool) {
	return c.v[k], c.has&(1<<k) != 0
}

// sub returns c - base for the counters present in both.
func (c counters) sub(base counters) counters {
	d := counters{has: c.has & base.has}
	for k := range numCounters {
		if d.has&(1<<k) != 0 {
			d.v[k] = c.v[k] - base.v[k]
		}
	}
	return d
}

// decreasedFrom reports whether any counter present in both went down, which
// means the engine restarted.
func (c counters) decreasedFrom(prev counters) bool {
	both := c.has & prev.has
	for k := range numCounters {
		if both&(1<<k) != 0 && c.v[k] < prev.v[k] {
			return true
		}
	}
	return false
}

// windowSteps is how many samples a recentWindow keeps per window length.
const windowSteps = 8

type sample struct {
	at time.Time
	c  counters
}

// recentWindow turns successive scrapes of counters into deltas over about
// the last `length` of time. It keeps a few samples spaced length/windowSteps
// apart; the oldest is the newest one that is at least length old, so the
// baseline slides smoothly. A zero length degenerates to the previous
// scrape. A counter going down resets the window to the current scrape.
type recentWindow struct {
	length  time.Duration
	samples []sample
	prev    counters
	started bool
}

// observe records the scrape cur taken at now and returns its delta from the
// window's baseline; the delta is empty on the first scrape and on a reset.
func (w *recentWindow) observe(now time.Time, cur counters) counters {
	if !w.started || cur.decreasedFrom(w.prev) {
		w.samples = append(w.samples[:0], sample{at: now, c: cur})
		w.prev, w.started = cur, true
		return counters{has: cur.has}
	}
	delta := cur.sub(w.samples[0].c)
	w.prev = cur
	newest := w.samples[len(w.samples)-1]
	if now.Sub(newest.at) >= w.length/windowSteps {
		w.samples = append(w.samples, sample{at: now, c: cur})
	}
	drop := 0
	for len(w.samples)-drop > 1 && now.Sub(w.samples[drop+1].at) >= w.length {
		drop++
	}
	if drop > 0 {
		n := copy(w.samples, w.samples[drop:])
		w.samples = w.samples[:n]
	}
	return delta
}
