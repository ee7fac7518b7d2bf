package hf

import (
	"cmp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is a token of tokenizer.json's added_tokens: matched in the
// text before the model sees it, and never split.
type addedToken struct {
	Content    string `json:"content"`
	ID         uint32 `json:"id"`
	Special    bool   `json:"special"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
}

// matcher finds added tokens in a text: leftmost first, and the longest
// of those that start there, as Hugging Face's AddedVocabulary does.
type matcher struct {
	byFirst [256][]addedToken // longest first
	// only is the first byte of every token when they all share it, -1
	// otherwise.
	only int
}

func newMatcher(tokens []addedToken) *matcher {
	if len(tokens) == 0 {
		return nil
	}
	m := &matcher{only: -2}
	for _, t := range tokens {
		if t.Content == "" {
			continue
		}
		b := t.Content[0]
		switch {
		case m.only == -2:
			m.only = int(b)
		case m.only != int(b):
			m.only = -1
		}
		m.byFirst[b] = append(m.byFirst[b], t)
	}
	if m.only == -2 {
		return nil
	}
	for b := range m.byFirst {
		slices.SortStableFunc(m.byFirst[b], func(x, y addedToken) int { return cmp.Compare(len(y.Content), len(x.Content)) })
	}
	return m
}

// next finds the first added token in s at or after from. It returns the
// token and the span it takes, whitespace it strips included; ok is false
// when there is none. A nil matcher finds none.
func (m *matcher) next(s string, from int) (tok addedToken, start, end int, ok bool) {
	if m == nil {
		return tok, 0, 0, false
	}
	for i := from; i < len(s); {
		j := i
		if m.only >= 0 {
			k := strings.IndexByte(s[i:], byte(m.only))
			if k < 0 {
				return tok, 0, 0, false
			}
			j = i + k
		} else {
			for j < len(s) && m.byFirst[s[j]] == nil {
				j++
			}
			if j == len(s) {
				return tok, 0, 0, false
			}
		}
		for _, t := range m.byFirst[s[j]] {
			if !strings.HasPrefix(s[j:], t.Content) {
				continue
			}
			e := j + len(t.Content)
			if t.SingleWord && (j > 0 && isWordChar(lastRune(s[:j])) || e < len(s) && isWordChar(firstRune(s[e:]))) {
				continue
			}
			start, end = j, e
			if t.LStrip {
				start = len(strings.TrimRightFunc(s[:j], unicode.IsSpace))
			}
			if t.RStrip {
				end = len(s) - len(strings.TrimLeftFunc(s[e:], unicode.IsSpace))
			}
			return t, start, end, true
		}
		i = j + 1
	}
	return tok, 0, 0, false
}

func isWordChar(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

func lastRune(s string) rune {
	r, _ := utf8.DecodeLastRuneInString(s)
	return r
}

func firstRune(s string) rune {
	r, _ := utf8.DecodeRuneInString(s)
	return r
}
