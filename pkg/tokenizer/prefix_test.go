package tokenizer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// TestFollowUpTurnIsAnsweredFromItsMessagePrefix sends a conversation's
// turns to a tokenizer without files: the first turn waits for the engine,
// the next ones are answered at once with the ids of the turn before,
// which are the head of the engine's ids for the whole turn, and the whole
// turn is tokenized in the background for later.
func TestFollowUpTurnIsAnsweredFromItsMessagePrefix(t *testing.T) {
	eng := startEngine(t, nil)
	tk, reg := newTestTokenizer(t, Config{})
	exact, _ := newTestTokenizer(t, Config{NoPrefixReuse: true})

	prev := mustTokenize(t, tk, eng.url, conversation(1))
	for turns := 2; turns <= 4; turns++ {
		body := conversation(turns)
		got := mustTokenize(t, tk, eng.url, body)
		if !slices.Equal(got, prev) {
			t.Fatalf("turn %d: got %d ids, want the %d ids of the turn before", turns, len(got), len(prev))
		}
		whole := mustTokenize(t, exact, eng.url, body)
		if !slices.Equal(whole[:len(got)], got) {
			t.Fatalf("turn %d: the prefix's ids are not the head of the whole turn's", turns)
		}
		testsupport.Eventually(t, "the whole turn to be tokenized in the background", func() bool {
			return testsupport.MetricValue(t, reg, "kvgate_tokenizer_calls_total", map[string]string{"result": "ok"}) == float64(turns)
		})
		if ids, err := tk.TokenizeChat(context.Background(), eng.url, chatRequest(t, body)); err != nil || !slices.Equal(ids, whole) {
			t.Fatalf("turn %d again: %v, %d ids; want the whole turn's %d ids from the cache", turns, err, len(ids), len(whole))
		}
		prev = whole
	}
	if n := count(t, tk.m.partialHits); n != 3 {
		t.Errorf("cache_partial_hits_total = %d, want 3", n)
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_tokenizer_calls_total", map[string]string{"result": "ok"}); n != 4 {
		t.Errorf("calls_total{result=ok} = %v, want one per turn", n)
	}
}

// TestPrefixIsNotUsedWhereItWouldBeWrong covers the requests that must
// wait for their own ids: a truncated prompt, other template fields, and a
// first turn.
func TestPrefixIsNotUsedWhereItWouldBeWrong(t *testing.T) {
	eng := startEngine(t, nil)
	tk, _ := newTestTokenizer(t, Config{})
	mustTokenize(t, tk, eng.url, conversation(1))
	two := conversation(2)
	for name, body := range map[string]string{
		"truncated":            two[:len(two)-1] + `,"truncate_prompt_tokens":10}`,
		"no generation prompt": two[:len(two)-1] + `,"add_generation_prompt":false}`,
		"template kwargs":      two[:len(two)-1] + `,"chat_template_kwargs":{"x":1}}`,
		"other first message":  `{"model":"` + localModelName + `","messages":[{"role":"user","content":"new"},{"role":"user","content":"chat"}]}`,
	} {
		before := eng.calls.Load()
		mustTokenize(t, tk, eng.url, body)
		if eng.calls.Load() != before+1 {
			t.Errorf("%s: not tokenized by the engine on the request path", name)
		}
	}
	if n := count(t, tk.m.partialHits); n != 0 {
		t.Errorf("cache_partial_hits_total = %d, want 0", n)
	}
}

// TestWithoutABackgroundSlotTheTurnWaits fills the only background slot
// with a call the engine holds, then checks that the next follow-up turn
// waits for its whole tokenization and counts the drop.
func TestWithoutABackgroundSlotTheTurnWaits(t *testing.T) {
	f := newFakeVLLM(t, "m")
	tk, _ := newTestTokenizer(t, Config{MaxBackgroundCalls: 1})
	first := func(c string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + c + `"}]}`
	}
	second := func(c string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + c + `"},{"role":"assistant","content":"a"},{"role":"user","content":"b"}]}`
	}
	mustTokenize(t, tk, f.URL, first("x"))
	mustTokenize(t, tk, f.URL, first("y"))
	f.block = make(chan struct{})
	partial := mustTokenize(t, tk, f.URL, second("x")) // takes the slot; its call is held
	<-f.arrived
	if n := count(t, tk.m.partialHits); n != 1 || len(partial) == 0 {
		t.Fatalf("partial hits %d, ids %v: want the first follow-up answered from its prefix", n, partial)
	}
	done := make(chan []uint32, 1)
	go func() { done <- mustTokenize(t, tk, f.URL, second("y")) }()
	testsupport.Eventually(t, "the second follow-up to find no slot", func() bool { return count(t, tk.m.backgroundDropped) == 1 })
	close(f.block)
	got := <-done
	exact, _ := newTestTokenizer(t, Config{NoPrefixReuse: true})
	wantTokens(t, got, mustTokenize(t, exact, f.URL, second("y")))
}

// manyMessages returns a chat of model m whose first message is first,
// followed by n-1 more.
func manyMessages(first string, n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[{"role":"user","content":"` + first + `"}`)
	for i := 1; i < n; i++ {
		fmt.Fprintf(&b, `,{"role":"user","content":"m%d"}`, i)
	}
	b.WriteString(`]}`)
	return b.String()
}

func TestPrefixesAreLookedUpAmongTheLastMessagesOnly(t *testing.T) {
	f := newFakeVLLM(t, "m")
	tk, _ := newTestTokenizer(t, Config{})
	mustTokenize(t, tk, f.URL, manyMessages("first", 1))

	// Its one-message prefix leaves out one message more than looked up.
	before := f.calls.Load()
	mustTokenize(t, tk, f.URL, manyMessages("first", maxPrefixMessages+2))
	if n := count(t, tk.m.partialHits); n != 0 || f.calls.Load() != before+1 {
		t.Errorf("a chat whose cached prefix leaves out %d messages: %d partial hits, %d calls; want its own call on the request path",
			maxPrefixMessages+1, n, f.calls.Load()-before)
	}
	// This one leaves out as many as are looked up.
	mustTokenize(t, tk, f.URL, manyMessages("first", maxPrefixMessages+1))
	if n := count(t, tk.m.partialHits); n != 1 {
		t.Fatalf("a chat whose cached prefix leaves out %d messages: %d partial hits, want 1", maxPrefixMessages, n)
	}

	// However many messages a chat holds, it costs as many lookups, in one
	// hold of the cache's lock, and no allocation.
	huge := chatRequest(t, manyMessages("x", 100_000))
	var buf [maxPrefixMessages]digest
	if n := len(huge.prefixKeys(tk.seed, &buf)); n != maxPrefixMessages {
		t.Errorf("a chat of 100000 messages has %d prefix keys to look up, want %d", n, maxPrefixMessages)
	}
	key := huge.key(tk.seed)
	if allocs := testing.AllocsPerRun(3, func() { tk.prefix(huge, key, nil, false, f.URL) }); allocs != 0 {
		t.Errorf("looking up the prefixes of a chat of 100000 messages made %v allocations, want none", allocs)
	}
}
