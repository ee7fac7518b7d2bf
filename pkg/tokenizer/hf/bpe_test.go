package hf

import (
	"slices"
	"strings"
	"testing"
)

func TestStartsWordsOnlyWhereNoTokenHoldsTheMarkAfterAnotherCharacter(t *testing.T) {
	for _, c := range []struct {
		name  string
		vocab map[string]uint32
		want  bool
	}{
		{"marks at token starts and in runs", map[string]uint32{"▁": 0, "▁▁": 1, "▁▁▁": 2, "a": 3, "▁a": 4, "ab": 5, "▁ab": 6}, true},
		{"no mark token", map[string]uint32{"▁a": 0, "a": 1}, false},
		{"a mark after a letter", map[string]uint32{"▁": 0, "a": 1, "a▁": 2}, false},
		{"a mark after a letter after a run", map[string]uint32{"▁": 0, "a": 1, "▁▁a▁": 2}, false},
		{"a mark after a byte token's text", map[string]uint32{"▁": 0, "<0x41>▁": 1}, false},
		{"two tokens with one id", map[string]uint32{"▁": 0, "a": 1, "b": 1}, false},
	} {
		if got := startsWords(c.vocab); got != c.want {
			t.Errorf("%s: startsWords(%v) = %v, want %v", c.name, c.vocab, got, c.want)
		}
	}
}

// mergedWhole returns the ids of word merged as one list of symbols: what
// appendWord does without splitWords.
func mergedWhole(m *bpe, word string) []uint32 {
	sc := &scratch{syms: m.initial(nil, word)}
	m.mergeAll(sc)
	var ids []uint32
	for i := int32(0); i >= 0 && int(i) < len(sc.syms); i = sc.syms[i].next {
		ids = append(ids, sc.syms[i].id)
	}
	return ids
}

// normalized returns text as tk's normalizer hands it to the model.
func normalized(tk *Tokenizer, text string) string {
	if tk.normalize == nil {
		return text
	}
	return tk.normalize(text)
}

// splitWordTexts are texts whose normalized words run past the word
// cache's bound, with what can sit at a split: runs of spaces, the mark
// itself in the input, characters outside the vocabulary (byte fallback),
// line breaks and tabs, and a long run without a space.
func splitWordTexts() []string {
	return []string{
		strings.Repeat("the quick brown fox jumps over a lazy dog ", 40),
		"words   with\t\tgaps    of  every     width      and\n\n\nlines " + strings.Repeat("x ", 40),
		"literal ▁marks ▁▁in the ▁▁▁ text▁ and▁▁between " + strings.Repeat("▁", 30) + " end",
		"rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 𓁐 before spaces: 𓀀 𓀀  𓀀   " + strings.Repeat("😀 ", 20),
		"    leading spaces and trailing ones " + strings.Repeat("ab ", 30) + "    ",
		strings.Repeat("nospacesatallinthislongword", 10),
		"code:\n\tfor i := 0; i < 10; i++ {\n\t\tx += i\n\t}\n" + strings.Repeat("    indent\n", 12),
		"中文 字符 和 日本語 の テキスト " + strings.Repeat("한국어 ", 20),
	}
}

func TestSplitWordsMergeAsTheWholeWord(t *testing.T) {
	for model, want := range map[string]bool{"llama2": true, "llama3": false, "qwen3": false} {
		if got := loadModel(t, model).model.splitWords; got != want {
			t.Errorf("%s: splitWords = %v, want %v", model, got, want)
		}
	}
	tk := loadModel(t, "llama2")
	texts := splitWordTexts()
	for _, c := range readGolden(t, "llama2").Texts {
		texts = append(texts, c.Text)
	}
	split := 0
	for _, text := range texts {
		word := normalized(tk, text)
		if len(word) > maxCachedWord && wordStartAfterOther(word, 1) >= 0 {
			split++
		}
		b := unbounded()
		got, want := tk.model.appendWord(nil, word, &b), mergedWhole(tk.model, word)
		if !slices.Equal(got, want) {
			t.Errorf("%s: merged a piece at a time: %s", quote(text), firstDiff(got, want))
		}
	}
	if split < len(splitWordTexts())-1 {
		t.Errorf("%d texts split into pieces, want at least %d", split, len(splitWordTexts())-1)
	}
}

// FuzzSplitWordsMergeAsTheWholeWord checks, on Llama 2's vocabulary, that a
// long word merged a piece at a time gives the ids of the word merged
// whole.
func FuzzSplitWordsMergeAsTheWholeWord(f *testing.F) {
	tk := loadModel(f, "llama2")
	for _, text := range splitWordTexts() {
		f.Add(text)
	}
	f.Fuzz(func(t *testing.T, text string) {
		word := normalized(tk, text)
		b := unbounded()
		got, want := tk.model.appendWord(nil, word, &b), mergedWhole(tk.model, word)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: merged a piece at a time: %s", quote(text), firstDiff(got, want))
		}
	})
}
