package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// targetDirect sends requests straight to the engines, in turn.
const targetDirect = "direct"

// gatewayTarget names the gateway with a routing algorithm.
func gatewayTarget(algorithm string) string { return "gateway " + algorithm }

// baselineTarget names the baseline build of the gateway (-baseline) with
// a routing algorithm.
func baselineTarget(algorithm string) string { return "baseline " + algorithm }

// target is where a run sends its requests.
type target struct {
	name string
	// addrs are taken in turn by each client.
	addrs []string
	// pids are the processes whose CPU is the target's own; none for
	// direct.
	pids []int
	// header is extra request header lines (the gateway's
	// routing-strategy).
	header string
	// gateway marks the gateway, whose Server-Timing is read; adminURL is
	// where it serves its profiles.
	gateway  bool
	adminURL string
}

// sample is what one run measured.
type sample struct {
	requests, errors int
	firstErr         error
	elapsed          time.Duration
	latencies        []time.Duration
	// cpu is the CPU time used during the run by the target's processes,
	// the engines and the load generator.
	targetCPU, engineCPU, clientCPU time.Duration
	// timings are the gateway's Server-Timing metrics of the requests, by
	// name.
	timings map[string][]time.Duration
}

// runOptions shape a run.
type runOptions struct {
	warmup, duration time.Duration
	enginePIDs       []int
	// profile, when set, is the file that receives a CPU profile of the
	// measured time, taken from profileURL.
	profile, profileURL string
}

// run sends w's requests to t from c concurrent clients, each on keep-alive
// connections of its own, for o.warmup and then o.duration, measuring the
// latter.
func run(ctx context.Context, t target, w workload, c int, o runOptions) sample {
	var (
		stop, measuring atomic.Bool
		wg              sync.WaitGroup
		mu              sync.Mutex
		s               = sample{timings: map[string][]time.Duration{}}
		counter         atomic.Uint64
	)
	counter.Store(uint64(time.Now().UnixNano()) % 1e11 * 10)
	heads := make([][]byte, 0, len(t.addrs)*len(w.bodies))
	for _, addr := range t.addrs {
		for _, b := range w.bodies {
			heads = append(heads, requestHead(addr, w.path, len(b), t.header))
		}
	}
	counterAt := -1
	if w.unique {
		counterAt = bytes.Index(w.bodies[0], []byte(counterMark)) + len(counterMark)
	}
	for i := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := sample{timings: map[string][]time.Duration{}}
			conns := make([]*conn, len(t.addrs))
			defer func() {
				for _, cn := range conns {
					if cn != nil {
						cn.close()
					}
				}
				mu.Lock()
				s.requests += local.requests
				s.errors += local.errors
				if s.firstErr == nil {
					s.firstErr = local.firstErr
				}
				s.latencies = append(s.latencies, local.latencies...)
				for k, v := range local.timings {
					s.timings[k] = append(s.timings[k], v...)
				}
				mu.Unlock()
			}()
			bodies := w.bodies
			if w.unique {
				bodies = [][]byte{bytes.Clone(w.bodies[0])}
			}
			var res response
			parts := make([][]byte, 2)
			for n := i; !stop.Load() && ctx.Err() == nil; n++ {
				a, b := n%len(t.addrs), n/len(t.addrs)%len(bodies)
				if conns[a] == nil {
					cn, err := dial(t.addrs[a])
					if err != nil {
						local.fail(err, measuring.Load())
						time.Sleep(10 * time.Millisecond)
						continue
					}
					conns[a] = cn
				}
				if counterAt >= 0 {
					numberRequest(bodies[0], counterAt, counter.Add(1))
				}
				parts[0], parts[1] = heads[a*len(w.bodies)+b], bodies[b]
				start := time.Now()
				err := conns[a].do(parts, &res, t.gateway)
				lat := time.Since(start)
				switch {
				case err == nil && res.status != 200:
					err = fmt.Errorf("HTTP %d from %s", res.status, t.addrs[a])
				case err == nil && w.stream && !res.done:
					err = fmt.Errorf("a stream from %s did not end with [DONE]", t.addrs[a])
				}
				if err != nil {
					conns[a].close()
					conns[a] = nil
					local.fail(err, measuring.Load())
					continue
				}
				if measuring.Load() {
					local.requests++
					local.latencies = append(local.latencies, lat)
					if t.gateway {
						addTimings(local.timings, res.timing)
					}
				}
			}
		}()
	}
	sleep(ctx, o.warmup)
	before := cpuSnapshot(t, o)
	measuring.Store(true)
	start := time.Now()
	profiled := make(chan error, 1)
	if o.profile != "" {
		go func() { profiled <- saveProfile(ctx, o.profileURL, o.duration, o.profile) }()
	}
	sleep(ctx, o.duration)
	if o.profile != "" {
		if err := <-profiled; err != nil {
			fmt.Fprintln(os.Stderr, "bench-proxy: profile:", err)
		}
	}
	measuring.Store(false)
	s.elapsed = time.Since(start)
	after := cpuSnapshot(t, o)
	stop.Store(true)
	wg.Wait()
	s.targetCPU, s.engineCPU, s.clientCPU = after[0]-before[0], after[1]-before[1], after[2]-before[2]
	return s
}

func (s *sample) fail(err error, counted bool) {
	if counted {
		s.errors++
	}
	if s.firstErr == nil {
		s.firstErr = err
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// cpuSnapshot returns the CPU time used so far by the target's processes,
// the engines and this process.
func cpuSnapshot(t target, o runOptions) [3]time.Duration {
	var out [3]time.Duration
	var err error
	if out[0], err = cpuOf(t.pids); err == nil {
		if out[1], err = cpuOf(o.enginePIDs); err == nil {
			out[2], err = cpuOf([]int{os.Getpid()})
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-proxy: reading CPU times:", err)
	}
	return out
}

// addTimings adds the durations of the Server-Timing metrics in header
// (comma-separated name;dur=ms entries) to timings.
func addTimings(timings map[string][]time.Duration, header []byte) {
	for entry := range strings.SplitSeq(string(header), ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(entry), ";")
		if name == "" {
			continue
		}
		for p := range strings.SplitSeq(params, ";") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(p), "dur="); ok {
				if ms, err := strconv.ParseFloat(v, 64); err == nil {
					timings[name] = append(timings[name], time.Duration(ms*float64(time.Millisecond)))
				}
			}
		}
	}
}

// saveProfile writes the CPU profile url takes over d to path.
func saveProfile(ctx context.Context, url string, d time.Duration, path string) error {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"?seconds="+strconv.Itoa(secs), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// percentile returns the p-th percentile (0-100) of ds, sorting ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(p / 100 * float64(len(ds)-1))
	return ds[i]
}
