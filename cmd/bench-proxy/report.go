package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// caseKey names one cell of the benchmark: a workload at a concurrency
// through a target.
type caseKey struct {
	workload string
	c        int
	target   string
}

// stats are the medians over the rounds of one case.
type stats struct {
	rps                  float64
	p50, p99             time.Duration
	addedP50, addedP99   time.Duration
	hasAdded             bool
	targetCPU, engineCPU time.Duration // per request
	clientCPU            time.Duration // per request
	timings              map[string]time.Duration
	errors               int
	firstErr             error
}

// results collects the samples of every round.
type results struct {
	samples map[caseKey][]sample
}

func (r *results) add(k caseKey, s sample) {
	if r.samples == nil {
		r.samples = map[caseKey][]sample{}
	}
	r.samples[k] = append(r.samples[k], s)
}

// stats returns the medians of k's rounds, the latency it adds measured
// against direct's in the same round.
func (r *results) stats(k caseKey) stats {
	rounds := r.samples[k]
	direct := r.samples[caseKey{k.workload, k.c, targetDirect}]
	var rps, targetCPU, engineCPU, clientCPU []float64
	var p50s, p99s, added50, added99 []time.Duration
	timings := map[string][]time.Duration{}
	st := stats{timings: map[string]time.Duration{}}
	for i, s := range rounds {
		st.errors += s.errors
		if st.firstErr == nil {
			st.firstErr = s.firstErr
		}
		if s.requests == 0 {
			continue
		}
		n := float64(s.requests)
		rps = append(rps, n/s.elapsed.Seconds())
		targetCPU = append(targetCPU, float64(s.targetCPU)/n)
		engineCPU = append(engineCPU, float64(s.engineCPU)/n)
		clientCPU = append(clientCPU, float64(s.clientCPU)/n)
		p50, p99 := percentile(s.latencies, 50), percentile(s.latencies, 99)
		p50s, p99s = append(p50s, p50), append(p99s, p99)
		if i < len(direct) && direct[i].requests > 0 && k.target != targetDirect {
			added50 = append(added50, p50-percentile(direct[i].latencies, 50))
			added99 = append(added99, p99-percentile(direct[i].latencies, 99))
		}
		for name, ds := range s.timings {
			timings[name] = append(timings[name], percentile(ds, 50))
		}
	}
	st.rps = median(rps)
	st.targetCPU, st.engineCPU = time.Duration(median(targetCPU)), time.Duration(median(engineCPU))
	st.clientCPU = time.Duration(median(clientCPU))
	st.p50, st.p99 = medianDuration(p50s), medianDuration(p99s)
	if len(added50) > 0 {
		st.hasAdded = true
		st.addedP50, st.addedP99 = medianDuration(added50), medianDuration(added99)
	}
	for name, ds := range timings {
		st.timings[name] = medianDuration(ds)
	}
	return st
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianDuration(ds []time.Duration) time.Duration {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d)
	}
	if len(xs) == 0 {
		return 0
	}
	return time.Duration(median(xs))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }
func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)) }

