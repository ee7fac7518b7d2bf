package hf

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// merge is the result of merging a pair of tokens: its rank (lower merges
// first) and the id of the merged token.
type merge struct{ rank, id uint32 }

func pairKey(left, right uint32) uint64 { return uint64(left)<<32 | uint64(right) }

// bpe is a byte-pair encoding model: a vocabulary and ranked merges over
// token ids.
type bpe struct {
	vocab  map[string]uint32 // token text, raw bytes for a byte-level model
	merges map[uint64]merge
	// byteLevel models start every word from its bytes; others from its
	// characters, falling back to byteIDs (the <0xXX> tokens) when
	// byteFallback is set, or to unk.
	byteLevel    bool
	byteFallback bool
	byteIDs      [256]uint32
	hasUnk       bool
	unk          uint32
	fuseUnk      bool
	// ignoreMerges takes a word that is a token of the vocabulary as that
	// token, without merging.
	ignoreMerges bool
	// splitWords: the vocabulary holds SentencePiece's word-start mark
	// (wordStart) as a token, and no token holds the mark after another
	// character (see startsWords). No merge can then join a symbol to a
	// mark that follows another character, so a word's merges are those
	// of its pieces, split before each such mark: a long word (a whole
	// segment, for Llama 2's and Mistral's tokenizers, which do not
	// pre-tokenize) is merged a piece at a time, each piece through the
	// word cache, rather than as one list of thousands of symbols.
	splitWords bool
	words      *wordCache
}

// wordStart is SentencePiece's mark of a word's start (U+2581), which its
// normalizer writes for each space.
const wordStart = "\u2581"

// startsWords reports whether vocab holds wordStart as a token and holds
// it nowhere after another character, each id naming one token: then a
// symbol that ends before a mark, where the mark follows another
// character, never merges with the symbol that starts at the mark.
func startsWords(vocab map[string]uint32) bool {
	if _, ok := vocab[wordStart]; !ok {
		return false
	}
	ids := make(map[uint32]struct{}, len(vocab))
	for tok, id := range vocab {
		ids[id] = struct{}{}
		if wordStartAfterOther(tok, 1) >= 0 {
			return false
		}
	}
	return len(ids) == len(vocab)
}

// wordStartAfterOther returns the index of the first wordStart in s at or
// after from that follows a character other than wordStart, or -1.
func wordStartAfterOther(s string, from int) int {
	for from < len(s) {
		i := strings.Index(s[from:], wordStart)
		if i < 0 {
			return -1
		}
		i += from
		if i > 0 && !strings.HasSuffix(s[:i], wordStart) {
			return i
		}
		from = i + len(wordStart)
	}
	return -1
}

// symbol is a token of a word being merged: a doubly linked list over the
// word's initial symbols, in place.
type symbol struct {
	id         uint32
	prev, next int32 // -1 at the ends
	dead       bool
}

// candidate is a merge of symbols[pos] with its next symbol.
type candidate struct {
	rank, id    uint32
	pos         int32
	left, right uint32
}

func (a candidate) less(b candidate) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

// scratch is the working memory of one word's merges, pooled.
type scratch struct {
	syms []symbol
	heap []candidate
}

var scratches = sync.Pool{New: func() any { return &scratch{} }}

// appendWord appends the ids of word, one pre-tokenized piece, to dst. It
// stops, setting b.err, at a piece to merge longer than b.maxWord.
func (m *bpe) appendWord(dst []uint32, word string, b *bound) []uint32 {
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(dst, id)
		}
	}
	if m.splitWords && len(word) > maxCachedWord {
		// A word here can be a whole segment: its pieces count towards
		// the next look at the context.
		for start := 0; start < len(word); {
			end := wordStartAfterOther(word, start+1)
			if end < 0 {
				end = len(word)
			}
			if !b.spend(end - start) {
				return dst
			}
			dst = m.appendMerged(dst, word[start:end], b)
			start = end
		}
		return dst
	}
	return m.appendMerged(dst, word, b)
}

