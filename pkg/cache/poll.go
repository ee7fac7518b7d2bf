package cache

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
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

// getBody GETs url with the Accept header accept within timeout and reads
// the body, at most limit bytes, into buf. Any status but 200 is an error.
// Errors name the URL.
func getBody(ctx context.Context, client *http.Client, url, accept string, timeout time.Duration, limit int64, buf *bytes.Buffer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("build request for %s: %w", url, err)
	}
	req.Header.Set("Accept", accept)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("GET %s: HTTP status %s", url, resp.Status)
	}
	buf.Reset()
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return fmt.Errorf("GET %s: read body: %w", url, err)
	}
	if n > limit {
		return fmt.Errorf("GET %s: body exceeds %d bytes", url, limit)
	}
	return nil
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
