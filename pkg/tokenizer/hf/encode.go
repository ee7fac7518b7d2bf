package hf

import (
	"github.com/ardanlabs/jinja"
)

// Tokenizer encodes text and chat conversations into token ids as Hugging
// Face's tokenizers do with the same files. It is safe for concurrent use.
type Tokenizer struct {
	normalize normalizer // nil: none
	pre       preTokenizer
	model     *bpe
	post      postProcessor
	// rawAdded matches the added tokens found in the text as it is,
	// normAdded those found after normalization.
	rawAdded, normAdded *matcher
	segments            *segmentCache

	template  *jinja.Template // nil without a chat template
	specials  map[string]jinja.Value
	vocabSize uint32
}

// VocabSize returns one more than the largest token id the tokenizer
// produces: its vocabulary's and its added tokens'.
func (t *Tokenizer) VocabSize() uint32 { return t.vocabSize }

// Encode returns the token ids of text, with the post-processor's special
// tokens (a BOS, for example) when addSpecialTokens is set. Added tokens
// written in text, special ones included, are encoded as themselves.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) []uint32 {
	return t.AppendEncode(make([]uint32, 0, len(text)/3+4), text, addSpecialTokens)
}

// AppendEncode appends the ids Encode returns to dst.
func (t *Tokenizer) AppendEncode(dst []uint32, text string, addSpecialTokens bool) []uint32 {
	if addSpecialTokens {
		dst = append(dst, t.post.prefix...)
	}
	first := true
	for i := 0; i < len(text); {
		tok, start, end, ok := t.rawAdded.next(text, i)
		if !ok {
			start, end = len(text), len(text)
		}
		if start > i {
			dst = t.appendSegment(dst, text[i:start], first)
		}
		if ok {
			dst = append(dst, tok.ID)
		}
		first = false
		i = end
	}
	if addSpecialTokens {
		dst = append(dst, t.post.suffix...)
	}
	return dst
}

// appendSegment appends the ids of a text between added tokens; first
// says whether it starts the text.
func (t *Tokenizer) appendSegment(dst []uint32, seg string, first bool) []uint32 {
	if len(seg) < minCachedSegment {
		return t.encodeSegment(dst, seg, first)
	}
	key := t.segments.key(seg, first)
	if ids, ok := t.segments.get(key); ok {
		return append(dst, ids...)
	}
	n := len(dst)
	dst = t.encodeSegment(dst, seg, first)
	t.segments.put(key, dst[n:])
	return dst
}

func (t *Tokenizer) encodeSegment(dst []uint32, seg string, first bool) []uint32 {
	if t.normalize != nil {
		seg = t.normalize(seg)
	}
	emit := func(w string) { dst = t.model.appendWord(dst, w) }
	split, direct := t.pre.(splitter)
	for i := 0; i < len(seg); {
		tok, start, end, ok := t.normAdded.next(seg, i)
		if !ok {
			start, end = len(seg), len(seg)
		}
		switch {
		case start > i && direct:
			// The common case, without a call per word through emit.
			for j := i; j < start; {
				k := split(seg[:start], j)
				dst = t.model.appendWord(dst, seg[j:k])
				j = k
			}
		case start > i:
			t.pre.split(seg[i:start], first && i == 0, emit)
		}
		if ok {
			dst = append(dst, tok.ID)
		}
		i = end
	}
	return dst
}
