package sim

import (
	"math/rand/v2"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Token ids the Tokenizer reserves for special tokens. Ids below
// FirstPieceID are reserved; ordinary pieces get ids from FirstPieceID up to
// VocabSize-1.
const (
	UnknownID    uint32 = 0 // <unk>
	BOSID        uint32 = 1 // <s>, prepended when special tokens are added
	EOSID        uint32 = 2 // </s>, ends a generation
	IMStartID    uint32 = 3 // <|im_start|>, opens a chat message
	IMEndID      uint32 = 4 // <|im_end|>, closes a chat message
	FirstPieceID uint32 = 256
	VocabSize    uint32 = 32000
)

// RandomPieces returns n ordinary piece ids (FirstPieceID to VocabSize-1)
// drawn uniformly from rng: the token ids of a synthetic prompt.
func RandomPieces(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = FirstPieceID + uint32(rng.IntN(int(VocabSize-FirstPieceID)))
	}
	return out
}

// specialTokens maps the text of each special token to its id. Special
// tokens are recognised anywhere in a text, as Hugging Face tokenizers do.
var specialTokens = []struct {
	text string
	id   uint32
}{
	{"<|im_start|>", IMStartID},
	{"<|im_end|>", IMEndID},
	{"</s>", EOSID},
	{"<s>", BOSID},
	{"<unk>", UnknownID},
}

// maxPieceRunes is the longest run of letters one piece holds; longer words
// are split into several pieces, so that token counts grow with word length
// as they do with real sub-word vocabularies.
const maxPieceRunes = 8

// Tokenizer is the simulator's deterministic tokenizer. It needs no
// vocabulary file and gives every engine and client the same ids for the
// same text. Its zero value is ready to use and it is safe for concurrent
// use.
//
// A text is cut into pieces, left to right:
//   - a special token (<|im_start|>, <|im_end|>, <s>, </s>, <unk>) is one
//     piece with its reserved id;
//   - a single space joins the piece that follows it when that piece is not
//     whitespace or a special token (" hello" is one piece);
//   - a run of letters (and combining marks) is one piece, split every 8
//     letters;
//   - any other character (a digit, punctuation, a symbol, whitespace) is a
//     piece of its own.
//
// A piece's id is FirstPieceID + (32-bit FNV-1a of its UTF-8 bytes) mod
// (VocabSize - FirstPieceID). Different pieces may share an id, as they
// would share a fallback in a real vocabulary; the pieces the simulated
// model generates never do.
type Tokenizer struct{}

// Encode returns the token ids of text, preceded by BOSID when
// addSpecialTokens is set (vLLM's default for completion prompts; chat
// prompts rendered by RenderChat carry their own special tokens).
func (Tokenizer) Encode(text string, addSpecialTokens bool) []uint32 {
	ids := make([]uint32, 0, len(text)/4+2)
	if addSpecialTokens {
		ids = append(ids, BOSID)
	}
	return appendPieces(ids, text)
}

// EncodeChat renders messages with RenderChat and returns the token ids of
// the result, without a BOS token.
func (t Tokenizer) EncodeChat(messages []ChatMessage, addGenerationPrompt bool) []uint32 {
	return t.Encode(RenderChat(messages, addGenerationPrompt), false)
}

// Decode returns the text of ids that the simulated model generates: the
// pieces of the output vocabulary, with special tokens left out as vLLM's
// skip_special_tokens does. Other ids have no known text (a piece id is a
// hash) and are rendered as "".
func (Tokenizer) Decode(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(outputText[id])
	}
	return b.String()
}

// appendPieces appends the ids of text's pieces to ids.
func appendPieces(ids []uint32, text string) []uint32 {
	for i := 0; i < len(text); {
		if text[i] == '<' {
			if id, n := matchSpecial(text[i:]); n > 0 {
				ids = append(ids, id)
				i += n
				continue
			}
		}
		start := i
		if text[i] == ' ' && i+1 < len(text) && joinsSpace(text[i+1:]) {
			i++
		}
		i += pieceLen(text[i:])
		ids = append(ids, pieceID(text[start:i]))
	}
	return ids
}

// matchSpecial reports the special token text starts with and its length,
// or 0.
func matchSpecial(text string) (uint32, int) {
	for _, s := range specialTokens {
		if strings.HasPrefix(text, s.text) {
			return s.id, len(s.text)
		}
	}
	return 0, 0
}

// joinsSpace reports whether a space before text belongs to text's first
// piece.
func joinsSpace(text string) bool {
	if c := text[0]; c < utf8.RuneSelf {
		if c == ' ' || '\t' <= c && c <= '\r' {
			return false
		}
		if c != '<' {
			return true
		}
	} else if r, _ := utf8.DecodeRuneInString(text); unicode.IsSpace(r) {
		return false
	}
	_, n := matchSpecial(text)
	return n == 0
}

// pieceLen returns the length in bytes of the piece text starts with.
func pieceLen(text string) int {
	n, runes := 0, 0
	for n < len(text) && runes < maxPieceRunes {
		if c := text[n]; c < utf8.RuneSelf {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
				break
			}
			n++
		} else {
			r, size := utf8.DecodeRuneInString(text[n:])
			if !unicode.IsLetter(r) && !unicode.IsMark(r) {
				break
			}
			n += size
		}
		runes++
	}
	if n == 0 { // not a letter: a piece of its own
		_, n = utf8.DecodeRuneInString(text)
	}
	return n
}

// pieceID hashes a piece into the ordinary part of the vocabulary.
func pieceID(piece string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(piece); i++ {
		h ^= uint32(piece[i])
		h *= 16777619
	}
	return FirstPieceID + h%(VocabSize-FirstPieceID)
}
