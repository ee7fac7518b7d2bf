package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/localfleet"
)

// resetTimeout bounds resetting the engines' caches between runs.
const resetTimeout = time.Minute

// demo runs the workload through a fleet with each algorithm in turn.
type demo struct {
	opts   options
	out    io.Writer
	fleet  *localfleet.Fleet
	work   *workload
	client chatClient
	pods   []string
}

// errRequestsFailed reports a run in which requests failed.
var errRequestsFailed = errors.New("requests failed")

// runAll runs every algorithm and prints the comparison. It fails when the
// fleet fails, ctx ends, or a run's requests failed (after the table).
func (d *demo) runAll(ctx context.Context) error {
	var runs []runResult
	for i, alg := range d.opts.algorithms {
		fmt.Fprintf(d.out, "\n== %s (%d of %d): %v of load ==\n", alg, i+1, len(d.opts.algorithms), d.opts.phase)
		r, err := d.runOne(ctx, alg)
		if err != nil {
			return fmt.Errorf("%s: %w", alg, err)
		}
		runs = append(runs, r)
	}
	fmt.Fprintf(d.out, "\n== comparison: the same workload (seed %d) for %v under each algorithm, caches reset in between ==\n\n",
		d.opts.chats.Seed, d.opts.phase)
	printComparison(d.out, runs)
	var errs []error
	for _, r := range runs {
		if s := r.summary; s.errors > 0 {
			errs = append(errs, fmt.Errorf("%s: %d %w, the last: %w", r.algorithm, s.errors, errRequestsFailed, s.lastErr))
		} else if s.requests == 0 && s.refused == 0 {
			errs = append(errs, fmt.Errorf("%s: no request completed", r.algorithm))
		}
	}
	return errors.Join(errs...)
}

// runOne resets the engines' caches, runs the users for the phase's
// duration with alg, printing the live summary, and lets the requests in
// flight finish.
func (d *demo) runOne(ctx context.Context, alg string) (runResult, error) {
	rctx, cancel := context.WithTimeout(ctx, resetTimeout)
	err := d.fleet.ResetPrefixCaches(rctx)
	cancel()
	if err != nil {
		return runResult{}, fmt.Errorf("reset the engines' caches: %w", err)
	}
	before, err := scrapeAllCounts(ctx, d.client.http, d.fleet.GatewayURLs())
	if err != nil {
		return runResult{}, err
	}
	d.work.restart()
	start := time.Now()
	rec := newRecorder(start)
	// reqCtx ends the requests in flight on failure or Ctrl-C; stop ends
	// the users' turns when the phase is over.
	reqCtx, cancelReqs := context.WithCancelCause(ctx)
	defer cancelReqs(nil)
	stop := make(chan struct{})
	var users sync.WaitGroup
	for i := range d.opts.users {
		delay := time.Duration(i) * rampUp(d.opts.phase) / time.Duration(d.opts.users)
		goSafe(&users, cancelReqs, func() { d.user(reqCtx, stop, delay, alg, rec) })
	}
	usersDone := make(chan struct{})
	go func() {
		users.Wait()
		close(usersDone)
	}()
	err = d.watch(reqCtx, alg, rec, before, start.Add(d.opts.phase), stop, usersDone)
	if err != nil {
		cancelReqs(err)
		<-usersDone
		return runResult{}, err
	}
	return runResult{algorithm: alg, summary: rec.summarize(time.Now(), d.pods), slo: d.opts.sloTTFT, overload: d.opts.overload}, nil
}

// slo returns what the live summary shows of the SLO with -overload: the
// objective, and the requests waiting in the gateway's queues (negative
// when unknown); nil without -overload.
func (d *demo) slo(queued float64) *sloLive {
	if !d.opts.overload {
		return nil
	}
	return &sloLive{ttft: d.opts.sloTTFT, queued: queued}
}

