package transport

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
)

func TestPacerHoldsOnlyWhatComesWithinTheIntervalOfAFullRead(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	const interval = 5 * time.Millisecond
	tests := []struct {
		name     string
		interval time.Duration
		// before is when the pacer let the next read come before this
		// one.
		before  time.Time
		live    bool
		backlog bool
		// heldUntil is when a message arriving at once after the read
		// may be read; zero: at once.
		heldUntil time.Time
	}{
		{"live messages, all applied", interval, time.Time{}, true, false, now.Add(interval)},
		{"a stream left with a backlog", interval, now.Add(interval), true, true, time.Time{}},
		{"no live message", interval, time.Time{}, false, false, time.Time{}},
		{"no live message after some", interval, now.Add(2 * time.Millisecond), false, false, now.Add(2 * time.Millisecond)},
		{"reading each message as it comes", 0, time.Time{}, true, false, time.Time{}},
	}
	for _, tt := range tests {
		p := readPacer{interval: tt.interval, next: tt.before}
		p.read(now, tt.live, tt.backlog)
		if !p.next.Equal(tt.heldUntil) {
			t.Errorf("%s: next read at %v, want %v", tt.name, p.next, tt.heldUntil)
		}
		soon := now.Add(time.Millisecond)
		if got, want := p.mayRead(soon), tt.heldUntil.IsZero(); got != want {
			t.Errorf("%s: a message 1ms after the read may be read: %v, want %v", tt.name, got, want)
		}
		if !tt.heldUntil.IsZero() && !p.mayRead(tt.heldUntil) {
			t.Errorf("%s: a message still held once the interval has passed", tt.name)
		}
	}
}

func TestPacerPausesOnlyWhileTheEnginesKeepSending(t *testing.T) {
	p := readPacer{interval: time.Hour}
	if p.wait() != nil {
		t.Fatal("a pacer that never read waits")
	}
	now := time.Now()
	p.read(now, true, false)
	if p.wait() != nil {
		t.Fatal("a pacer pauses after a read before any message came within the interval: a quiet engine would cost a wake-up a batch")
	}
	if p.mayRead(now) {
		t.Fatal("a message arriving at the read may be read at once with an interval of an hour")
	}
	pause := p.wait()
	if pause == nil {
		t.Fatal("no wait for a held message")
	}
	select {
	case <-pause:
		t.Fatal("the wait for a message held an hour ended at once")
	default:
	}
	p.stop()

	// The held message is read when the interval has passed; the engines
	// are busy now, so the pacer pauses after each read.
	at := p.next
	if !p.mayRead(at) {
		t.Fatal("the held message may not be read once the interval has passed")
	}
	p.read(at, true, false)
	if p.wait() == nil {
		t.Fatal("no pause after a read while the engines keep sending")
	}
	p.stop()
	p.resume()
	if got := p.pollTimeout(time.Minute); got != 0 {
		t.Fatalf("the poll after a pause may wait %v, want it only to look", got)
	}
	p.polled(true)
	if got := p.pollTimeout(time.Minute); got != time.Minute {
		t.Fatalf("a later poll may wait %v, want its own timeout", got)
	}
	at = p.next
	p.read(at, true, false)
	if p.wait() == nil {
		t.Fatal("no pause after a read that came at the end of a pause")
	}
	p.stop()

	// A read that leaves a backlog lets what comes next through at once.
	p.read(at, true, true)
	if p.wait() != nil || !p.mayRead(at) {
		t.Fatal("the pacer pauses after a read that left a backlog")
	}

	// A pause after which nothing was waiting: the engines went quiet.
	p.read(at, true, false)
	p.stop()
	p.resume()
	p.polled(false)
	p.read(at, true, false)
	if p.wait() != nil {
		t.Fatal("the pacer still pauses after a pause that found nothing")
	}
}

func TestPacerPauseEnds(t *testing.T) {
	p := readPacer{interval: time.Millisecond}
	p.read(time.Now(), true, false)
	if p.mayRead(time.Now()) {
		t.Skip("the clock moved a millisecond between two reads of it")
	}
	select {
	case <-p.wait():
	case <-time.After(time.Minute):
		t.Fatal("the wait for a message held a millisecond did not end")
	}
	if !p.mayRead(time.Now()) {
		t.Fatal("the held message may not be read once its wait ended")
	}
}

// checkReadsAGroupAtATime publishes on pub, to a stream read with interval
// and delivering to rec, until the stream has heard its engine, then ten
// batches 20 ms apart: a message that comes within an interval of the last
// read is read with the others once the interval has passed, so the
// stream's reads that found messages, counted by its pacer (which pacer
// hands to a function in the goroutine owning it), must grow at most once
// per interval the batches span, and once more.
func checkReadsAGroupAtATime(t *testing.T, pub *publisher.Publisher, rec *kvtest.Recorder, interval time.Duration,
	pacer func(func(*readPacer)) error) {
	t.Helper()
	next := 0
	kvtest.RepeatUntil(t, "the engine heard", func() {
		kvtest.Publish(t, pub, 1, next, next+1)
		next++
	}, func() bool { return rec.Count() > 0 })
	testsupport.Eventually(t, "what was published so far delivered", func() bool { return rec.Count() == next })
	reads := func() int {
		var n int
		if err := pacer(func(p *readPacer) { n = p.reads }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := reads()
	start := time.Now()
	for i := range 10 {
		if i > 0 {
			time.Sleep(20 * time.Millisecond)
		}
		kvtest.Publish(t, pub, 1, next, next+1)
		next++
	}
	span := time.Since(start)
	testsupport.Eventually(t, "every batch delivered", func() bool { return rec.Count() == next })
	got, _ := rec.Snapshot()
	kvtest.CheckSequence(t, got, 1, 0, next)
	if n, limit := reads()-before, 2+int(span/interval); n > limit {
		t.Errorf("ten batches published over %v took %d reads, want at most %d with a read interval of %v", span, n, limit, interval)
	}
}

func TestClientReadsABusyEngineAGroupAtATime(t *testing.T) {
	const interval = 300 * time.Millisecond
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	cfg := testClientConfig(ports)
	cfg.ReadInterval = interval
	rec := &kvtest.Recorder{}
	c := startClient(t, cfg, rec)
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	checkReadsAGroupAtATime(t, pub, rec, interval, func(f func(*readPacer)) error {
		return c.do(func(d *dialer) error {
			f(&d.pacer)
			return nil
		})
	})
}
