package tokenizer

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// tokenize sends a chat body when it has messages, a completion body
// otherwise.
func tokenize(t testing.TB, tk *Tokenizer, baseURL, body string) ([]uint32, error) {
	t.Helper()
	if chat := chatRequest(t, body); chat.Messages != nil {
		return tk.TokenizeChat(context.Background(), baseURL, chat)
	}
	return tk.TokenizeCompletion(context.Background(), baseURL, completionRequest(t, body))
}

func mustTokenize(t testing.TB, tk *Tokenizer, baseURL, body string) []uint32 {
	t.Helper()
	ids, err := tokenize(t, tk, baseURL, body)
	if err != nil {
		t.Fatalf("tokenize %s: %v", body, err)
	}
	return ids
}

func TestEquivalentRequestsShareOneCall(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name        string
		first, then string
	}{
		{"chat defaults spelled out", `{"model":"m",` + msgs + `}`,
			`{"model":"m",` + msgs + `,"add_generation_prompt":true,"continue_final_message":false,"add_special_tokens":false}`},
		{"chat nulls", `{"model":"m",` + msgs + `}`,
			`{"model":"m",` + msgs + `,"tools":null,"documents":null,"chat_template_kwargs":null}`},
		{"chat sampling fields", `{"model":"m",` + msgs + `}`,
			`{"model":"m",` + msgs + `,"temperature":0,"max_tokens":5,"stream":true}`},
		{"completion default spelled out", `{"model":"m","prompt":"hello"}`,
			`{"model":"m","prompt":"hello","add_special_tokens":true}`},
		{"completion list of one prompt", `{"model":"m","prompt":"hello"}`, `{"model":"m","prompt":["hello"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVLLM(t, "m")
			other := newFakeVLLM(t, "m")
			tk, _ := newTestTokenizer(t, Config{})
			first := mustTokenize(t, tk, f.URL, tt.first)
			then := mustTokenize(t, tk, other.URL, tt.then)
			wantTokens(t, then, first)
			if n, m := f.calls.Load(), other.calls.Load(); n != 1 || m != 0 {
				t.Fatalf("calls: %d to the first pod and %d to the second, want 1 and 0", n, m)
			}
			if hits := count(t, tk.m.hits); hits != 1 {
				t.Fatalf("cache hits = %d, want 1", hits)
			}
		})
	}
}

func TestRequestsThatTokenizeDifferentlyDoNotShareEntries(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	chat := `{"model":"m",` + msgs + `}`
	tests := []struct {
		name        string
		first, then string
	}{
		{"model", chat, `{"model":"m-lora",` + msgs + `}`},
		{"messages", chat, `{"model":"m","messages":[{"role":"user","content":"ho"}]}`},
		{"add_generation_prompt", chat, `{"model":"m",` + msgs + `,"add_generation_prompt":false}`},
		{"add_special_tokens", chat, `{"model":"m",` + msgs + `,"add_special_tokens":true}`},
		{"tools", chat, `{"model":"m",` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}]}`},
		{"documents", chat, `{"model":"m",` + msgs + `,"documents":[{"text":"d"}]}`},
		{"chat_template", chat, `{"model":"m",` + msgs + `,"chat_template":"t"}`},
		{"chat_template_kwargs", chat, `{"model":"m",` + msgs + `,"chat_template_kwargs":{"enable_thinking":true}}`},
		{"reasoning_effort", chat, `{"model":"m",` + msgs + `,"reasoning_effort":"low"}`},
		{"mm_processor_kwargs", chat, `{"model":"m",` + msgs + `,"mm_processor_kwargs":{"a":1}}`},
		{"media_io_kwargs", chat, `{"model":"m",` + msgs + `,"media_io_kwargs":{"image":{}}}`},
		{"model, no messages", `{"model":"m","messages":[]}`, `{"model":"m-lora","messages":[]}`},
		{"tools, no messages", `{"model":"m","messages":[]}`, `{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"f"}}]}`},
		{"add_generation_prompt, no messages", `{"model":"m","messages":[]}`, `{"model":"m","messages":[],"add_generation_prompt":false}`},
		{"completion add_special_tokens", `{"model":"m","prompt":"hi"}`, `{"model":"m","prompt":"hi","add_special_tokens":false}`},
		{"completion model", `{"model":"m","prompt":"hi"}`, `{"model":"m-lora","prompt":"hi"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVLLM(t, "m", "m-lora")
			tk, _ := newTestTokenizer(t, Config{})
			mustTokenize(t, tk, f.URL, tt.first)
			mustTokenize(t, tk, f.URL, tt.then)
			if n := f.calls.Load(); n != 2 {
				t.Fatalf("server received %d requests, want 2", n)
			}
		})
	}
}

func TestConcurrentIdenticalMissesShareOneCall(t *testing.T) {
	const callers = 16
	f := newFakeVLLM(t, "m")
	f.block = make(chan struct{})
	tk, _ := newTestTokenizer(t, Config{})
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

	results := make([][]uint32, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { results[i], errs[i] = tokenize(t, tk, f.URL, body) })
	}
	testsupport.Eventually(t, "every caller to miss", func() bool { return count(t, tk.m.misses) == callers })
	close(f.block)
	wg.Wait()

	want := fakeEncode(userHi+genPrompt, false)
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		wantTokens(t, results[i], want)
	}
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("server received %d requests for %d identical concurrent misses, want 1", n, callers)
	}
	if ok := count(t, tk.m.calls[resultOK]); ok != 1 {
		t.Fatalf("calls_total{result=ok} = %d, want 1", ok)
	}
}

// TestCallerThatGivesUpDoesNotFailTheSharedCall cancels the caller whose
// miss started the call: it returns at once, while the other caller gets
// the result and the cache keeps it.
func TestCallerThatGivesUpDoesNotFailTheSharedCall(t *testing.T) {
	f := newFakeVLLM(t, "m")
	f.block = make(chan struct{})
	tk, _ := newTestTokenizer(t, Config{})
	req := chatRequest(t, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)

	ctx, cancel := context.WithCancel(context.Background())
	leaderErr := make(chan error, 1)
	go func() {
		_, err := tk.TokenizeChat(ctx, f.URL, req)
		leaderErr <- err
	}()
	<-f.arrived
	other := make(chan []uint32, 1)
	go func() {
		ids, err := tk.TokenizeChat(context.Background(), f.URL, req)
		if err != nil {
			t.Errorf("second caller: %v", err)
		}
		other <- ids
	}()
	testsupport.Eventually(t, "the second caller to join", func() bool { return count(t, tk.m.misses) == 2 })

	cancel()
	err := <-leaderErr
	if e := reasonOf(t, err); e.Reason != ReasonCanceled || !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled caller got %v, want a canceled error wrapping context.Canceled", err)
	}
	close(f.block)
	want := fakeEncode(userHi+genPrompt, false)
	wantTokens(t, <-other, want)
	wantTokens(t, mustTokenize(t, tk, f.URL, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`), want)
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("server received %d requests, want 1", n)
	}
}

