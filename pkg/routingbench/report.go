package routingbench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvgate/kvgate/pkg/routing"
)

// Target is one of the routing-quality targets kv-aware is held to, as
// measured in a report.
type Target struct {
	// Name states the target.
	Name string `json:"name"`
	// Value is kv-aware's measure; Bound the value the target allows (the
	// least for a hit ratio, the most for a latency).
	Value float64 `json:"value"`
	Bound float64 `json:"bound"`
	// Ratio is Value over the reference measure the bound derives from, 0
	// when that measure is 0.
	Ratio float64 `json:"ratio"`
	Met   bool    `json:"met"`
}

// Targets checks kv-aware against the targets it is held to:
//   - at the fleet's capacity (a report at load 1, see AtLoad), a token hit
//     ratio at least 90% of the pooled bound's;
//   - a p90 time to first token and a p90 end-to-end latency no worse than
//     the best of the other policies' (the TTFT oracle, which no gateway
//     can run, aside);
//   - at most twice the TTFT oracle's preemptions;
//   - requests per engine within 25% of the mean of the engines of the same
//     speed.
//
// A target whose reference the report lacks is left out.
func (r *Report) Targets() []Target {
	kv := r.Result(routing.KVAware)
	if kv == nil {
		return nil
	}
	var ts []Target
	add := func(name string, value, ref, factor float64, atLeast bool) {
		t := Target{Name: name, Value: value, Bound: factor * ref, Met: value <= factor*ref}
		if atLeast {
			t.Met = value >= t.Bound
		}
		if ref != 0 {
			t.Ratio = value / ref
		}
		ts = append(ts, t)
	}
	if r.Load == 1 && r.Bound != nil {
		add("kv-aware hit ratio >= 0.9 x pooled bound", kv.HitRatio, r.Bound.HitRatio, 0.9, true)
	}
	var bestTTFT, bestE2E *PolicyResult
	for _, res := range r.Results {
		if res.Policy == routing.KVAware || res.Policy == TTFTOracle {
			continue
		}
		if bestTTFT == nil || res.TTFT.P90 < bestTTFT.TTFT.P90 {
			bestTTFT = res
		}
		if bestE2E == nil || res.E2E.P90 < bestE2E.E2E.P90 {
			bestE2E = res
		}
	}
	if bestTTFT != nil {
		add("kv-aware p90 TTFT <= best other's ("+bestTTFT.Policy+")", kv.TTFT.P90, bestTTFT.TTFT.P90, 1, false)
		add("kv-aware p90 E2E <= best other's ("+bestE2E.Policy+")", kv.E2E.P90, bestE2E.E2E.P90, 1, false)
	}
	if or := r.Result(TTFTOracle); or != nil {
		add("kv-aware preemptions <= 2 x ttft-oracle's", float64(kv.Preemptions), float64(or.Preemptions), 2, false)
	}
	ts = append(ts, Target{Name: "kv-aware requests per engine within 25% of its peers'", Value: kv.RequestsSpread,
		Bound: maxRequestsSpread, Ratio: kv.RequestsSpread / maxRequestsSpread, Met: kv.RequestsSpread <= maxRequestsSpread})
	return ts
}

// maxRequestsSpread is the largest relative deviation of an engine's
// requests from its identical peers' mean that the targets allow.
const maxRequestsSpread = 0.25

// columns of the table and the CSV: a header and how to print a result.
var columns = []struct {
	head, csvHead string
	cell          func(*PolicyResult) string
}{
	{"policy", "policy", func(r *PolicyResult) string { return r.Policy }},
	{"hit ratio", "hit_ratio", func(r *PolicyResult) string { return ratio(r.HitRatio) }},
	{"of bound", "hit_ratio_of_bound", func(r *PolicyResult) string { return ratio(r.HitRatioOfBound) }},
	{"hits found", "predicted_hits_found", func(r *PolicyResult) string { return ratio(r.PredictedHitsFound) }},
	{"TTFT p50", "ttft_p50_s", func(r *PolicyResult) string { return seconds(r.TTFT.P50) }},
	{"TTFT p90", "ttft_p90_s", func(r *PolicyResult) string { return seconds(r.TTFT.P90) }},
	{"TTFT p99", "ttft_p99_s", func(r *PolicyResult) string { return seconds(r.TTFT.P99) }},
	{"TTFT mean", "ttft_mean_s", func(r *PolicyResult) string { return seconds(r.TTFT.Mean) }},
	{"queue mean", "queue_mean_s", func(r *PolicyResult) string { return seconds(r.Queue.Mean) }},
	{"queue p90", "queue_p90_s", func(r *PolicyResult) string { return seconds(r.Queue.P90) }},
	{"E2E p90", "e2e_p90_s", func(r *PolicyResult) string { return seconds(r.E2E.P90) }},
	{"req CV", "requests_cv", func(r *PolicyResult) string { return ratio(r.RequestsCV) }},
	{"req spread", "requests_spread", func(r *PolicyResult) string { return ratio(r.RequestsSpread) }},
	{"prefill CV", "prefill_cv", func(r *PolicyResult) string { return ratio(r.PrefillCV) }},
	{"req/s", "requests_per_s", func(r *PolicyResult) string { return strconv.FormatFloat(r.RequestsPerSecond, 'f', 2, 64) }},
	{"out tok/s", "output_tokens_per_s", func(r *PolicyResult) string { return strconv.FormatFloat(r.OutputTokensPerSecond, 'f', 0, 64) }},
	{"preempted", "preemptions", func(r *PolicyResult) string { return strconv.Itoa(r.Preemptions) }},
	{"rejected", "rejected", func(r *PolicyResult) string { return strconv.Itoa(r.Rejected) }},
}

