package hf

import (
	"cmp"
	"slices"
	"strings"
	"testing"
)

// scanMatch finds the first added token in s at or after from as the
// definition reads: at each position from the left, every token that
// starts there, longest first (in the given order among equal lengths),
// the first one whose single_word condition holds (span).
func scanMatch(tokens []addedToken, s string, from int) (tok addedToken, start, end int, ok bool) {
	byLength := slices.Clone(tokens)
	slices.SortStableFunc(byLength, func(x, y addedToken) int { return cmp.Compare(len(y.Content), len(x.Content)) })
	for j := from; j < len(s); j++ {
		for _, t := range byLength {
			if t.Content == "" || !strings.HasPrefix(s[j:], t.Content) {
				continue
			}
			if start, end, ok := t.span(s, j); ok {
				return t, start, end, true
			}
		}
	}
	return tok, 0, 0, false
}

// syntheticAdded are added tokens that nest, share prefixes, repeat a
// content with other options, and start with bytes of several lengths.
var syntheticAdded = []addedToken{
	{Content: "<", ID: 1}, {Content: "<a", ID: 2, SingleWord: true}, {Content: "<ab>", ID: 3, LStrip: true},
	{Content: "<abc>", ID: 4, RStrip: true}, {Content: "ab", ID: 5, SingleWord: true}, {Content: "ab", ID: 6},
	{Content: "<|x|>", ID: 7, LStrip: true, RStrip: true}, {Content: "é", ID: 8}, {Content: "éa", ID: 9, SingleWord: true},
	{Content: "日本", ID: 10}, {Content: "", ID: 11},
}

// matchAll returns every match of m (or of the scan, when m is nil) in s,
// from the left.
func matchAll(m *matcher, tokens []addedToken, s string) [][4]int {
	var out [][4]int
	for i := 0; i < len(s); {
		var tok addedToken
		var start, end int
		var ok bool
		if m != nil {
			b := unbounded()
			tok, start, end, ok = m.next(s, i, &b)
		} else {
			tok, start, end, ok = scanMatch(tokens, s, i)
		}
		if !ok {
			break
		}
		out = append(out, [4]int{int(tok.ID), start, end, i})
		i = max(end, i+1)
	}
	return out
}

// addedSets are the token sets the matcher is checked with: the synthetic
// one and the real models' added tokens.
func addedSets(t testing.TB) map[string][]addedToken {
	sets := map[string][]addedToken{"synthetic": syntheticAdded}
	for _, model := range referenceModels {
		tk := loadModel(t, model)
		for kind, m := range map[string]*matcher{"raw": tk.rawAdded, "normalized": tk.normAdded} {
			if m != nil {
				sets[model+" "+kind] = m.tokens
			}
		}
	}
	return sets
}

func TestMatcherFindsWhatAScanFinds(t *testing.T) {
	texts := []string{
		"", "<", "<<a <ab> x<abc>  y", "ab cab ab_ ab.", "  <|x|>  z", "éa éab é", "日本語 日本",
		"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|> <|im_start|>x<|im_end|>",
		"<s> </s> <unk> <think></think> <tool_call>{}</tool_call> <|reserved_special_token_250|> <|reserved_special_token_2",
		strings.Repeat(`<div class="a"><span>x</span></div>`, 20),
	}
	for name, tokens := range addedSets(t) {
		m := newMatcher(tokens)
		for _, s := range texts {
			if got, want := matchAll(m, tokens, s), matchAll(nil, tokens, s); !slices.Equal(got, want) {
				t.Errorf("%s, %q: matches %v, a scan finds %v", name, s, got, want)
			}
		}
	}
}

// FuzzMatcherFindsWhatAScanFinds checks the trie against the scan on every
// token set.
func FuzzMatcherFindsWhatAScanFinds(f *testing.F) {
	sets := addedSets(f)
	matchers := map[string]*matcher{}
	for name, tokens := range sets {
		matchers[name] = newMatcher(tokens)
	}
	for _, s := range []string{"<ab> x", "a <|x|> b", "<|eot_id|><|im_start|>", "éa日本", "<<<abc>>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, tokens := range sets {
			if got, want := matchAll(matchers[name], tokens, s), matchAll(nil, tokens, s); !slices.Equal(got, want) {
				t.Fatalf("%s, %q: matches %v, a scan finds %v", name, s, got, want)
			}
		}
	})
}
