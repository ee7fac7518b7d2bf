package tokenizer

import (
	"strings"
	"testing"
)

// TestTruncationKeepsWhatVLLMKeeps checks every truncation against the
// whole tokenization, all from one cached call.
func TestTruncationKeepsWhatVLLMKeeps(t *testing.T) {
	f := newFakeVLLM(t, "m")
	f.maxModelLen = 20
	tk, _ := newTestTokenizer(t, Config{})
	whole := fakeEncode("abcdefghij", false)
	const prompt = `{"model":"m","prompt":"abcdefghij","add_special_tokens":false`
	tests := []struct {
		name   string
		fields string
		want   []uint32
	}{
		{"none", ``, whole},
		{"last by default", `,"truncate_prompt_tokens":4`, whole[6:]},
		{"left keeps the last", `,"truncate_prompt_tokens":4,"truncation_side":"left"`, whole[6:]},
		{"right keeps the first", `,"truncate_prompt_tokens":4,"truncation_side":"right"`, whole[:4]},
		{"as long as the prompt", `,"truncate_prompt_tokens":10`, whole},
		{"longer than the prompt", `,"truncate_prompt_tokens":50`, whole},
		{"zero", `,"truncate_prompt_tokens":0`, whole[:0]},
		{"context length minus max_tokens", `,"truncate_prompt_tokens":-1,"max_tokens":14`, whole[4:]},
		{"context length minus default max_tokens", `,"truncate_prompt_tokens":-1`, whole[6:]},
		{"context length on the right", `,"truncate_prompt_tokens":-1,"max_tokens":15,"truncation_side":"right"`, whole[:5]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantTokens(t, mustTokenize(t, tk, f.URL, prompt+tt.fields+`}`), tt.want)
		})
	}
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("server received %d requests, want 1 shared by every truncation", n)
	}
}

func TestChatTruncationUsesMaxCompletionTokensFirst(t *testing.T) {
	f := newFakeVLLM(t, "m")
	f.maxModelLen = 40
	tk, _ := newTestTokenizer(t, Config{})
	whole := fakeEncode(userHi+genPrompt, false)
	const chat = `{"model":"m","messages":[{"role":"user","content":"hi"}],"truncate_prompt_tokens":-1`
	tests := []struct {
		name   string
		fields string
		want   []uint32
	}{
		{"max_completion_tokens", `,"max_completion_tokens":30,"max_tokens":10`, whole[len(whole)-10:]},
		{"max_tokens", `,"max_tokens":30`, whole[len(whole)-10:]},
		{"no max tokens", ``, whole},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantTokens(t, mustTokenize(t, tk, f.URL, chat+tt.fields+`}`), tt.want)
		})
	}
}

func TestTruncationOfTokenIDsNeedsNoCall(t *testing.T) {
	f := newFakeVLLM(t, "m")
	tk, _ := newTestTokenizer(t, Config{})
	got := mustTokenize(t, tk, f.URL, `{"model":"m","prompt":[1,2,3,4],"truncate_prompt_tokens":2}`)
	wantTokens(t, got, []uint32{3, 4})
	if n := f.calls.Load(); n != 0 {
		t.Fatalf("server received %d requests, want none", n)
	}
}

func TestTruncationVLLMRejectsIsAnInputError(t *testing.T) {
	tests := []struct {
		name, body, contains string
		calls                int64
	}{
		{"unknown side", `{"model":"m","prompt":"abc","truncate_prompt_tokens":2,"truncation_side":"middle"}`, "truncation_side", 0},
		{"below -1", `{"model":"m","prompt":"abc","truncate_prompt_tokens":-2}`, "below -1", 0},
		{"chat below -1", `{"model":"m","messages":[],"truncate_prompt_tokens":-2}`, "below -1", 0},
		{"context length of token ids", `{"model":"m","prompt":[1,2],"truncate_prompt_tokens":-1}`, "context length", 0},
		{"max_tokens beyond the context", `{"model":"m","prompt":"abc","truncate_prompt_tokens":-1,"max_tokens":5000}`, "exceed", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVLLM(t, "m")
			tk, _ := newTestTokenizer(t, Config{})
			_, err := tokenize(t, tk, f.URL, tt.body)
			if e := reasonOf(t, err); e.Reason != ReasonInput || !strings.Contains(err.Error(), tt.contains) {
				t.Fatalf("error %v: reason %q, want input containing %q", err, e.Reason, tt.contains)
			}
			if n := f.calls.Load(); n != tt.calls {
				t.Fatalf("server received %d requests, want %d", n, tt.calls)
			}
		})
	}
}