func ratio(v float64) string   { return strconv.FormatFloat(v, 'f', 3, 64) }
func seconds(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

// WriteTable writes the report as text: the workload and setup, a table
// with one row per policy (latencies in seconds), and the targets.
func (r *Report) WriteTable(w io.Writer) error {
	s, st := r.Setup, r.Stats
	fmt.Fprintf(w, "workload %s: %d requests, %d prompt tokens, %d output tokens, %.0f s",
		r.Workload, st.Requests, st.PromptTokens, st.OutputTokens, st.Duration.Seconds())
	if r.Load > 0 {
		fmt.Fprintf(w, ", %g x the fleet's capacity", r.Load)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "fleet: %d engines x %d KV blocks of %d tokens (%d tokens each), batches of %d tokens; speeds %s\n",
		s.Engines, s.NumGPUBlocks, s.BlockSize, (s.NumGPUBlocks-1)*s.BlockSize, s.MaxNumBatchedTokens, speedList(s.Speeds))
	fmt.Fprintf(w, "step %.1f ms + %.0f us/prefill token + %.2f ns per token it attends to + %.0f us/decode token + %.0f ns per token of its context\n",
		s.StepOverhead*1e3, s.PrefillPerToken*1e6, s.AttentionPerContextToken*1e9, s.DecodePerToken*1e6, s.DecodePerContextToken*1e9)
	fmt.Fprintf(w, "scrape every %.0f ms; events after %.0f ms + %.0f ms on average, %.1f%% lost; routers assume %.0f prefill tokens/s until measured "+
		"and at least %g prefills queued on every pod; seed %d\n",
		s.ScrapeInterval*1e3, s.EventDelay*1e3, s.EventJitter*1e3, s.EventLossRate*100, s.RouterPrefillSpeed, s.RouterMinFleetQueue, s.Seed)
	if r.Bound != nil {
		fmt.Fprintf(w, "pooled bound: hit ratio %.3f with one LRU cache of %d blocks\n", r.Bound.HitRatio, r.Bound.Blocks)
	}
	if t := r.Tokenization; t != nil {
		how := "from the engines' /tokenize"
		if t.InProcess {
			how = "in process"
		}
		fmt.Fprintf(w, "gateway tokenization (%s, %s): %d of %d prompts as the engines tokenize them, %d a prefix of theirs, %d different\n",
			t.Tokenizer, how, t.Equal, t.Requests, t.Prefix, t.Differ)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for i, c := range columns {
		fmt.Fprint(tw, c.head, sep(i, len(columns)))
	}
	for _, res := range r.Results {
		for i, c := range columns {
			fmt.Fprint(tw, c.cell(res), sep(i, len(columns)))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	writeTargets(w, r.Targets(), 44)
	return nil
}

// writeTargets writes one line per target, its name padded to width.
func writeTargets(w io.Writer, targets []Target, width int) {
	for _, t := range targets {
		verdict := "MISSED"
		if t.Met {
			verdict = "met"
		}
		fmt.Fprintf(w, "target %-*s %s: %.3f against a bound of %.3f (ratio %.3f)\n", width, t.Name, verdict, t.Value, t.Bound, t.Ratio)
	}
}

// speedList formats engine speeds, "1" for none.
func speedList(speeds []float64) string {
	if len(speeds) == 0 {
		return "1"
	}
	parts := make([]string, len(speeds))
	for i, v := range speeds {
		parts[i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return strings.Join(parts, ",")
}

// sep ends cell i of a table row of n cells.
func sep(i, n int) string {
	if i == n-1 {
		return "\t\n"
	}
	return "\t"
}

// WriteCSV writes one row per policy, latencies in seconds, after a header
// row.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	row := make([]string, len(columns)+1)
	row[0] = "workload"
	for i, c := range columns {
		row[i+1] = c.csvHead
	}
	if err := cw.Write(row); err != nil {
		return err
	}
	for _, res := range r.Results {
		row[0] = r.Workload
		for i, c := range columns {
			row[i+1] = c.cell(res)
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteJSON writes the report, its targets included, as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		*Report
		Targets []Target `json:"targets"`
	}{r, r.Targets()})
}
