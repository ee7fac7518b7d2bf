package hf

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// letters returns n letters without a space or a repeat that the merges
// could take whole: one word to every pre-tokenizer.
func letters(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		b.WriteByte(byte('a' + (i*7+i/26)%26))
	}
	return b.String()
}

func TestEncodeContextMatchesEncode(t *testing.T) {
	for _, model := range referenceModels {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			// Texts that hold no word longer than the bound, the longest
			// with room for a prefix space or mark.
			texts := []string{letters(MaxWordBytes - 8), "spaced " + letters(MaxWordBytes-8) + " out", benchText(7, 256<<10)}
			// The reference's texts: those longer than the bound may hold
			// a longer word, and be refused.
			var mayRefuse []string
			for _, c := range readGolden(t, model).Texts {
				if len(c.Text) <= MaxWordBytes-8 {
					texts = append(texts, c.Text)
				} else {
					mayRefuse = append(mayRefuse, c.Text)
				}
			}
			for _, text := range slices.Concat(texts, mayRefuse) {
				tk.segments = newSegmentCache(DefaultSegmentCacheBytes)
				got, err := tk.EncodeContext(context.Background(), text, true)
				if errors.Is(err, ErrWordTooLong) && slices.Contains(mayRefuse, text) {
					continue
				}
				if err != nil {
					t.Fatalf("EncodeContext(%s): %v", quote(text), err)
				}
				if want := tk.Encode(text, true); !slices.Equal(got, want) {
					t.Errorf("EncodeContext(%s): %s", quote(text), firstDiff(got, want))
				}
			}
		})
	}
}

func TestEncodeContextRefusesAWordLongerThanTheBound(t *testing.T) {
	for _, model := range referenceModels {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			for _, text := range []string{
				letters(MaxWordBytes + 1),
				"a short start, then " + letters(4*MaxWordBytes) + " and an end",
				// For Llama 2 one word holds the whole segment, merged a
				// piece at a time: the long piece is the one refused.
				strings.Repeat("many short words ", 200) + letters(MaxWordBytes+1),
			} {
				ids, err := tk.EncodeContext(context.Background(), text, false)
				if !errors.Is(err, ErrWordTooLong) || ids != nil {
					t.Errorf("EncodeContext(%s) = %d ids, %v; want ErrWordTooLong", quote(text), len(ids), err)
				}
			}
		})
	}
}

// countingContext reports itself canceled from its limit-th look at Err
// on, and counts the looks.
type countingContext struct {
	context.Context
	limit int64
	looks atomic.Int64
}

func (c *countingContext) Err() error {
	if c.looks.Add(1) >= c.limit {
		return context.Canceled
	}
	return nil
}

func TestEncodeContextLooksAtTheContextAsItGoes(t *testing.T) {
	const size = 512 << 10
	for _, model := range referenceModels {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			// One segment, with no added token to stop at: the looks
			// happen within it.
			text := benchText(11, size)
			tk.segments = newSegmentCache(DefaultSegmentCacheBytes)
			never := &countingContext{Context: context.Background(), limit: 1 << 62}
			if _, err := tk.EncodeContext(never, text, false); err != nil {
				t.Fatal(err)
			}
			if n, want := never.looks.Load(), int64(size/checkEvery); n < want {
				t.Fatalf("%d looks at the context in %d bytes, want at least %d", n, size, want)
			}

			tk.segments = newSegmentCache(DefaultSegmentCacheBytes)
			ctx := &countingContext{Context: context.Background(), limit: 3}
			ids, err := tk.EncodeContext(ctx, text, false)
			if !errors.Is(err, context.Canceled) || ids != nil {
				t.Fatalf("EncodeContext with a context canceled midway: %d ids, %v", len(ids), err)
			}
			if n := ctx.looks.Load(); n != 3 {
				t.Errorf("%d looks at the context, want 3: it stops at the first that sees it canceled", n)
			}
			// What was encoded before the stop was not cached as the
			// segment's ids.
			if got, want := tk.Encode(text, false), loadFresh(t, model).Encode(text, false); !slices.Equal(got, want) {
				t.Errorf("Encode after a stopped EncodeContext: %s", firstDiff(got, want))
			}
		})
	}
}

// loadFresh loads model's tokenizer anew, with empty caches.
func loadFresh(t *testing.T, model string) *Tokenizer {
	t.Helper()
	tk, err := Load(modelsDir(t) + "/" + model)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// byteLevelTokenizer returns a byte-level tokenizer.json of the 256 byte
// tokens, without merges, and one added token.
func byteLevelTokenizer(t *testing.T, added string) []byte {
	t.Helper()
	vocab := map[string]int{}
	for b, r := range byteLevelChars {
		vocab[string(r)] = b
	}
	f, err := json.Marshal(map[string]any{
		"added_tokens":  []map[string]any{{"content": added, "id": 256, "special": true}},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestParseRefusesAnAddedTokenLongerThanTheBound(t *testing.T) {
	if _, err := Parse(byteLevelTokenizer(t, strings.Repeat("a", MaxAddedTokenBytes)), nil, ""); err != nil {
		t.Fatalf("an added token of %d bytes: %v", MaxAddedTokenBytes, err)
	}
	_, err := Parse(byteLevelTokenizer(t, strings.Repeat("a", MaxAddedTokenBytes+1)), nil, "")
	if err == nil || !strings.Contains(err.Error(), "added token 256") {
		t.Fatalf("an added token of %d bytes: %v, want it refused", MaxAddedTokenBytes+1, err)
	}
}

func TestEncodeContextLooksAtTheContextWhileFindingAddedTokens(t *testing.T) {
	// Every position of the text starts the longest added token allowed
	// without completing it: finding none takes a step per byte of the
	// token at each.
	tk, err := Parse(byteLevelTokenizer(t, strings.Repeat("a", MaxAddedTokenBytes-1)+"b"), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("a", 64<<10)
	ctx := &countingContext{Context: context.Background(), limit: 3}
	ids, err := tk.EncodeContext(ctx, text, false)
	if !errors.Is(err, context.Canceled) || ids != nil {
		t.Fatalf("EncodeContext with a context canceled midway: %d ids, %v; want it stopped", len(ids), err)
	}
	if n := ctx.looks.Load(); n != 3 {
		t.Errorf("%d looks at the context, want 3: it stops at the first that sees it canceled", n)
	}
}
