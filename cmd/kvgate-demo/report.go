package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/gateway"
)

// runResult is what one algorithm's run measured.
type runResult struct {
	algorithm string
	summary   summary
	// overload tells a run of -overload, whose requests had the objective
	// slo.
	overload bool
	slo      time.Duration
}

// sloLive is what the live summary of a run of -overload adds: the
// requests' objective, and how many wait in the gateway's SLO queues
// (negative when the gateway's metrics could not be read).
type sloLive struct {
	ttft   time.Duration
	queued float64
}

// fmtDuration formats a latency for the summary: milliseconds below a
// second, seconds with two decimals above.
func fmtDuration(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// timingParts are the gateway's Server-Timing metrics the table shows, in
// order: its own time, then its phases, then the whole.
var timingParts = []string{gateway.ServerTimingGateway, "read", "tokenize", "route", "upstream", "relay", "total"}

// printOverheads writes the gateway's time per request in each run, by
// part, from its Server-Timing.
func printOverheads(w io.Writer, runs []runResult) {
	if !slices.ContainsFunc(runs, func(r runResult) bool { return r.summary.timing[gateway.ServerTimingGateway].ok }) {
		return
	}
	fmt.Fprintln(w, "\nThe gateway's time per request, p50 / p99 in ms (its Server-Timing, from the request's first byte read to")
	fmt.Fprintln(w, "its last byte written): its own time up to the stream's first byte, then each part.")
	fmt.Fprintf(w, "%-22s", "algorithm")
	for _, part := range timingParts {
		fmt.Fprintf(w, " %15s", part)
	}
	fmt.Fprintln(w)
	for _, r := range runs {
		fmt.Fprintf(w, "%-22s", r.algorithm)
		for _, part := range timingParts {
			cell := "-"
			if p := r.summary.timing[part]; p.ok {
				cell = fmtMs(p.p50) + " / " + fmtMs(p.p99)
			}
			fmt.Fprintf(w, " %15s", cell)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "  read: the request read and checked; tokenize: its prompt tokenized, in process with the model's")
	fmt.Fprintln(w, "  tokenizer files or by the engines' /tokenize, whose tokens of earlier turns answer a follow-up turn at")
	fmt.Fprintln(w, "  once (only the algorithms that read the prompt tokenize it); route: the pod chosen and sent the")
	fmt.Fprintln(w, "  request; upstream: the engine's time to its first byte; relay: the stream, the engine's generation")
	fmt.Fprintln(w, "  included, to its last byte; total: the whole.")
}

// fmtMs formats a duration in milliseconds to three significant digits
// at most, two decimals below 10 ms.
func fmtMs(d time.Duration) string {
	ms := float64(d.Microseconds()) / 1000
	switch {
	case ms >= 100:
		return fmt.Sprintf("%.0f", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.2f", ms)
}

// fmtRatio formats a hit ratio, "-" when nothing was measured.
func fmtRatio(r float64) string {
	if math.IsNaN(r) {
		return "-"
	}
	return fmt.Sprintf("%.2f", r)
}

// fmtPercent formats a share as a percentage, "-" when nothing was
// measured.
func fmtPercent(r float64) string {
	if math.IsNaN(r) {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*r)
}

// fmtTTFT formats a run's TTFT percentiles.
func fmtTTFT(p percentiles) string {
	if !p.ok {
		return "TTFT -"
	}
	return fmt.Sprintf("TTFT p50 %s  p90 %s", fmtDuration(p.p50), fmtDuration(p.p90))
}

// labelWidth aligns the live summary's continuation lines.
const labelWidth = 15

// printLive writes the live summary of a run: its progress, the requests
// per second since the previous summary (rate), each pod's hit ratio and
// requests, the gateway's decisions, and the share of the cached tokens
// routing counted on that the engines found (found, NaN when unknown).
func printLive(w io.Writer, alg string, s summary, rate float64, decided []decisionCount, found float64, slo *sloLive) {
	fmt.Fprintf(w, "%-*s %4.0fs  %5.1f req/s  %5d done  %3d in flight  hit %s  %s",
		labelWidth, alg, s.elapsed.Seconds(), rate, s.requests, s.inFlight, fmtRatio(s.hit()), fmtTTFT(s.ttft))
	if s.errors > 0 {
		fmt.Fprintf(w, "  errors %d", s.errors)
	}
	fmt.Fprintln(w)
	if slo != nil {
		queued := "-"
		if slo.queued >= 0 {
			queued = fmt.Sprintf("%.0f", slo.queued)
		}
		fmt.Fprintf(w, "%*s SLO (TTFT %v): %s met, %.1f req/s within it; %s queued in the gateway, %d refused (429)\n",
			labelWidth, "", slo.ttft, fmtPercent(s.attainment(slo.ttft)), s.goodput(slo.ttft), queued, s.refused)
	}
	var pods strings.Builder
	for _, p := range s.pods {
		_, name, _ := strings.Cut(p.pod, "/")
		fmt.Fprintf(&pods, "  %s %s (%d)", name, fmtRatio(p.hit()), p.requests)
	}
	fmt.Fprintf(w, "%*s pods:%s\n", labelWidth, "", pods.String())
	fmt.Fprintf(w, "%*s decisions: %s\n", labelWidth, "", fmtDecisions(decided))
	fmt.Fprintf(w, "%*s predicted cache hits the engines found: %s\n", labelWidth, "", fmtRatio(found))
}

// fmtDecisions formats decision counts as "algorithm: outcome n, ...".
func fmtDecisions(ds []decisionCount) string {
	if len(ds) == 0 {
		return "none yet"
	}
	var b strings.Builder
	for i, d := range ds {
		switch {
		case i == 0:
			fmt.Fprintf(&b, "%s: ", d.algorithm)
		case d.algorithm != ds[i-1].algorithm:
			fmt.Fprintf(&b, "; %s: ", d.algorithm)
		default:
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.0f", d.outcome, d.count)
	}
	return b.String()
}

// printComparison writes the final table, one row per run, and how the
// first run compares with the last.
func printComparison(w io.Writer, runs []runResult) {
	overload := len(runs) > 0 && runs[0].overload
	fmt.Fprintf(w, "%-22s %8s %7s %9s %9s %9s %9s %6s", "algorithm", "requests", "req/s", "hit ratio", "TTFT p50", "TTFT p90", "TTFT p99", "errors")
	if overload {
		fmt.Fprintf(w, " %7s %7s %7s", "refused", "SLO met", "goodput")
	}
	fmt.Fprintln(w)
	for _, r := range runs {
		s := r.summary
		p50, p90, p99 := "-", "-", "-"
		if s.ttft.ok {
			p50, p90, p99 = fmtDuration(s.ttft.p50), fmtDuration(s.ttft.p90), fmtDuration(s.ttft.p99)
		}
		fmt.Fprintf(w, "%-22s %8d %7.1f %9s %9s %9s %9s %6d",
			r.algorithm, s.requests, s.perSecond(), fmtRatio(s.hit()), p50, p90, p99, s.errors)
		if overload {
			fmt.Fprintf(w, " %7d %7s %7.1f", s.refused, fmtPercent(s.attainment(r.slo)), s.goodput(r.slo))
		}
		fmt.Fprintln(w)
	}
	if slices.ContainsFunc(runs, func(r runResult) bool { return r.summary.requests > 0 && math.IsNaN(r.summary.hit()) }) {
		fmt.Fprintln(w, "hit ratio -: the engines reported no cached tokens (the usage of Anthropic's Messages API has none).")
	}
	if overload {
		fmt.Fprintf(w, "SLO met: the share of the requests answered (served or refused) whose first token came within %v;\n",
			runs[0].slo)
		fmt.Fprintln(w, "  goodput: those requests per second. A refused user gives up its conversation and starts another")
		fmt.Fprintln(w, "  after the gateway's Retry-After.")
	}
	printOverheads(w, runs)
	if len(runs) < 2 {
		return
	}
	a, b := runs[0], runs[len(runs)-1]
	if !a.summary.ttft.ok || !b.summary.ttft.ok || a.summary.ttft.p90 == 0 || b.summary.perSecond() == 0 {
		return
	}
	hits := ""
	if !math.IsNaN(a.summary.hit()) || !math.IsNaN(b.summary.hit()) {
		hits = fmt.Sprintf("hit ratio %s vs %s, ", fmtRatio(a.summary.hit()), fmtRatio(b.summary.hit()))
	}
	fmt.Fprintf(w, "\n%s vs %s: %sTTFT p90 %.1fx lower, %.2fx the requests per second.\n",
		a.algorithm, b.algorithm, hits, float64(b.summary.ttft.p90)/float64(a.summary.ttft.p90), a.summary.perSecond()/b.summary.perSecond())
}
