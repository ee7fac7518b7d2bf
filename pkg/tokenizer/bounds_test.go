package tokenizer

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// activeLocal returns a Tokenizer whose in-process tokenizer for
// localModelName is active in both forms, bounded by maxBytes, with the
// engine it was verified against.
func activeLocal(t *testing.T, maxBytes int) (*Tokenizer, *prometheus.Registry, engine) {
	t.Helper()
	localDir, _ := qwen3Dir(t)
	eng := startEngine(t, loadQwen3(t))
	tk, reg := newTestTokenizer(t, Config{LocalDir: localDir, VerifyFraction: -1, NoPrefixReuse: true, LocalMaxBytes: maxBytes})
	mustTokenize(t, tk, eng.url, conversation(1))
	testsupport.Eventually(t, "both forms to be verified", func() bool {
		return localActive(t, tk, FormChat) == 1 && localActive(t, tk, FormCompletion) == 1
	})
	return tk, reg, eng
}

func fallbacks(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	return testsupport.MetricValue(t, reg, "kvgate_tokenizer_local_fallbacks_total", map[string]string{"reason": reason})
}

func localCount(t *testing.T, reg *prometheus.Registry, form string) float64 {
	t.Helper()
	return testsupport.MetricValue(t, reg, "kvgate_tokenizer_local_tokenizations_total", map[string]string{"form": form})
}

