package sim

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

const (
	overhead   = 10 * time.Millisecond
	perPrefill = time.Millisecond
	perDecode  = 2 * time.Millisecond
)

func newTestEngine(t *testing.T, mod func(*EngineConfig)) *Engine {
	t.Helper()
	cfg := EngineConfig{
		BlockSize:    4,
		NumGPUBlocks: 64,
		HashSeed:     "engine-test",
		Events:       true,
		Latency:      LatencyModel{StepOverhead: overhead, PrefillPerToken: perPrefill, DecodePerToken: perDecode},
	}
	if mod != nil {
		mod(&cfg)
	}
	e, err := NewEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func mustAdd(t *testing.T, e *Engine, spec RequestSpec, at time.Time) {
	t.Helper()
	if err := e.Add(spec, at); err != nil {
		t.Fatal(err)
	}
}

// runUntilIdle steps e back to back from now until nothing is left and
// returns every step's result.
func runUntilIdle(t *testing.T, e *Engine, now time.Time) []*StepResult {
	t.Helper()
	var steps []*StepResult
	for e.HasWork() {
		end, ok := e.BeginStep(now)
		if !ok {
			t.Fatalf("work left but nothing schedulable at %v: %+v", now, e.QueueState())
		}
		steps = append(steps, e.EndStep())
		now = end
		if len(steps) > 10000 {
			t.Fatal("engine does not converge")
		}
	}
	return steps
}

// outputsOf collects the outputs of one request across steps.
func outputsOf(steps []*StepResult, id string) []RequestOutput {
	var out []RequestOutput
	for _, s := range steps {
		for _, o := range s.Outputs {
			if o.RequestID == id {
				out = append(out, o)
			}
		}
	}
	return out
}

func last(outs []RequestOutput) RequestOutput { return outs[len(outs)-1] }

func TestStepsFollowTheLatencyModel(t *testing.T) {
	e := newTestEngine(t, nil)
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(300, 10), MaxTokens: 3}, t0)
	steps := runUntilIdle(t, e, t0)
	if len(steps) != 3 {
		t.Fatalf("%d steps, want prefill + 2 decodes", len(steps))
	}
	wantEnds := []time.Duration{overhead + 10*perPrefill, overhead + 10*perPrefill + overhead + perDecode, overhead + 10*perPrefill + 2*(overhead+perDecode)}
	for i, s := range steps {
		if got := s.End.Sub(t0); got != wantEnds[i] {
			t.Errorf("step %d ends at +%v, want +%v", i, got, wantEnds[i])
		}
	}
	out := outputsOf(steps, "a")
	done := last(out)
	if len(out) != 3 || !done.Finished || done.FinishReason != FinishLength {
		t.Fatalf("outputs %+v: want 3 tokens, finished by length", out)
	}
	tm := done.Stats.Timings
	if tm.QueueTime() != 0 || tm.TTFT() != wantEnds[0] || tm.E2E() != wantEnds[2] {
		t.Errorf("timings queue %v ttft %v e2e %v, want 0, %v, %v", tm.QueueTime(), tm.TTFT(), tm.E2E(), wantEnds[0], wantEnds[2])
	}
	if s := steps[0].Stats; s.PrefillTokens != 10 || s.DecodeTokens != 0 || s.PromptTokens != 10 || s.GenerationTokens != 1 {
		t.Errorf("prefill step stats %+v", s)
	}
	if s := steps[1].Stats; s.PrefillTokens != 0 || s.DecodeTokens != 1 || s.Running != 1 {
		t.Errorf("decode step stats %+v", s)
	}
	if s := steps[2].Stats; s.Running != 0 || s.KVCacheUsage != 0 {
		t.Errorf("final step stats %+v: want the finished request's blocks released", s)
	}
}

