package sim

import (
	"fmt"
	"strings"
	"sync"
)

// Text returns a text that Encode, without special tokens, turns back into
// exactly ids: each id becomes a space and a word of one to four lower-case
// letters whose piece has that id. It lets a client send token ids as text,
// for example to replay a workload of token ids through chat requests: a
// word piece ends at the next space, so the words of consecutive ids never
// merge, and a text made by Text may be placed after a newline or before a
// special token without changing its ids.
//
// Every ordinary id, from FirstPieceID up to VocabSize-1, has such a word.
// Text fails for an id outside that range (a special token or an id beyond
// the vocabulary).
func (Tokenizer) Text(ids []uint32) (string, error) {
	words := pieceWords()
	n := 0
	for i, id := range ids {
		if id < FirstPieceID || id >= VocabSize {
			return "", fmt.Errorf("token id %d at %d is not an ordinary piece (want %d to %d)", id, i, FirstPieceID, VocabSize-1)
		}
		n += len(words[id])
	}
	var b strings.Builder
	b.Grow(n)
	for _, id := range ids {
		b.WriteString(words[id])
	}
	return b.String(), nil
}

// pieceWords maps every ordinary piece id to the first word, in order of
// length then alphabetically, of a space and lower-case letters whose piece
// has that id. It is built once, on first use, by trying some 450,000 words
// (all of up to three letters and most of four).
var pieceWords = sync.OnceValue(func() []string {
	words := make([]string, VocabSize)
	missing := int(VocabSize - FirstPieceID)
	var word []byte
	var fill func(letters int)
	fill = func(letters int) {
		if letters == 0 {
			if id := pieceID(string(word)); words[id] == "" {
				words[id] = string(word)
				missing--
			}
			return
		}
		for c := byte('a'); c <= 'z' && missing > 0; c++ {
			word = append(word, c)
			fill(letters - 1)
			word = word[:len(word)-1]
		}
	}
	for letters := 1; missing > 0; letters++ {
		word = append(word[:0], ' ')
		fill(letters)
	}
	return words
})