// watch prints the live summary every interval until the phase ends
// (closing stop) and the users are done, and fails when the fleet fails,
// ctx ends, or the requests in flight outlast the drain timeout.
func (d *demo) watch(ctx context.Context, alg string, rec *recorder, before gatewayCounts, end time.Time,
	stop chan struct{}, usersDone <-chan struct{}) error {
	tick := time.NewTicker(d.opts.interval)
	defer tick.Stop()
	phase := time.NewTimer(time.Until(end))
	defer phase.Stop()
	var drain <-chan time.Time
	lastCount, lastAt := 0, time.Now()
	for {
		select {
		case <-tick.C:
			now := time.Now()
			s := rec.summarize(now, d.pods)
			rate := float64(s.requests-lastCount) / now.Sub(lastAt).Seconds()
			lastCount, lastAt = s.requests, now
			var decided []decisionCount
			queued, found := -1.0, math.NaN()
			if cur, err := scrapeAllCounts(ctx, d.client.http, d.fleet.GatewayURLs()); err == nil {
				decided, queued, found = cur.decisions.since(before.decisions), cur.queued, cur.foundSince(before)
			}
			printLive(d.out, alg, s, rate, decided, found, d.slo(queued))
		case <-phase.C:
			close(stop)
			s := rec.summarize(time.Now(), d.pods)
			if s.inFlight > 0 {
				fmt.Fprintf(d.out, "%-*s letting %d requests in flight finish\n", labelWidth, alg, s.inFlight)
			}
			drain = time.After(d.opts.drain)
		case <-usersDone:
			// Before the phase ends, the users stop early only when ctx
			// ended or the workload ran out.
			if err := context.Cause(ctx); err != nil || drain != nil {
				return err
			}
			fmt.Fprintf(d.out, "%-*s every conversation of the workload was held: the run ends early\n", labelWidth, alg)
			return nil
		case <-drain:
			return fmt.Errorf("requests still in flight %v after the run ended", d.opts.drain)
		case <-d.fleet.Failed():
			return d.fleet.Err()
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// rampUp is how long the users take to arrive at the start of a run, so
// that they do not all send their first request at once.
func rampUp(phase time.Duration) time.Duration { return min(5*time.Second, phase/8) }

// user is one simulated user: after delay, it holds conversations one at a
// time, turn after turn with its think time in between, until stop is
// closed or the workload runs out. A failed request ends its conversation.
func (d *demo) user(ctx context.Context, stop <-chan struct{}, delay time.Duration, alg string, rec *recorder) {
	if !pause(ctx, stop, delay) {
		return
	}
	for {
		conv, ok := d.work.conversation()
		if !ok {
			return
		}
		dlg := d.work.startDialog(conv)
		for !dlg.done() {
			if !pause(ctx, stop, dlg.thinkTime()) {
				return
			}
			messages, maxTokens, err := dlg.nextTurn()
			if err != nil {
				rec.begin()
				rec.fail(err)
				break
			}
			rec.begin()
			res, err := d.client.send(ctx, alg, messages, maxTokens)
			var refused *refusedError
			switch {
			case err == nil:
			case ctx.Err() != nil:
				rec.fail(context.Cause(ctx))
				return
			case errors.As(err, &refused):
				// The user gives up the conversation and starts another
				// after the Retry-After the gateway asked for.
				rec.refuse()
				if !pause(ctx, stop, refused.retryAfter) {
					return
				}
			default:
				rec.fail(err)
			}
			if err != nil {
				break
			}
			rec.end(res)
			dlg.answered(res.answer, res.answerID)
		}
	}
}

// pause waits for d, and reports false when stop is closed or ctx ends
// first (or had already).
func pause(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	select {
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	default:
	}
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	}
}

// goSafe runs fn on a goroutine counted by wg; a panic in fn is turned into
// an error, with its stack, passed to fail, so that the demo tears its
// processes down rather than crash past its deferred cleanup.
func goSafe(wg *sync.WaitGroup, fail func(error), fn func()) {
	wg.Go(func() {
		defer func() {
			if r := recover(); r != nil {
				fail(fmt.Errorf("panic: %v\n%s", r, debug.Stack()))
			}
		}()
		fn()
	})
}

// newHTTPClient returns the users' HTTP client: keep-alive connections
// for every user, no compression (the gateway relays streams as they come).
func newHTTPClient(users int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: users + 4,
		DisableCompression:  true,
		IdleConnTimeout:     90 * time.Second,
	}}
}