func TestEventBatchesCarryTheStepsBlocks(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.DataParallelRank = 3 })
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(300, 10), MaxTokens: 3}, t0)
	steps := runUntilIdle(t, e, t0)
	if steps[1].Batch != nil {
		t.Errorf("decode step that filled no block published %+v", steps[1].Batch)
	}
	for _, i := range []int{0, 2} {
		b := steps[i].Batch
		if b == nil || len(b.Events) != 1 {
			t.Fatalf("step %d batch %+v: want one BlockStored", i, b)
		}
		if b.DataParallelRank != 3 || b.Time().Sub(steps[i].End).Abs() > time.Microsecond {
			t.Errorf("step %d batch rank %d at %v, want rank 3 at the step end %v", i, b.DataParallelRank, b.Time(), steps[i].End)
		}
		if b.Events[0].GetTimestamp() != b.Time() {
			t.Errorf("event stamped %v, batch %v", b.Events[0].GetTimestamp(), b.Time())
		}
	}
	first := stored(t, steps[0].Batch.Events[0])
	third := stored(t, steps[2].Batch.Events[0])
	if len(first.BlockHashes) != 2 || len(third.BlockHashes) != 1 || third.ParentBlockHash != first.BlockHashes[1] {
		t.Errorf("prefill stored %v, decode stored %v under %x: want the decode-filled block chained to the prompt's last",
			first.BlockHashes, third.BlockHashes, third.ParentBlockHash)
	}
	out := outputsOf(steps, "a")
	if want := []uint32{308, 309, out[0].Token, out[1].Token}; !slices.Equal(third.TokenIDs, want) {
		t.Errorf("decode-filled block tokens %v, want %v", third.TokenIDs, want)
	}
}

func TestPrefixHitShortensTimeToFirstToken(t *testing.T) {
	e := newTestEngine(t, nil)
	shared := seqTokens(1, 40)
	mustAdd(t, e, RequestSpec{ID: "cold", Prompt: shared, MaxTokens: 1}, t0)
	cold := runUntilIdle(t, e, t0)
	at := cold[len(cold)-1].End
	mustAdd(t, e, RequestSpec{ID: "warm", Prompt: append(slices.Clone(shared), seqTokens(900, 4)...), MaxTokens: 1}, at)
	warm := runUntilIdle(t, e, at)

	coldOut, warmOut := last(outputsOf(cold, "cold")), last(outputsOf(warm, "warm"))
	if got, want := coldOut.Stats.Timings.TTFT(), overhead+40*perPrefill; got != want {
		t.Errorf("cold TTFT %v, want %v", got, want)
	}
	if got, want := warmOut.Stats.Timings.TTFT(), overhead+4*perPrefill; got != want {
		t.Errorf("warm TTFT %v, want %v: only the 4 new tokens prefilled", got, want)
	}
	if warmOut.Stats.CachedTokens != 40 || coldOut.Stats.CachedTokens != 0 {
		t.Errorf("cached tokens cold %d warm %d, want 0 and 40", coldOut.Stats.CachedTokens, warmOut.Stats.CachedTokens)
	}
	if s := warm[0].Stats; s.PrefixCacheQueries != 44 || s.PrefixCacheHits != 40 {
		t.Errorf("prefix cache queries %d hits %d, want 44 and 40", s.PrefixCacheQueries, s.PrefixCacheHits)
	}
	if s := cold[0].Stats; s.PrefixCacheQueries != 40 || s.PrefixCacheHits != 0 {
		t.Errorf("cold prefix cache queries %d hits %d, want 40 and 0", s.PrefixCacheQueries, s.PrefixCacheHits)
	}
}

func TestRequestsQueueWhenMaxNumSeqsIsReached(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.MaxNumSeqs = 2 })
	for i, id := range []string{"a", "b", "c"} {
		mustAdd(t, e, RequestSpec{ID: id, Prompt: seqTokens(100*i+1, 6), MaxTokens: 2}, t0)
	}
	steps := runUntilIdle(t, e, t0)
	if s := steps[0].Stats; s.Running != 2 || s.Waiting != 1 {
		t.Fatalf("after step 0: running %d waiting %d, want 2 and 1", s.Running, s.Waiting)
	}
	aDone := last(outputsOf(steps, "a")).Stats.Timings.LastToken
	c := last(outputsOf(steps, "c")).Stats.Timings
	if c.Scheduled != aDone {
		t.Errorf("c scheduled at %v, want when a finished (%v)", c.Scheduled, aDone)
	}
	if c.QueueTime() <= 0 {
		t.Errorf("c queue time %v, want positive", c.QueueTime())
	}
}