// budgetFor returns the CacheMaxTokens of a cache that holds n results of
// 4 ids each, and no more.
func budgetFor(n int) int { return n * entryBytes(make([]uint32, 4)) / 4 }

func TestCacheEvictsTheLeastRecentlyUsedBeyondItsBudget(t *testing.T) {
	f := newFakeVLLM(t, "m")
	tk, _ := newTestTokenizer(t, Config{CacheMaxTokens: budgetFor(3)})
	prompt := func(p string) string { return `{"model":"m","prompt":"` + p + `","add_special_tokens":false}` }

	for _, p := range []string{"aaaa", "bbbb", "cccc"} {
		mustTokenize(t, tk, f.URL, prompt(p))
	}
	mustTokenize(t, tk, f.URL, prompt("aaaa")) // now the most recently used
	mustTokenize(t, tk, f.URL, prompt("dddd")) // evicts bbbb
	if n := f.calls.Load(); n != 4 {
		t.Fatalf("server received %d requests, want 4", n)
	}
	for _, p := range []string{"aaaa", "cccc", "dddd"} {
		mustTokenize(t, tk, f.URL, prompt(p))
	}
	if n := f.calls.Load(); n != 4 {
		t.Fatalf("cached prompts were asked again: %d requests, want 4", n)
	}
	mustTokenize(t, tk, f.URL, prompt("bbbb"))
	if n := f.calls.Load(); n != 5 {
		t.Fatalf("evicted prompt was not asked again: %d requests, want 5", n)
	}
	for metric, v := range map[string]struct{ got, want int }{
		"evictions": {count(t, tk.m.evictions), 2},
		"tokens":    {count(t, tk.m.cachedTokens), 12},
		"bytes":     {count(t, tk.m.cachedBytes), 4 * budgetFor(3)},
		"entries":   {count(t, tk.m.cachedEntries), 3},
		"hits":      {count(t, tk.m.hits), 4},
		"misses":    {count(t, tk.m.misses), 5},
	} {
		if v.got != v.want {
			t.Errorf("%s = %d, want %d", metric, v.got, v.want)
		}
	}
}

