package routingbench

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// sweepColumns are the columns of a sweep point's table: a header and how
// to print a policy's summary.
var sweepColumns = []struct {
	head string
	cell func(*PolicySummary) string
}{
	{"hit ratio", func(p *PolicySummary) string { return spreadCell(p.HitRatio, 3) }},
	{"of bound", func(p *PolicySummary) string { return spreadCell(p.HitRatioOfBound, 3) }},
	{"TTFT p50", func(p *PolicySummary) string { return spreadCell(p.TTFTP50, 2) }},
	{"TTFT p90", func(p *PolicySummary) string { return spreadCell(p.TTFTP90, 2) }},
	{"E2E p90", func(p *PolicySummary) string { return spreadCell(p.E2EP90, 2) }},
	{"preempted", func(p *PolicySummary) string { return spreadCell(p.Preemptions, 0) }},
	{"req spread", func(p *PolicySummary) string { return spreadCell(p.RequestsSpread, 2) }},
}

// spreadCell prints a spread as "mean [min, max]", or the mean alone when
// every seed agrees.
func spreadCell(s Spread, digits int) string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', digits, 64) }
	if f(s.Min) == f(s.Max) {
		return f(s.Mean)
	}
	return f(s.Mean) + " [" + f(s.Min) + ", " + f(s.Max) + "]"
}

// title names a sweep point.
func (pt *SweepPoint) title() string {
	seeds := make([]string, len(pt.Seeds))
	for i, s := range pt.Seeds {
		seeds[i] = strconv.FormatUint(s, 10)
	}
	load := "at its own rate"
	if pt.Load > 0 {
		load = fmt.Sprintf("at %gx the fleet's capacity", pt.Load)
	}
	return fmt.Sprintf("%s %s on %d engines, seeds %s", pt.Workload, load, pt.Engines, strings.Join(seeds, ", "))
}

// WriteTable writes each point of the sweep as text: a title, the pooled
// bound, a row per policy with the mean of each measure over the seeds and
// its range in brackets (latencies in seconds), and kv-aware's targets.
func (sw *Sweep) WriteTable(w io.Writer) error {
	for i, pt := range sw.Points {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s\npooled bound: hit ratio %s\n", pt.title(), spreadCell(pt.Bound, 3))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "policy\t")
		for _, c := range sweepColumns {
			fmt.Fprint(tw, c.head, "\t")
		}
		fmt.Fprintln(tw)
		for j := range pt.Policies {
			p := &pt.Policies[j]
			fmt.Fprint(tw, p.Policy, "\t")
			for _, c := range sweepColumns {
				fmt.Fprint(tw, c.cell(p), "\t")
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, t := range pt.Targets {
			fmt.Fprintf(w, "target %-55s %s: %s against %s\n", t.Name, verdict(t.Met), spreadCell(t.Value, 3), spreadCell(t.Bound, 3))
		}
	}
	return nil
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "MISSED"
}

// WriteMarkdown writes each point of the sweep as a Markdown table, as
// WriteTable does in text.
func (sw *Sweep) WriteMarkdown(w io.Writer) error {
	for i, pt := range sw.Points {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "**%s**; pooled bound %s.\n\n| policy |", pt.title(), spreadCell(pt.Bound, 3))
		for _, c := range sweepColumns {
			fmt.Fprintf(w, " %s |", c.head)
		}
		fmt.Fprint(w, "\n|---|")
		for range sweepColumns {
			fmt.Fprint(w, "---:|")
		}
		fmt.Fprintln(w)
		for j := range pt.Policies {
			p := &pt.Policies[j]
			fmt.Fprintf(w, "| %s |", p.Policy)
			for _, c := range sweepColumns {
				fmt.Fprintf(w, " %s |", c.cell(p))
			}
			fmt.Fprintln(w)
		}
		var missed []string
		for _, t := range pt.Targets {
			if !t.Met {
				missed = append(missed, t.Name)
			}
		}
		if len(missed) == 0 {
			fmt.Fprintf(w, "\nkv-aware meets its %d targets at every seed.\n", len(pt.Targets))
		} else {
			fmt.Fprintf(w, "\nkv-aware misses: %s.\n", strings.Join(missed, "; "))
		}
	}
	return nil
}

// WriteJSON writes the sweep's points and summaries as indented JSON.
func (sw *Sweep) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(sw)
}