func TestRequestsQueueWhenTheKVCacheIsFull(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.NumGPUBlocks = 7 }) // 6 usable blocks of 4
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(1, 16), MaxTokens: 1}, t0)
	mustAdd(t, e, RequestSpec{ID: "b", Prompt: seqTokens(100, 16), MaxTokens: 1}, t0)
	steps := runUntilIdle(t, e, t0)
	if s := steps[0].Stats; s.Running != 0 || s.Waiting != 1 || s.PrefillTokens != 16 {
		t.Fatalf("step 0 stats %+v: want only a prefilled, b waiting", s)
	}
	a := last(outputsOf(steps, "a")).Stats.Timings
	b := last(outputsOf(steps, "b")).Stats.Timings
	if b.Scheduled != a.LastToken {
		t.Errorf("b scheduled at %v, want when a released its blocks (%v)", b.Scheduled, a.LastToken)
	}
}

func TestDecodeOutOfBlocksPreemptsTheNewestRequest(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.NumGPUBlocks = 7 }) // 6 usable blocks of 4
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(1, 8), MaxTokens: 10}, t0)
	mustAdd(t, e, RequestSpec{ID: "b", Prompt: seqTokens(100, 8), MaxTokens: 10}, t0)
	steps := runUntilIdle(t, e, t0)

	preempted := -1
	for i, s := range steps {
		if s.Stats.Preemptions > 0 {
			preempted = i
			break
		}
	}
	if preempted < 0 {
		t.Fatal("no preemption although both requests need 5 blocks of 6")
	}
	if got := outputsOf(steps[preempted:preempted+1], "a"); len(got) != 1 {
		t.Errorf("the preempting step gave a %d tokens, want 1", len(got))
	}
	if got := outputsOf(steps[preempted:preempted+1], "b"); len(got) != 0 {
		t.Errorf("the preempted request b got tokens %+v in the step that preempted it", got)
	}
	a, b := outputsOf(steps, "a"), outputsOf(steps, "b")
	if len(a) != 10 || len(b) != 10 || last(b).Stats.Preemptions != 1 || last(a).Stats.Preemptions != 0 {
		t.Fatalf("a %d tokens (%d preemptions), b %d tokens (%d preemptions): want 10 each, b preempted once",
			len(a), last(a).Stats.Preemptions, len(b), last(b).Stats.Preemptions)
	}

	// b's tokens do not depend on the preemption.
	ref := newTestEngine(t, nil)
	mustAdd(t, ref, RequestSpec{ID: "b", Prompt: seqTokens(100, 8), MaxTokens: 10}, t0)
	var want []uint32
	for _, o := range outputsOf(runUntilIdle(t, ref, t0), "b") {
		want = append(want, o.Token)
	}
	var got []uint32
	for _, o := range b {
		got = append(got, o.Token)
	}
	if !slices.Equal(got, want) {
		t.Errorf("preempted b generated %v, unpreempted %v", got, want)
	}
}

func TestChunkedPrefillSpreadsALongPromptOverSteps(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.MaxNumBatchedTokens = 8 })
	mustAdd(t, e, RequestSpec{ID: "long", Prompt: seqTokens(1, 20), MaxTokens: 1}, t0)
	steps := runUntilIdle(t, e, t0)
	if len(steps) != 3 {
		t.Fatalf("%d steps, want 3 chunks of at most 8 tokens", len(steps))
	}
	var parent kvevent.BlockHash
	for i, s := range steps {
		if len(s.Outputs) != map[bool]int{true: 1, false: 0}[i == 2] {
			t.Errorf("step %d outputs %+v: only the last chunk samples", i, s.Outputs)
		}
		st := stored(t, s.Batch.Events[0])
		if i > 0 && (!st.HasParent || st.ParentBlockHash != parent) {
			t.Errorf("chunk %d stored under %x, want %x", i, st.ParentBlockHash, parent)
		}
		parent = st.BlockHashes[len(st.BlockHashes)-1]
	}
}

