package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/routingbench"
	"github.com/kvgate/kvgate/pkg/sim"
)

func TestDialogSendsTheWorkloadsTokens(t *testing.T) {
	cfg := routingbench.SharedPrefixConfig{Groups: 2, SystemPromptTokens: 64, Conversations: 3, Turns: 2,
		MinUserTokens: 5, MaxUserTokens: 9, MinAnswerTokens: 2, MaxAnswerTokens: 4, MeanTurnGap: time.Second, Seed: 3}
	chats, err := routingbench.GenerateSharedPrefixChats(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := newWorkload(cfg, routingbench.SimTexter{})
	if err != nil {
		t.Fatal(err)
	}
	conv, ok := w.conversation()
	if !ok {
		t.Fatal("no conversation")
	}
	d := w.startDialog(conv)
	// The engine tokenizes the chat as its template renders it; the
	// workload's tokens must come out in order, the answer between turns.
	want := slices.Clone(chats.Systems[conv.System])
	for turn := range conv.Turns {
		messages, maxTokens, err := d.nextTurn()
		if err != nil {
			t.Fatal(err)
		}
		if maxTokens != len(conv.Turns[turn].Answer) {
			t.Errorf("turn %d asks for %d tokens, want the answer's %d", turn, maxTokens, len(conv.Turns[turn].Answer))
		}
		want = append(want, conv.Turns[turn].User...)
		var got []uint32
		for _, m := range messages {
			got = append(got, sim.Tokenizer{}.Encode(m.Content, false)...)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("turn %d sends contents of tokens %v, want %v", turn, got, want)
		}
		answer := " the cache"
		d.answered(answer, "")
		want = append(want, sim.Tokenizer{}.Encode(answer, false)...)
	}
	if !d.done() {
		t.Error("dialog not done after its last turn")
	}
}

func TestWorkloadHandsOutEachConversationOnceUntilRestarted(t *testing.T) {
	w, err := newWorkload(routingbench.SharedPrefixConfig{Groups: 1, SystemPromptTokens: 8, Conversations: 2, Turns: 1, Seed: 1}, routingbench.SimTexter{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := w.conversation()
	w.conversation()
	if _, ok := w.conversation(); ok {
		t.Fatal("a third conversation from a workload of two")
	}
	w.restart()
	if again, ok := w.conversation(); !ok || !slices.Equal(again.Turns[0].User, a.Turns[0].User) {
		t.Error("after restart the first conversation does not come first")
	}
}

func TestReadStreamMeasuresTheFirstTokenAndTheUsage(t *testing.T) {
	stream := "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\" the\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\" cache\"},\"finish_reason\":\"length\"}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n" +
		"data: [DONE]\n\n"
	var r result
	first := 0
	if err := readStream(strings.NewReader(stream), &r, func() { first++ }); err != nil {
		t.Fatal(err)
	}
	if answer := r.answer; answer != " the cache" || r.promptTokens != 100 || r.cachedTokens != 64 || first != 1 {
		t.Errorf("answer %q, usage %d/%d, first token seen %d times; want \" the cache\", 64/100, once",
			answer, r.cachedTokens, r.promptTokens, first)
	}
}

func TestReadStreamRefusesBrokenStreams(t *testing.T) {
	for _, tc := range []struct{ name, stream, want string }{
		{"no usage", "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n", "without its usage"},
		{"cut", "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", "before [DONE]"},
		{"engine error", "data: {\"error\":{\"message\":\"engine stopped\"}}\n\ndata: [DONE]\n\n", "engine stopped"},
		{"not JSON", "data: {oops\n\n", "undecodable chunk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := readStream(strings.NewReader(tc.stream), &result{}, func() {}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestPercentilesAreNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	p := percentilesOf(ds)
	if !p.ok || p.p50 != 50*time.Millisecond || p.p90 != 90*time.Millisecond || p.p99 != 99*time.Millisecond {
		t.Errorf("percentiles %+v, want 50, 90 and 99 ms", p)
	}
	if percentilesOf(nil).ok {
		t.Error("percentiles of nothing are ok")
	}
}

func TestRecorderSummarizesPerPod(t *testing.T) {
	rec := newRecorder(time.Unix(0, 0))
	for _, r := range []result{
		{pod: "static/a", ttft: time.Millisecond, promptTokens: 100, cachedTokens: 90},
		{pod: "static/a", ttft: 3 * time.Millisecond, promptTokens: 100, cachedTokens: 50},
		{pod: "static/b", ttft: 2 * time.Millisecond, promptTokens: 200, cachedTokens: 0},
	} {
		rec.begin()
		rec.end(r)
	}
	rec.begin()
	s := rec.summarize(time.Unix(2, 0), []string{"static/a", "static/b", "static/c"})
	if s.requests != 3 || s.inFlight != 1 || s.hit() != 140.0/400 || s.perSecond() != 1.5 || s.ttft.p50 != 2*time.Millisecond {
		t.Errorf("summary %+v", s)
	}
	if len(s.pods) != 3 || s.pods[0].hit() != 0.7 || s.pods[1].requests != 1 || s.pods[2].requests != 0 {
		t.Errorf("pods %+v, want a (2 requests, 0.7), b (1) and c (none)", s.pods)
	}
}

func TestDecisionsSinceCountsOnlyTheRun(t *testing.T) {
	before := decisions{{"kv-aware", "prefix_hit"}: 10, {"random", "random"}: 5}
	after := decisions{{"kv-aware", "prefix_hit"}: 30, {"kv-aware", "load_fallback"}: 2, {"random", "random"}: 5}
	got := fmtDecisions(after.since(before))
	if got != "kv-aware: prefix_hit 20, load_fallback 2" {
		t.Errorf("decisions %q", got)
	}
}

func TestFoundSinceCountsOnlyTheRun(t *testing.T) {
	before := gatewayCounts{cachedPredicted: 1000, cachedFound: 900}
	if f := (gatewayCounts{cachedPredicted: 1000, cachedFound: 900}).foundSince(before); !math.IsNaN(f) {
		t.Errorf("found %v with nothing predicted since, want NaN", f)
	}
	if f := (gatewayCounts{cachedPredicted: 3000, cachedFound: 2400}).foundSince(before); f != 0.75 {
		t.Errorf("found %v of the run's predicted hits, want 0.75 (1500 of 2000)", f)
	}
}

func TestOptionsRefuseWhatCannotRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown algorithm", []string{"-algorithms", "kv-aware,fastest"}, `unknown algorithm "fastest"`},
		{"conversation beyond the cache", []string{"-engine-blocks", "100"}, "does not fit in an engine's KV cache"},
		{"no users", []string{"-users", "0"}, "-users"},
		{"user range", []string{"-min-user-tokens", "500"}, "-min-user-tokens exceeds"},
		{"unknown API", []string{"-api", "completions"}, `-api: unknown API "completions" (want one of chat, responses, messages)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("kvgate-demo", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			if _, err := parseOptions(fs, tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestRunExitsWithUsageForBadFlags(t *testing.T) {
	var stderr bytes.Buffer
	if code := run(t.Context(), []string{"-users", "0"}, io.Discard, &stderr); code != exitUsage ||
		!strings.Contains(stderr.String(), "kvgate-demo: -users must be at least 1") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestRunFailsClearlyWithoutTheBinaries(t *testing.T) {
	var stderr bytes.Buffer
	code := run(t.Context(), []string{"-bin-dir", t.TempDir()}, io.Discard, &stderr)
	if code != exitFailed || !strings.Contains(stderr.String(), "build the binaries with make build") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestServerTimingsReadsTheGatewaysMetrics(t *testing.T) {
	for _, tc := range []struct {
		name            string
		values, trailer []string
		want            map[string]time.Duration
	}{
		{"alone", []string{"gateway;dur=0.412"}, nil, map[string]time.Duration{"gateway": 412 * time.Microsecond}},
		{"after the engine's, in one value", []string{`engine;dur=5, gateway;desc="x";dur=1.5`}, nil,
			map[string]time.Duration{"engine": 5 * time.Millisecond, "gateway": 1500 * time.Microsecond}},
		{"in a second value", []string{"engine;dur=5", "gateway;dur=2, read;dur=0.01"}, nil,
			map[string]time.Duration{"engine": 5 * time.Millisecond, "gateway": 2 * time.Millisecond, "read": 10 * time.Microsecond}},
		{"with a trailer", []string{"gateway;dur=2"}, []string{"relay;dur=30, total;dur=40"},
			map[string]time.Duration{"gateway": 2 * time.Millisecond, "relay": 30 * time.Millisecond, "total": 40 * time.Millisecond}},
		{"none", nil, nil, map[string]time.Duration{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, tr := http.Header{}, http.Header{}
			for _, v := range tc.values {
				h.Add("Server-Timing", v)
			}
			for _, v := range tc.trailer {
				tr.Add("Server-Timing", v)
			}
			if got := serverTimings(h, tr); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("serverTimings(%q, %q) = %v, want %v", tc.values, tc.trailer, got, tc.want)
			}
		})
	}
}

func TestOverloadSetsTheObjectiveAndComparesWithAnSLOAwareAlgorithm(t *testing.T) {
	fs := flag.NewFlagSet("kvgate-demo", flag.ContinueOnError)
	o, err := parseOptions(fs, []string{"-overload", "-slo-ttft", "1500ms"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.algorithms, []string{"kv-aware", "slo-least-load-pulling"}) || o.users != overloadUsers ||
		o.chats.MeanTurnGap != overloadThinkTime || !slices.Equal(o.gatewayEnv(), []string{"KVGATE_SLO_TTFT=1.5s"}) {
		t.Errorf("-overload: algorithms %v, %d users thinking %v, gateway env %v", o.algorithms, o.users, o.chats.MeanTurnGap, o.gatewayEnv())
	}
	fs = flag.NewFlagSet("kvgate-demo", flag.ContinueOnError)
	o, err = parseOptions(fs, []string{"-overload", "-users", "10", "-think-time", "3s", "-algorithms", "slo-pack-load"})
	if err != nil || o.users != 10 || o.chats.MeanTurnGap != 3*time.Second || !slices.Equal(o.algorithms, []string{"slo-pack-load"}) {
		t.Errorf("-overload with users, think time and algorithms set: %+v, %v", o, err)
	}
	fs = flag.NewFlagSet("kvgate-demo", flag.ContinueOnError)
	if o, err = parseOptions(fs, nil); err != nil || o.gatewayEnv() != nil {
		t.Errorf("without -overload the gateway's environment is %v (%v)", o.gatewayEnv(), err)
	}
	fs = flag.NewFlagSet("kvgate-demo", flag.ContinueOnError)
	o, err = parseOptions(fs, []string{"-overload", "-flow-control"})
	if want := []string{"KVGATE_SLO_TTFT=2s", "KVGATE_FLOW_CONTROL=true"}; err != nil || !slices.Equal(o.gatewayEnv(), want) {
		t.Errorf("-overload -flow-control: the gateway's environment is %v (%v), want %v", o.gatewayEnv(), err, want)
	}
}

func TestSummaryCountsRefusedRequestsAgainstTheSLO(t *testing.T) {
	rec := newRecorder(time.Unix(0, 0))
	for _, ttft := range []time.Duration{time.Second, 3 * time.Second, 2 * time.Second} {
		rec.begin()
		rec.end(result{pod: "static/a", ttft: ttft})
	}
	rec.begin()
	rec.refuse()
	s := rec.summarize(time.Unix(2, 0), []string{"static/a"})
	if s.requests != 3 || s.refused != 1 || s.inFlight != 0 || s.attainment(2*time.Second) != 0.5 || s.goodput(2*time.Second) != 1 {
		t.Errorf("summary %+v: attainment %v, goodput %v; want 2 of 4 within 2 s, 1 per second",
			s, s.attainment(2*time.Second), s.goodput(2*time.Second))
	}
	var b strings.Builder
	printComparison(&b, []runResult{{algorithm: "slo-least-load-pulling", summary: s, overload: true, slo: 2 * time.Second}})
	if !regexp.MustCompile(`(?m)^slo-least-load-pulling\s+3\s.*\s0\s+1\s+50%\s+1\.0$`).MatchString(b.String()) {
		t.Errorf("comparison without the refused requests, attainment and goodput:\n%s", b.String())
	}
}