func TestResultsTheBudgetCannotHoldAreNotCached(t *testing.T) {
	tests := []struct{ name, body string }{
		{"larger than the cache", `{"model":"m","prompt":"abcdefgh","add_special_tokens":false}`},
		{"empty", `{"model":"m","prompt":"","add_special_tokens":false}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVLLM(t, "m")
			tk, _ := newTestTokenizer(t, Config{CacheMaxTokens: budgetFor(1)})
			first := mustTokenize(t, tk, f.URL, tt.body)
			wantTokens(t, mustTokenize(t, tk, f.URL, tt.body), first)
			if n := f.calls.Load(); n != 2 {
				t.Fatalf("server received %d requests, want 2", n)
			}
			if n := count(t, tk.m.cachedEntries); n != 0 {
				t.Fatalf("cache holds %d entries, want 0", n)
			}
		})
	}
}

func TestReturnedSlicesCannotGrowIntoTheCache(t *testing.T) {
	f := newFakeVLLM(t, "m")
	tk, _ := newTestTokenizer(t, Config{})
	whole := `{"model":"m","prompt":"abcdef","add_special_tokens":false}`
	first := `{"model":"m","prompt":"abcdef","add_special_tokens":false,"truncate_prompt_tokens":3,"truncation_side":"right"}`
	want := slices.Clone(mustTokenize(t, tk, f.URL, whole))

	for _, body := range []string{whole, first} {
		ids := mustTokenize(t, tk, f.URL, body)
		_ = append(ids, 0, 0, 0)
	}
	wantTokens(t, mustTokenize(t, tk, f.URL, whole), want)
}

func TestCachedIDsHoldNoSpareCapacity(t *testing.T) {
	f := newFakeVLLM(t, "m")
	tk, _ := newTestTokenizer(t, Config{})
	mustTokenize(t, tk, f.URL, `{"model":"m","prompt":"`+strings.Repeat("x", 1000)+`"}`)
	e := tk.cache.root.next
	if len(e.res.tokens) != 1001 || cap(e.res.tokens) != len(e.res.tokens) {
		t.Fatalf("cached %d ids with capacity %d, want 1001 with no spare capacity", len(e.res.tokens), cap(e.res.tokens))
	}
}

// TestCacheStaysWithinItsBudget fills a cache with many more tiny results
// than it holds, the case where what an entry takes besides its ids
// matters most, and long enough for the evictions' churn to show in the
// map, and checks on the heap that it takes no more than its budget.
func TestCacheStaysWithinItsBudget(t *testing.T) {
	const budget = 256 << 10
	tk, _ := newTestTokenizer(t, Config{})
	for _, ids := range []int{1, 5, 32} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := newCache(budget, tk.m)
		holds := budget / entryBytes(make([]uint32, ids))
		for i := range 200 * holds {
			c.store(digest{hi: uint64(i), lo: uint64(i) * 0x9e3779b97f4a7c15}, result{tokens: make([]uint32, ids)})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if heap := int(after.HeapAlloc) - int(before.HeapAlloc); heap > budget {
			t.Errorf("a cache of %d bytes holding %d results of %d ids takes %d bytes of heap", budget, len(c.entries), ids, heap)
		}
		if c.bytes > budget || len(c.entries) != holds {
			t.Errorf("a cache of %d bytes charges %d for %d results of %d ids, want %d results", budget, c.bytes, len(c.entries), ids, holds)
		}
		runtime.KeepAlive(c)
	}
}