func TestRequestWithoutMaxTokensStopsWithEOS(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.DefaultOutputTokens = 3 })
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(1, 5)}, t0)
	out := outputsOf(runUntilIdle(t, e, t0), "a")
	if len(out) != 3 || last(out).Token != EOSID || last(out).FinishReason != FinishStop {
		t.Errorf("outputs %+v: want 3 tokens ending with EOS, finish reason stop", out)
	}
}

func TestGenerationStopsAtMaxModelLen(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.MaxModelLen = 12 })
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(1, 9)}, t0)
	out := outputsOf(runUntilIdle(t, e, t0), "a")
	if len(out) != 3 || last(out).FinishReason != FinishLength {
		t.Errorf("outputs %+v: want 3 tokens up to the 12-token limit, finish reason length", out)
	}
}

func TestSameInputsGiveSameStepsAndEvents(t *testing.T) {
	run := func() []*StepResult {
		e := newTestEngine(t, func(c *EngineConfig) { c.NumGPUBlocks = 12; c.MaxNumBatchedTokens = 16 })
		for i := range 6 {
			prompt := append(seqTokens(1, 8), seqTokens(50*i, 5+i)...)
			mustAdd(t, e, RequestSpec{ID: string(rune('a' + i)), Prompt: prompt, MaxTokens: 4 + i}, t0.Add(time.Duration(i)*time.Millisecond))
		}
		return runUntilIdle(t, e, t0)
	}
	a, b := run(), run()
	if !reflect.DeepEqual(a, b) {
		t.Error("two runs of the same workload differ")
	}
}

func TestAbortReleasesBlocksAndDropsOutputs(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.MaxNumSeqs = 1 })
	mustAdd(t, e, RequestSpec{ID: "run", Prompt: seqTokens(1, 9), MaxTokens: 5}, t0)
	mustAdd(t, e, RequestSpec{ID: "wait", Prompt: seqTokens(100, 9), MaxTokens: 5}, t0)
	end, _ := e.BeginStep(t0)
	if _, ok := e.Abort("run"); !ok {
		t.Fatal("abort of the running request not found")
	}
	if _, ok := e.Abort("wait"); !ok {
		t.Fatal("abort of the waiting request not found")
	}
	res := e.EndStep()
	if len(res.Outputs) != 0 {
		t.Errorf("aborted request produced %+v", res.Outputs)
	}
	if q := e.QueueState(); q.Running != 0 || q.Waiting != 0 || q.KVCacheUsage != 0 || e.HasWork() {
		t.Errorf("after aborts: %+v", q)
	}
	if _, ok := e.Abort("run"); ok {
		t.Error("second abort found the request")
	}
	if _, ok := e.BeginStep(end); ok {
		t.Error("a step started with nothing to do")
	}
}

func TestAddRejectsBadRequests(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.MaxModelLen = 16 })
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(1, 4)}, t0)
	for _, tc := range []struct {
		name string
		spec RequestSpec
		want error
	}{
		{"duplicate id", RequestSpec{ID: "a", Prompt: seqTokens(1, 4)}, ErrDuplicateRequest},
		{"empty prompt", RequestSpec{ID: "b"}, ErrInvalidPrompt},
		{"token out of vocabulary", RequestSpec{ID: "b", Prompt: []uint32{5, VocabSize}}, ErrInvalidPrompt},
		{"negative max tokens", RequestSpec{ID: "b", Prompt: seqTokens(1, 4), MaxTokens: -1}, ErrInvalidPrompt},
		{"prompt fills the model length", RequestSpec{ID: "b", Prompt: seqTokens(1, 16)}, ErrTooLong},
		{"prompt and max tokens exceed it", RequestSpec{ID: "b", Prompt: seqTokens(1, 10), MaxTokens: 7}, ErrTooLong},
		{"max tokens at int's bound", RequestSpec{ID: "b", Prompt: seqTokens(1, 4), MaxTokens: math.MaxInt}, ErrTooLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := e.Add(tc.spec, t0); !errors.Is(err, tc.want) {
				t.Errorf("Add = %v, want %v", err, tc.want)
			}
		})
	}
	if q := e.QueueState(); q.Waiting != 1 {
		t.Errorf("rejected requests were queued: %+v", q)
	}
}