// printReport writes the benchmark's tables in Markdown.
func printReport(w io.Writer, r *results, wls []workload, hasProxy map[string]bool) {
	for _, wl := range wls {
		fmt.Fprintf(w, "\n#### %s\n\n", wl.title)
		fmt.Fprintln(w, "| clients | through | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | CPU µs/req | engines' CPU µs/req | Server-Timing p50 ms |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
		for _, c := range wl.concurrency {
			for _, t := range wl.targets {
				k := caseKey{wl.name, c, t}
				if _, ok := r.samples[k]; !ok {
					continue
				}
				st := r.stats(k)
				added50, added99, cpu := "—", "—", "—"
				if st.hasAdded {
					added50, added99 = ms(st.addedP50), ms(st.addedP99)
				}
				if t != targetDirect {
					cpu = us(st.targetCPU)
				}
				fmt.Fprintf(w, "| %d | %s | %.0f | %s | %s | %s | %s | %s | %s | %s |\n", c, t, st.rps, ms(st.p50), ms(st.p99),
					added50, added99, cpu, us(st.engineCPU), formatTimings(st.timings))
				if st.errors > 0 {
					fmt.Fprintf(w, "|   | %d errors, the first: %v |\n", st.errors, st.firstErr)
				}
			}
		}
	}
	printGoals(w, r, wls, hasProxy)
	printBaseline(w, r, wls)
}

// printBaseline compares the gateway with its baseline build, where one was
// measured: the median over the rounds of each round's ratio, the two runs
// of a round being back to back.
func printBaseline(w io.Writer, r *results, wls []workload) {
	header := false
	for _, wl := range wls {
		for _, c := range wl.concurrency {
			for _, t := range wl.targets {
				alg, ok := strings.CutPrefix(t, gatewayTarget(""))
				if !ok {
					continue
				}
				cpu, rps := r.paired(caseKey{wl.name, c, t}, caseKey{wl.name, c, baselineTarget(alg)})
				if len(cpu) == 0 {
					continue
				}
				if !header {
					fmt.Fprintln(w, "\n#### This build against the baseline (medians of each round's ratio)")
					fmt.Fprintln(w)
					header = true
				}
				fmt.Fprintf(w, "- %s, c=%d, %s: CPU/request %.3fx the baseline's (rounds: %s), req/s %.3fx\n",
					wl.name, c, alg, median(cpu), ratios(cpu), median(rps))
			}
		}
	}
}

// paired returns, for each round that measured both a and b, a's CPU per
// request over b's and a's requests per second over b's: the two runs of a
// round are close in time, so the ratios do not move with what the machine
// does from one round to the next, as a ratio of medians would.
func (r *results) paired(a, b caseKey) (cpu, rps []float64) {
	as, bs := r.samples[a], r.samples[b]
	for i := range min(len(as), len(bs)) {
		x, y := as[i], bs[i]
		if x.requests > 0 && y.requests > 0 && y.targetCPU > 0 && y.elapsed > 0 && x.elapsed > 0 {
			xn, yn := float64(x.requests), float64(y.requests)
			cpu = append(cpu, float64(x.targetCPU)/xn/(float64(y.targetCPU)/yn))
			rps = append(rps, xn/x.elapsed.Seconds()/(yn/y.elapsed.Seconds()))
		}
	}
	return cpu, rps
}

// ratios formats each round's ratio.
func ratios(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.3f", x)
	}
	return strings.Join(parts, " ")
}

// formatTimings lists the Server-Timing medians, by name.
func formatTimings(t map[string]time.Duration) string {
	if len(t) == 0 {
		return "—"
	}
	names := make([]string, 0, len(t))
	for n := range t {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, n+" "+ms(t[n]))
	}
	return strings.Join(parts, ", ")
}

// printGoals compares the gateway with the proxies as the gateway's
// performance goals read, each ratio the median over the rounds of the
// round's own (see paired).
func printGoals(w io.Writer, r *results, wls []workload, hasProxy map[string]bool) {
	fmt.Fprintln(w, "\n#### The gateway against its goals (medians of each round's ratio)")
	fmt.Fprintln(w)
	for _, wl := range wls {
		for _, c := range wl.concurrency {
			key := func(target string) caseKey { return caseKey{wl.name, c, target} }
			switch wl.name {
			case wlCompletions:
				if !hasProxy["nginx"] {
					continue
				}
				for _, alg := range []string{"random", "least-request"} {
					cpu, rps := r.paired(key(gatewayTarget(alg)), key("nginx"))
					if len(cpu) > 0 {
						fmt.Fprintf(w, "- %s, c=%d, %s: CPU/request %.2fx nginx's (goal ≤ 1.5x; rounds: %s), req/s %.2fx nginx's (goal ≥ 1x; rounds: %s)\n",
							wl.name, c, alg, median(cpu), ratios(cpu), median(rps), ratios(rps))
					}
				}
			case wlStream:
				if !hasProxy["haproxy"] {
					continue
				}
				if cpu, _ := r.paired(key(gatewayTarget("least-request")), key("haproxy")); len(cpu) > 0 {
					fmt.Fprintf(w, "- %s, c=%d: CPU/request %.2fx haproxy's (goal ≤ 1x; rounds: %s)\n", wl.name, c, median(cpu), ratios(cpu))
				}
			case wlKVSeen, wlKVNew:
				cpu, rps := r.paired(key(gatewayTarget("kv-aware")), key(gatewayTarget("least-request")))
				if len(cpu) == 0 {
					continue
				}
				goal := ""
				if wl.name == wlKVSeen {
					goal = "goal ≤ 1.2x; "
				}
				fmt.Fprintf(w, "- %s, c=%d: kv-aware's CPU/request %.2fx least-request's (%srounds: %s), req/s %.2fx\n",
					wl.name, c, median(cpu), goal, ratios(cpu), median(rps))
			}
		}
	}
}
