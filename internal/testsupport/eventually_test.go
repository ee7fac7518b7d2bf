package testsupport

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// the calling goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// runEventually runs eventually against a fatalRecorder on a goroutine of
// its own and returns what it recorded ("" when it returned normally) and
// how long it took.
func runEventually(what string, timeout time.Duration, cond func() (string, bool)) (string, time.Duration) {
	r := &fatalRecorder{}
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		eventually(r, what, timeout, cond)
	}()
	<-done
	return r.msg, time.Since(start)
}

func TestEventuallyFailsAfterTheDeadlineSayingWhatAndHowLong(t *testing.T) {
	const timeout = 50 * time.Millisecond
	for _, tc := range []struct {
		name string
		why  string
		want string
	}{
		{"silent condition", "", "timed out after 50ms waiting for the pod to be followed"},
		{"explained condition", "2 of 3 pods", "timed out after 50ms waiting for the pod to be followed: 2 of 3 pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			msg, took := runEventually("the pod to be followed", timeout, func() (string, bool) {
				calls.Add(1)
				return tc.why, false
			})
			if msg != tc.want {
				t.Errorf("failure message %q, want %q", msg, tc.want)
			}
			if took < timeout {
				t.Errorf("failed after %v, before the %v deadline", took, timeout)
			}
			if calls.Load() < 2 {
				t.Errorf("condition checked %d times, want it polled", calls.Load())
			}
		})
	}
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	msg, took := runEventually("the third check", WaitTimeout, func() (string, bool) {
		return "not yet", calls.Add(1) == 3
	})
	if msg != "" {
		t.Fatalf("failed: %s", msg)
	}
	if calls.Load() != 3 {
		t.Errorf("condition checked %d times, want 3", calls.Load())
	}
	if took >= WaitTimeout/2 {
		t.Errorf("took %v for a condition that held at the third check", took)
	}
}

func TestEventuallyPassesTheConditionThrough(t *testing.T) {
	n := 0
	Eventually(t, "a counter to reach 2", func() bool { n++; return n == 2 })
	EventuallyWhy(t, "a counter to reach 4", func() (string, bool) { n++; return fmt.Sprint(n), n == 4 })
	if n != 4 {
		t.Fatalf("conditions checked %d times, want 4", n)
	}
}
