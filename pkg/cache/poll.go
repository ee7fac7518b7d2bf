package cache

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// The per-pod loops of the scrape pool share how they poll: once at start,
// then on every tick; a poll that takes longer than the interval delays the
// next one instead of overlapping it.

// pollEvery calls poll right away and then every interval until ctx is
// cancelled.
func pollEvery(ctx context.Context, interval time.Duration, poll func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// maxKeptBufferBytes is the most memory a pod's loop keeps in one buffer
// between two reads: a buffer that a larger page grew is released after
// use, so that one large page does not hold its memory for as long as the
// pod is read.
const maxKeptBufferBytes = 1 << 20

// trimBuffer releases buf's memory when it is larger than
// maxKeptBufferBytes, and reports whether it did.
func trimBuffer(buf *bytes.Buffer) bool {
	if buf.Cap() <= maxKeptBufferBytes {
		return false
	}
	*buf = bytes.Buffer{}
	return true
}

// Why a read of a pod's /metrics or /v1/models failed: the reason label of
// the Store's failure counters.
const (
	// readTimeout: no complete answer within the scrape timeout.
	readTimeout = "timeout"
	// readConnection: the connection failed or broke.
	readConnection = "connection"
	// readStatus: an answer with another status than 200.
	readStatus = "status"
	// readTooLarge: a body beyond the page's bound.
	readTooLarge = "too_large"
	// readBadBody: a body that does not parse.
	readBadBody = "bad_body"
)

// readError is a failed read of a pod's page; reason is one of the read*
// reasons.
type readError struct {
	reason string
	err    error
}

func (e *readError) Error() string { return e.err.Error() }

func (e *readError) Unwrap() error { return e.err }

// readReason returns why err, returned by a pageClient or a loop's fetch, failed
// the read.
func readReason(err error) string {
	if re, ok := errors.AsType[*readError](err); ok {
		return re.reason
	}
	return readConnection
}

// maxLoggedNameBytes bounds a name a pod sent that a log line quotes.
const maxLoggedNameBytes = 128

// clipForLog returns s cut to maxLoggedNameBytes, marked when cut.
func clipForLog(s string) string {
	if len(s) <= maxLoggedNameBytes {
		return s
	}
	return strings.ToValidUTF8(s[:maxLoggedNameBytes], "") + "…"
}

// failureLog logs a run of failures of a pod's poll once at info level
// when it starts and once when it ends, and the failures in between at
// V(4), so that a pod that stays down does not flood the log.
type failureLog struct {
	log     klog.Logger
	pod     klog.ObjectRef
	url     string
	what    string // "Pod metrics scrape", "Listing the pod's models"
	failing bool
}

// failed logs err; consequence says what the failure leaves in place.
func (f *failureLog) failed(err error, consequence string) {
	if !f.failing {
		f.failing = true
		f.log.Info(f.what+" failed; "+consequence, "pod", f.pod, "url", f.url, "err", err)
	} else if v := f.log.V(4); v.Enabled() {
		v.Info(f.what+" failed again", "pod", f.pod, "err", err)
	}
}

// succeeded ends a run of failures.
func (f *failureLog) succeeded() {
	if f.failing {
		f.failing = false
		f.log.Info(f.what+" recovered", "pod", f.pod, "url", f.url)
	}
}
