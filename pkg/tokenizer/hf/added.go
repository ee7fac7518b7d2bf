package hf

import (
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
// of those that start there, as Hugging Face's AddedVocabulary does. The
// tokens are kept in a trie of their bytes, so that a position costs a
// step per byte the text shares with some token, however many tokens
// share a first byte (Llama 3's 256 all start with "<|").
type matcher struct {
	tokens []addedToken
	// root has the child of the root node (0) for each first byte, 0 for
	// none; nodes are numbered from 1.
	root  [256]int32
	nodes []trieNode
	// only is the first byte of every token when they all share it, -1
	// otherwise.
	only int
}

// trieNode is a node of a matcher's trie: its children, and the tokens
// (indexes into tokens, in the order given) whose content ends there.
type trieNode struct {
	kids []trieEdge
	ends []int32
}

type trieEdge struct {
	b    byte
	node int32
}

func newMatcher(tokens []addedToken) *matcher {
	m := &matcher{nodes: []trieNode{{}}, only: -2}
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
		node := int32(0)
		for k := 0; k < len(t.Content); k++ {
			node = m.child(node, t.Content[k], true)
		}
		m.nodes[node].ends = append(m.nodes[node].ends, int32(len(m.tokens)))
		m.tokens = append(m.tokens, t)
	}
	if m.only == -2 {
		return nil
	}
	return m
}

// child returns node's child on byte b, adding it when add is set; 0 when
// there is none. Below the root, nodes have few children (a handful after
// "<|"), which a scan finds sooner than a map.
func (m *matcher) child(node int32, b byte, add bool) int32 {
	if node == 0 {
		if c := m.root[b]; c != 0 || !add {
			return c
		}
	} else {
		for _, e := range m.nodes[node].kids {
			if e.b == b {
				return e.node
			}
		}
		if !add {
			return 0
		}
	}
	c := int32(len(m.nodes))
	m.nodes = append(m.nodes, trieNode{})
	if node == 0 {
		m.root[b] = c
	} else {
		m.nodes[node].kids = append(m.nodes[node].kids, trieEdge{b, c})
	}
	return c
}

// MaxAddedTokenBytes bounds the content of an added token, which Parse
// refuses beyond it: finding added tokens costs, per byte of text, up to a
// step per byte of the longest token. Real tokenizers' added tokens are
// markers of a few dozen bytes (Llama 3's longest has 30).
const MaxAddedTokenBytes = 256

// next finds the first added token in s at or after from. It returns the
// token and the span it takes, whitespace it strips included; ok is false
// when there is none, or when b stopped the search: each step of the
// search is spent from b (see bound.spend). A nil matcher finds none.
func (m *matcher) next(s string, from int, b *bound) (tok addedToken, start, end int, ok bool) {
	if m == nil {
		return tok, 0, 0, false
	}
	var buf [16]int32
	for i := from; i < len(s); {
		j := i
		if m.only >= 0 {
			k := strings.IndexByte(s[i:], byte(m.only))
			if k < 0 {
				return tok, 0, 0, false
			}
			j = i + k
		} else {
			for j < len(s) && m.root[s[j]] == 0 {
				j++
			}
			if j == len(s) {
				return tok, 0, 0, false
			}
		}
		// The nodes along s[j:] where tokens end, shortest first.
		matched := buf[:0]
		k := j
		for node := int32(0); k < len(s); k++ {
			if node = m.child(node, s[k], false); node == 0 {
				break
			}
			if len(m.nodes[node].ends) > 0 {
				matched = append(matched, node)
			}
		}
		// The walk's steps count against b's budget like bytes encoded.
		if !b.spend(k - j + 1) {
			return tok, 0, 0, false
		}
		for n := len(matched) - 1; n >= 0; n-- {
			for _, ti := range m.nodes[matched[n]].ends {
				t := m.tokens[ti]
				if start, end, ok := t.span(s, j); ok {
					return t, start, end, true
				}
			}
		}
		i = j + 1
	}
	return tok, 0, 0, false
}

// span returns the span t takes in s where its content starts at j,
// whitespace it strips included; ok is false when t must be a single word
// and is not one there.
func (t addedToken) span(s string, j int) (start, end int, ok bool) {
	e := j + len(t.Content)
	if t.SingleWord && (j > 0 && isWordChar(lastRune(s[:j])) || e < len(s) && isWordChar(firstRune(s[e:]))) {
		return 0, 0, false
	}
	start, end = j, e
	if t.LStrip {
		start = len(strings.TrimRightFunc(s[:j], unicode.IsSpace))
	}
	if t.RStrip {
		end = len(s) - len(strings.TrimLeftFunc(s[e:], unicode.IsSpace))
	}
	return start, end, true
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
