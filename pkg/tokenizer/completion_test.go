package tokenizer

import (
	"context"
	"errors"
	"testing"
)

// TestTokenizeCompletionPromptForms covers every shape of a single prompt:
// text is sent in vLLM's completion form (golden files under
// testdata/completion), token ids are returned without a call.
func TestTokenizeCompletionPromptForms(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		want   []uint32
		golden string // the body sent, "" when no call is expected
	}{
		{"string", `{"model":"m","prompt":"hello"}`, fakeEncode("hello", true), "string"},
		{"no_special_tokens", `{"model":"m","prompt":"hello","add_special_tokens":false}`, fakeEncode("hello", false), "no_special_tokens"},
		{"escaped_string", `{"model":"m","prompt":"h\u00e9\n\"x\""}`, fakeEncode("h\u00e9\n\"x\"", true), "escaped_string"},
		{"one_string_in_a_list", `{"model":"m","prompt":["hello"]}`, fakeEncode("hello", true), "string"},
		{"token_ids", `{"model":"m","prompt":[5,6,7]}`, []uint32{5, 6, 7}, ""},
		{"one_list_of_token_ids", `{"model":"m","prompt":[[5,6,7]]}`, []uint32{5, 6, 7}, ""},
		{"sampling_fields_ignored", `{"model":"m","prompt":"hello","max_tokens":8,"echo":true,"n":2}`, fakeEncode("hello", true), "string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVLLM(t, "m")
			tk, _ := newTestTokenizer(t, Config{})
			got, err := tk.TokenizeCompletion(context.Background(), f.URL, completionRequest(t, tt.body))
			if err != nil {
				t.Fatalf("TokenizeCompletion: %v", err)
			}
			wantTokens(t, got, tt.want)
			if tt.golden != "" {
				wantSent(t, f, "completion/"+tt.golden+".json")
			} else if n := f.calls.Load(); n != 0 {
				t.Fatalf("server received %d requests for a prompt of token ids", n)
			}
		})
	}
}

func TestTokenizeCompletionRefusesPromptsWithoutACall(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		multiple bool
	}{
		{"several_strings", `{"model":"m","prompt":["a","b"]}`, true},
		{"several_lists_of_token_ids", `{"model":"m","prompt":[[1],[2]]}`, true},
		{"no_prompt", `{"model":"m"}`, false},
		{"null_prompt", `{"model":"m","prompt":null}`, false},
		{"empty_list", `{"model":"m","prompt":[]}`, false},
		{"empty_list_of_token_ids", `{"model":"m","prompt":[[]]}`, false},
		{"number", `{"model":"m","prompt":5}`, false},
		{"object", `{"model":"m","prompt":{"text":"a"}}`, false},
		{"negative_token_id", `{"model":"m","prompt":[-1]}`, false},
		{"fractional_token_id", `{"model":"m","prompt":[1.5]}`, false},
		{"token_id_beyond_uint32", `{"model":"m","prompt":[4294967296]}`, false},
		{"mixed_list", `{"model":"m","prompt":[1,"a"]}`, false},
		{"list_of_objects", `{"model":"m","prompt":[{"a":1}]}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVLLM(t, "m")
			tk, _ := newTestTokenizer(t, Config{})
			_, err := tk.TokenizeCompletion(context.Background(), f.URL, completionRequest(t, tt.body))
			wantInputError(t, err, f, "m")
			if got := errors.Is(err, ErrMultiplePrompts); got != tt.multiple {
				t.Fatalf("errors.Is(%v, ErrMultiplePrompts) = %v, want %v", err, got, tt.multiple)
			}
		})
	}
}
