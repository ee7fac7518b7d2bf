package hf

import (
	"context"
	"errors"
	"math"

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

	template *jinja.Template // nil without a chat template
	// reads tells what the template's source reads that vLLM's own
	// rendering could give differently (see templateReads).
	reads     templateReads
	specials  map[string]jinja.Value
	vocabSize uint32
}

// VocabSize returns one more than the largest token id the tokenizer
// produces: its vocabulary's and its added tokens'.
func (t *Tokenizer) VocabSize() uint32 { return t.vocabSize }

// MaxWordBytes bounds the words EncodeContext merges: the pieces the
// pre-tokenizer cuts a text into, a run of letters or of white space for
// example. Merging a word costs more per byte the longer it is (see
// Bounds in the package documentation), and real text has no word nearly
// this long.
const MaxWordBytes = 2 << 10

// ErrWordTooLong is the error of EncodeContext for a text holding a word
// longer than MaxWordBytes.
var ErrWordTooLong = errors.New("the text holds a word longer than hf.MaxWordBytes")

// checkEvery is how many bytes of text EncodeContext encodes between two
// looks at its context.
const checkEvery = 16 << 10

// Encode returns the token ids of text, with the post-processor's special
// tokens (a BOS, for example) when addSpecialTokens is set. Added tokens
// written in text, special ones included, are encoded as themselves. Its
// work is bounded by the length of text alone: text from a request should
// go to EncodeContext.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) []uint32 {
	return t.AppendEncode(make([]uint32, 0, len(text)/3+4), text, addSpecialTokens)
}

// AppendEncode appends the ids Encode returns to dst.
func (t *Tokenizer) AppendEncode(dst []uint32, text string, addSpecialTokens bool) []uint32 {
	b := unbounded()
	return t.appendEncode(dst, text, addSpecialTokens, &b)
}

// EncodeContext is Encode for text from requests: it fails with
// ErrWordTooLong, without merging the word, when the text holds a word
// longer than MaxWordBytes, and stops with ctx's error once ctx ends,
// which it checks every few kilobytes of text.
func (t *Tokenizer) EncodeContext(ctx context.Context, text string, addSpecialTokens bool) ([]uint32, error) {
	b := bound{ctx: ctx, maxWord: MaxWordBytes}
	ids := t.appendEncode(make([]uint32, 0, len(text)/3+4), text, addSpecialTokens, &b)
	if b.err != nil {
		return nil, b.err
	}
	return ids, nil
}

// bound is what an encoding checks as it goes: the length of each word it
// merges, and, every checkEvery bytes, whether ctx ended. err says why it
// stopped.
type bound struct {
	ctx     context.Context // nil: never ends
	maxWord int
	left    int // bytes to encode before ctx is checked again
	err     error
}

func unbounded() bound { return bound{maxWord: math.MaxInt, left: math.MaxInt} }

// spend counts n bytes encoded, and reports whether the encoding goes on.
func (b *bound) spend(n int) bool {
	b.left -= n
	if b.left < 0 {
		b.check()
	}
	return b.err == nil
}

// check looks at the context, and reports whether the encoding goes on.
func (b *bound) check() bool {
	b.left = checkEvery
	if b.err == nil && b.ctx != nil {
		b.err = b.ctx.Err()
	}
	return b.err == nil
}

func (t *Tokenizer) appendEncode(dst []uint32, text string, addSpecialTokens bool, b *bound) []uint32 {
	if addSpecialTokens {
		dst = append(dst, t.post.prefix...)
	}
	first := true
	for i := 0; i < len(text); {
		if !b.check() {
			return dst
		}
		tok, start, end, ok := t.rawAdded.next(text, i, b)
		if b.err != nil {
			return dst
		}
		if !ok {
			start, end = len(text), len(text)
		}
		if start > i {
			dst = t.appendSegment(dst, text[i:start], first, b)
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
func (t *Tokenizer) appendSegment(dst []uint32, seg string, first bool, b *bound) []uint32 {
	if len(seg) < minCachedSegment {
		return t.encodeSegment(dst, seg, first, b)
	}
	key := t.segments.key(seg, first)
	if ids, ok := t.segments.get(key); ok {
		return append(dst, ids...)
	}
	n := len(dst)
	dst = t.encodeSegment(dst, seg, first, b)
	if b.err == nil {
		t.segments.put(key, dst[n:])
	}
	return dst
}

func (t *Tokenizer) encodeSegment(dst []uint32, seg string, first bool, b *bound) []uint32 {
	if t.normalize != nil {
		seg = t.normalize(seg)
	}
	split, direct := t.pre.(splitter)
	for i := 0; i < len(seg); {
		tok, start, end, ok := t.normAdded.next(seg, i, b)
		if b.err != nil {
			return dst
		}
		if !ok {
			start, end = len(seg), len(seg)
		}
		switch {
		case start > i && direct:
			// The common case, without a call per word through a
			// callback. A word refused stops the loop at the next look at
			// the context at the latest.
			for j, next := i, i+checkEvery; j < start; {
				if j >= next {
					if !b.check() {
						return dst
					}
					next = j + checkEvery
				}
				k := split(seg[:start], j)
				dst = t.model.appendWord(dst, seg[j:k], b)
				j = k
			}
		case start > i:
			dst = t.appendWords(dst, seg[i:start], first && i == 0, b)
		}
		if b.err != nil {
			return dst
		}
		if ok {
			dst = append(dst, tok.ID)
		}
		i = end
	}
	return dst
}

// appendWords appends the ids of the words t's pre-tokenizer cuts text
// into.
func (t *Tokenizer) appendWords(dst []uint32, text string, first bool, b *bound) []uint32 {
	// The callback gets a copy of b, so that b itself stays on its
	// caller's stack.
	w := &wordAppender{model: t.model, dst: dst, b: *b}
	t.pre.split(text, first, w.emit)
	*b = w.b
	return w.dst
}

// wordAppender appends the ids of the words a pre-tokenizer emits.
type wordAppender struct {
	model *bpe
	dst   []uint32
	b     bound
}

func (w *wordAppender) emit(word string) {
	if w.b.spend(len(word)) {
		w.dst = w.model.appendWord(w.dst, word, &w.b)
	}
}
