// Package testsupport holds what the tests of several kvgate packages need
// alike: waiting for a condition with one generous deadline, a clock the
// test moves by hand, free loopback ports, reading a metric from a
// Prometheus registry, capturing what a logger writes, and a TestMain that
// prepares a temporary directory.
//
// It is imported only by tests.
package testsupport

import (
	"testing"
	"time"
)

// WaitTimeout is how long tests wait for anything that should happen: far
// beyond what a loaded two-core machine running the race detector needs,
// so that only a real failure reaches it.
const WaitTimeout = 30 * time.Second

// pollInterval is how often Eventually checks its condition.
const pollInterval = 5 * time.Millisecond

// Eventually checks cond every few milliseconds until it holds, and fails t
// with Fatalf, naming what (the awaited state, such as "the pod to be
// followed") and WaitTimeout, when it still does not hold after WaitTimeout.
// cond runs on the caller's goroutine; it may itself fail t.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	eventually(t, what, WaitTimeout, func() (string, bool) { return "", cond() })
}

// EventuallyWhy is Eventually for a condition that explains itself: cond
// reports whether it holds and, when it does not, what it saw instead.
// The failure message ends with the last explanation.
func EventuallyWhy(t testing.TB, what string, cond func() (why string, ok bool)) {
	t.Helper()
	eventually(t, what, WaitTimeout, cond)
}

func eventually(t testing.TB, what string, timeout time.Duration, cond func() (string, bool)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why, ok := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if why == "" {
				t.Fatalf("timed out after %v waiting for %s", timeout, what)
			} else {
				t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, why)
			}
			return
		}
		time.Sleep(pollInterval)
	}
}