func TestNewEngineRejectsAModelLenTheCacheCannotHold(t *testing.T) {
	_, err := NewEngine(EngineConfig{BlockSize: 16, NumGPUBlocks: 9, MaxModelLen: 256})
	if err == nil {
		t.Fatal("accepted max model len 256 with 128 cacheable tokens")
	}
	e, err := NewEngine(EngineConfig{BlockSize: 16, NumGPUBlocks: 9})
	if err != nil || e.Config().MaxModelLen != 128 {
		t.Errorf("default max model len %d (%v), want what the cache holds (128)", e.Config().MaxModelLen, err)
	}
}

func TestEngineResetPrefixCache(t *testing.T) {
	e := newTestEngine(t, nil)
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(1, 8), MaxTokens: 2}, t0)
	end, _ := e.BeginStep(t0)
	if _, err := e.ResetPrefixCache(t0); !errors.Is(err, ErrBlocksInUse) {
		t.Fatalf("reset during a request: %v, want ErrBlocksInUse", err)
	}
	e.EndStep()
	steps := runUntilIdle(t, e, end)
	at := steps[len(steps)-1].End
	if e.CachedPrefixBlocks(seqTokens(1, 8), nil) != 2 {
		t.Fatal("prompt blocks not cached after the request")
	}
	b, err := e.ResetPrefixCache(at)
	if err != nil {
		t.Fatal(err)
	}
	if b == nil || len(b.Events) != 1 || b.Events[0].GetType() != kvevent.EventTypeAllCleared || b.Time().Sub(at).Abs() > time.Microsecond {
		t.Errorf("reset batch %+v: want one AllBlocksCleared stamped %v", b, at)
	}
	if e.CachedPrefixBlocks(seqTokens(1, 8), nil) != 0 {
		t.Error("blocks still cached after reset")
	}
}

func TestQueueStateReportsLoad(t *testing.T) {
	e := newTestEngine(t, func(c *EngineConfig) { c.MaxNumSeqs = 1; c.MaxNumBatchedTokens = 8 })
	mustAdd(t, e, RequestSpec{ID: "a", Prompt: seqTokens(1, 20), MaxTokens: 2}, t0)
	mustAdd(t, e, RequestSpec{ID: "b", Prompt: seqTokens(100, 7), MaxTokens: 2}, t0)
	e.BeginStep(t0)
	e.EndStep()
	q := e.QueueState()
	if q.Running != 1 || q.Waiting != 1 || q.WaitingTokens != 7 || q.RunningPrefillTokens != 12 {
		t.Errorf("queue state %+v: want a running with 12 tokens to prefill, b waiting with 7", q)
	}
}

// BenchmarkEngineStep measures one scheduler step of an engine kept at 64
// running requests (prompts of 512 tokens sharing 256, 64 output tokens
// each): mostly decode steps with an admission and its prefill now and then,
// the mix a discrete-event simulation replays.
func BenchmarkEngineStep(b *testing.B) {
	e, err := NewEngine(EngineConfig{NumGPUBlocks: 8192, HashSeed: "bench", Events: true,
		Latency: LatencyModel{StepOverhead: 5 * time.Millisecond, PrefillPerToken: 50 * time.Microsecond, DecodePerToken: 100 * time.Microsecond}})
	if err != nil {
		b.Fatal(err)
	}
	system := seqTokens(1, 256)
	next := 0
	now := t0
	add := func() {
		prompt := append(slices.Clone(system), seqTokens(1000+next%100*256, 256)...)
		if err := e.Add(RequestSpec{ID: strconv.Itoa(next), Prompt: prompt, MaxTokens: 64}, now); err != nil {
			b.Fatal(err)
		}
		next++
	}
	for range 64 {
		add()
	}
	b.ReportAllocs()
	for b.Loop() {
		end, ok := e.BeginStep(now)
		if !ok {
			b.Fatal("idle engine")
		}
		res := e.EndStep()
		now = end
		for _, o := range res.Outputs {
			if o.Finished {
				add()
			}
		}
	}
}