// jsonBody returns the request body of fields, with the model's name.
func jsonBody(t *testing.T, fields map[string]any) string {
	t.Helper()
	fields["model"] = localModelName
	b, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRequestsBeyondTheLocalBoundAreTokenizedByNoOne(t *testing.T) {
	const bound = 4 << 10
	tk, reg, eng := activeLocal(t, bound)
	// The tools make the rendered chat longer than its JSON: Qwen3's
	// template writes instructions around them.
	tools := json.RawMessage(`[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"}}}]`)
	msg := func(n int) []map[string]string {
		return []map[string]string{{"role": "user", "content": strings.Repeat("the sky is blue ", n/16)}}
	}
	rendersTooLong := jsonBody(t, map[string]any{"messages": msg(bound - 300), "tools": tools})
	chat := chatRequest(t, rendersTooLong)
	rendered, err := loadQwen3(t).RenderChat(hf.Chat{Messages: chat.Messages, Tools: chat.Tools, AddGenerationPrompt: true})
	if n := len(chat.Messages) + len(chat.Tools); n >= bound || len(rendered) <= bound || err != nil {
		t.Fatalf("the chat's JSON is %d bytes, rendered %d (%v): want them either side of the bound", n, len(rendered), err)
	}
	for _, body := range []string{
		jsonBody(t, map[string]any{"prompt": strings.Repeat("the sky is blue ", bound/16+1)}),
		jsonBody(t, map[string]any{"prompt": []string{strings.Repeat("x", bound+1)}}),
		jsonBody(t, map[string]any{"messages": msg(bound + 16)}),
		// Escaped, the JSON is three times the text it renders.
		`{"model":"` + localModelName + `","messages":[{"role":"user","content":"` + strings.Repeat(`\u00e9`, bound/6+1) + `"}]}`,
		rendersTooLong,
	} {
		callsBefore, tooLarge := eng.calls.Load(), fallbacks(t, reg, fallbackTooLarge)
		ids, err := tokenize(t, tk, eng.url, body)
		if e := reasonOf(t, err); e.Reason != ReasonTooLarge || ids != nil {
			t.Fatalf("%.80s...: %d ids, %v; want a too_large error", body, len(ids), err)
		}
		if n := eng.calls.Load() - callsBefore; n != 0 {
			t.Errorf("%.80s...: the engine received %d /tokenize calls", body, n)
		}
		if n := fallbacks(t, reg, fallbackTooLarge) - tooLarge; n != 1 {
			t.Errorf("%.80s...: local_fallbacks_total{reason=too_large} rose by %v, want 1", body, n)
		}
	}
	// Requests within the bound are still tokenized in process.
	before := localCount(t, reg, FormCompletion) + localCount(t, reg, FormChat)
	mustTokenize(t, tk, eng.url, jsonBody(t, map[string]any{"prompt": strings.Repeat("the sky is blue ", bound/16-1)}))
	mustTokenize(t, tk, eng.url, jsonBody(t, map[string]any{"messages": msg(bound - 600)}))
	if n := localCount(t, reg, FormCompletion) + localCount(t, reg, FormChat) - before; n != 2 {
		t.Errorf("%v requests within the bound tokenized in process, want 2", n)
	}
}

func TestALongWordIsLeftToTheEngine(t *testing.T) {
	tk, reg, eng := activeLocal(t, 0)
	word := strings.Repeat("abcdefghijklmnopqrstuvwxyz", hf.MaxWordBytes/26+1)
	remote, _ := newTestTokenizer(t, Config{NoPrefixReuse: true})
	for i, body := range []string{
		jsonBody(t, map[string]any{"prompt": "a prompt with " + word + " in it"}),
		jsonBody(t, map[string]any{"messages": []map[string]string{{"role": "user", "content": "a chat with " + word}}}),
	} {
		callsBefore, localBefore := eng.calls.Load(), localCount(t, reg, FormCompletion)+localCount(t, reg, FormChat)
		got := mustTokenize(t, tk, eng.url, body)
		if n := eng.calls.Load() - callsBefore; n != 1 {
			t.Errorf("request %d: the engine received %d /tokenize calls, want 1", i, n)
		}
		if n := localCount(t, reg, FormCompletion) + localCount(t, reg, FormChat) - localBefore; n != 0 {
			t.Errorf("request %d: %v tokenizations in process", i, n)
		}
		wantTokens(t, got, mustTokenize(t, remote, eng.url, body))
	}
	if n := fallbacks(t, reg, fallbackLongWord); n != 2 {
		t.Errorf("local_fallbacks_total{reason=long_word} = %v, want 2", n)
	}
}

func TestACallerThatLeftStopsItsTokenizationInProcess(t *testing.T) {
	tk, reg, eng := activeLocal(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	callsBefore, localBefore := eng.calls.Load(), localCount(t, reg, FormCompletion)+localCount(t, reg, FormChat)
	for _, body := range []string{
		jsonBody(t, map[string]any{"prompt": "the sky is blue"}),
		jsonBody(t, map[string]any{"messages": []map[string]string{{"role": "user", "content": "why is the sky blue?"}}}),
	} {
		var err error
		if chat := chatRequest(t, body); chat.Messages != nil {
			_, err = tk.TokenizeChat(ctx, eng.url, chat)
		} else {
			_, err = tk.TokenizeCompletion(ctx, eng.url, completionRequest(t, body))
		}
		if e := reasonOf(t, err); e.Reason != ReasonCanceled {
			t.Fatalf("%s with a context that ended: %v, want canceled", body, err)
		}
	}
	if n := localCount(t, reg, FormCompletion) + localCount(t, reg, FormChat) - localBefore; n != 0 {
		t.Errorf("%v tokenizations in process, want none", n)
	}
	if n := eng.calls.Load() - callsBefore; n != 0 {
		t.Errorf("the engine received %d /tokenize calls", n)
	}
}

// stallingContext, at its second look at Err, tells the test it got
// there, waits for the test's release, and from then on reports itself
// canceled.
type stallingContext struct {
	context.Context
	looks            atomic.Int64
	reached, release chan struct{}
}

func (c *stallingContext) Err() error {
	n := c.looks.Add(1)
	if n == 2 {
		close(c.reached)
		<-c.release
	}
	if n >= 2 {
		return context.Canceled
	}
	return nil
}

func TestCallersThatSharedAStoppedTokenizationTryAgain(t *testing.T) {
	tk, reg, eng := activeLocal(t, 0)
	// Two segments, either side of a special token, so that the encoding
	// looks at the context twice.
	body := jsonBody(t, map[string]any{"prompt": "the sky<|im_end|> is blue"})
	remote, _ := newTestTokenizer(t, Config{NoPrefixReuse: true})
	want := mustTokenize(t, remote, eng.url, body)
	callsBefore := eng.calls.Load()

	leader := &stallingContext{Context: context.Background(), reached: make(chan struct{}), release: make(chan struct{})}
	misses := func() float64 { return testsupport.MetricValue(t, reg, "kvgate_tokenizer_cache_misses_total", nil) }
	missesBefore := misses()
	var wg sync.WaitGroup
	var leaderErr, sharedErr error
	var shared []uint32
	leaderDone := make(chan struct{})
	wg.Go(func() {
		defer close(leaderDone)
		_, leaderErr = tk.TokenizeCompletion(leader, eng.url, completionRequest(t, body))
	})
	select {
	case <-leader.reached:
	case <-leaderDone:
		t.Fatalf("the first caller finished (%v) before its second look at its context", leaderErr)
	}
	wg.Go(func() {
		shared, sharedErr = tk.TokenizeCompletion(context.Background(), eng.url, completionRequest(t, body))
	})
	testsupport.Eventually(t, "the second caller to share the first's tokenization", func() bool { return misses()-missesBefore == 2 })
	close(leader.release)
	wg.Wait()

	if e := reasonOf(t, leaderErr); e.Reason != ReasonCanceled {
		t.Fatalf("the caller that left: %v, want canceled", leaderErr)
	}
	if sharedErr != nil {
		t.Fatalf("the caller that shared its tokenization: %v", sharedErr)
	}
	wantTokens(t, shared, want)
	if n := eng.calls.Load() - callsBefore; n != 0 {
		t.Errorf("the engine received %d /tokenize calls", n)
	}
}

func TestResponseIDsTakeOneAllocationOfTheirCount(t *testing.T) {
	ids := make([]int, 1000)
	for i := range ids {
		ids[i] = 100000 + i
	}
	tokens, err := json.Marshal(ids)
	if err != nil {
		t.Fatal(err)
	}
	countFirst := []byte(`{"count":1000,"max_model_len":4096,"tokens":` + string(tokens) + `}`)
	countLast := []byte(`{"max_model_len":4096,"tokens":` + string(tokens) + `,"count":1000}`)
	for _, body := range [][]byte{countFirst, countLast} {
		res, err := decodeResponse(body)
		if err != nil || len(res.tokens) != 1000 || cap(res.tokens) != 1000 || res.tokens[999] != 100999 {
			t.Fatalf("decoded %d ids (capacity %d), %v; want the 1000 ids in an array of their length",
				len(res.tokens), cap(res.tokens), err)
		}
	}
	first := testing.AllocsPerRun(20, func() { _, _ = decodeResponse(countFirst) })
	last := testing.AllocsPerRun(20, func() { _, _ = decodeResponse(countLast) })
	if first != 1 || last <= first {
		t.Fatalf("%v allocations with the count before the ids, %v after; want 1, and more after", first, last)
	}

	// A count the bytes cannot hold is no size to allocate.
	hostile := []byte(`{"count":2000000000,"max_model_len":4096,"tokens":[1,2,3]}`)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := decodeResponse(hostile); err == nil {
		t.Fatal("a count that does not match the ids was accepted")
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("decoding a response of 3 ids said to be 2e9 allocated %d bytes", n)
	}
}

// repeatedTokensReply returns a TokenizeResponse of about n bytes whose
// count, n/4, comes first and whose "tokens" member, null but for the
// last, is repeated until the reply is n bytes long.
func repeatedTokensReply(n int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"count":%d,"max_model_len":4096`, n/4)
	for b.Len() < n-32 {
		b.WriteString(`,"tokens":null`)
	}
	b.WriteString(`,"tokens":[1]}`)
	return []byte(b.String())
}

func TestRepliesWithRepeatedTokensAreRefusedInAllocationsLinearInTheirSize(t *testing.T) {
	for _, body := range [][]byte{
		repeatedTokensReply(64 << 10),
		repeatedTokensReply(256 << 10),
		[]byte(`{"count":1,"max_model_len":4096,"tokens":[1],"tokens":[1]}`),
		[]byte(`{"count":1,"max_model_len":4096,"tokens":[1],"tokens":null}`),
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := decodeResponse(body)
		runtime.ReadMemStats(&after)
		if err == nil || !strings.Contains(err.Error(), `repeated "tokens"`) {
			t.Errorf("reply of %d bytes with repeated \"tokens\": %v, want it refused for the repetition", len(body), err)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 16*uint64(len(body))+64<<10 {
			t.Errorf("decoding a reply of %d bytes allocated %d bytes, more than 16 times its size", len(body), n)
		}
	}
}