// appendMerged appends the ids of word after its merges, from the word
// cache when it holds them. It merges no word longer than b.maxWord: it
// sets b.err instead.
func (m *bpe) appendMerged(dst []uint32, word string, b *bound) []uint32 {
	cacheable := len(word) <= maxCachedWord
	if cacheable {
		if ids, ok := m.words.get(word); ok {
			return append(dst, ids...)
		}
	} else if len(word) > b.maxWord {
		b.err = ErrWordTooLong
		return dst
	}
	sc := scratches.Get().(*scratch)
	sc.syms = m.initial(sc.syms[:0], word)
	m.mergeAll(sc)
	n := len(dst)
	for i := int32(0); i >= 0 && int(i) < len(sc.syms); i = sc.syms[i].next {
		dst = append(dst, sc.syms[i].id)
	}
	if cap(sc.syms) <= 1<<12 {
		scratches.Put(sc)
	}
	if cacheable {
		m.words.put(word, append([]uint32(nil), dst[n:]...))
	}
	return dst
}

// initial returns word's initial symbols, linked.
func (m *bpe) initial(syms []symbol, word string) []symbol {
	add := func(id uint32) {
		n := int32(len(syms))
		syms = append(syms, symbol{id: id, prev: n - 1, next: n + 1})
	}
	if m.byteLevel {
		for i := 0; i < len(word); i++ {
			add(m.byteIDs[word[i]])
		}
	} else {
		unkRun := false
		for i := 0; i < len(word); {
			_, n := utf8.DecodeRuneInString(word[i:])
			if id, ok := m.vocab[word[i:i+n]]; ok {
				add(id)
				unkRun = false
			} else if m.byteFallback {
				for j := i; j < i+n; j++ {
					add(m.byteIDs[word[j]])
				}
				unkRun = false
			} else if m.hasUnk && !(m.fuseUnk && unkRun) {
				add(m.unk)
				unkRun = true
			}
			i += n
		}
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

// mergeAll applies the merges to sc.syms, lowest rank first and leftmost
// first among equal ranks, as Hugging Face's BPE does.
func (m *bpe) mergeAll(sc *scratch) {
	syms := sc.syms
	if len(syms) < 2 {
		return
	}
	h := sc.heap[:0]
	push := func(pos int32) {
		next := syms[pos].next
		if next < 0 {
			return
		}
		mg, ok := m.merges[pairKey(syms[pos].id, syms[next].id)]
		if !ok {
			return
		}
		h = append(h, candidate{rank: mg.rank, id: mg.id, pos: pos, left: syms[pos].id, right: syms[next].id})
		for i := len(h) - 1; i > 0; {
			parent := (i - 1) / 2
			if !h[i].less(h[parent]) {
				break
			}
			h[i], h[parent] = h[parent], h[i]
			i = parent
		}
	}
	pop := func() candidate {
		top := h[0]
		last := len(h) - 1
		h[0] = h[last]
		h = h[:last]
		for i := 0; ; {
			l, r, small := 2*i+1, 2*i+2, i
			if l < len(h) && h[l].less(h[small]) {
				small = l
			}
			if r < len(h) && h[r].less(h[small]) {
				small = r
			}
			if small == i {
				break
			}
			h[i], h[small] = h[small], h[i]
			i = small
		}
		return top
	}
	for i := range syms {
		push(int32(i))
	}
	for len(h) > 0 {
		c := pop()
		s := &syms[c.pos]
		if s.dead || s.id != c.left || s.next < 0 || syms[s.next].id != c.right {
			continue
		}
		right := s.next
		s.id = c.id
		syms[right].dead = true
		s.next = syms[right].next
		if s.next >= 0 {
			syms[s.next].prev = c.pos
		}
		if s.prev >= 0 {
			push(s.prev)
		}
		push(c.pos)
	}
	sc.heap = h[:0]
}
