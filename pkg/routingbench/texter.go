package routingbench

import (
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// Texter writes a workload's token ids as text that an engine's tokenizer
// turns back into as many tokens, so that a workload of ids can be sent as
// text: its prompts keep their lengths and equal ids stay equal text.
type Texter interface {
	Text(ids []uint32) (string, error)
}

// SimTexter spells ids for the simulator's tokenizer (sim.Tokenizer.Text),
// which encodes the text back into exactly the ids.
type SimTexter struct{}

// Text implements Texter.
func (SimTexter) Text(ids []uint32) (string, error) { return sim.Tokenizer{}.Text(ids) }

// commonWords are English words that real vocabularies hold whole, with
// their leading space.
var commonWords = strings.Fields(`the of and to in is that for it with as was on be by this are from at or an which
	have not but had his they you were her she there been one all would their we him can more has when will who no
	if out so said what up its about into than them only other new some could time these two may then do first any
	my now such like our over man me even most made after also did many before must through back years where much
	your way well down should because each just those people how too little state good very make world still own see
	men work long get here between both life being under never day same another know while last might us great old
	year off come since against go came right used take three cache block token prefix request engine model memory
	page batch queue route gateway pod fast slow warm cold full empty shared local next every keeps stores serves`)

// WordTexter spells token ids with words its tokenizer encodes as one
// token each: id i becomes word i mod the number of words. Equal ids give
// equal words, so shared prefixes of ids stay shared prefixes of text, and
// a text of n ids is n tokens.
type WordTexter struct{ words []string }

// NewWordTexter keeps the common English words tk encodes as one token
// after a space, alone and between other words. It fails when fewer than 64
// are, too few to keep the workload's texts apart.
func NewWordTexter(tk *hf.Tokenizer) (*WordTexter, error) {
	var w WordTexter
	for _, word := range commonWords {
		if len(tk.Encode(" "+word, false)) == 1 {
			w.words = append(w.words, " "+word)
		}
	}
	if len(w.words) < 64 {
		return nil, fmt.Errorf("the tokenizer encodes only %d of %d common English words as one token: texts would not keep the workload's lengths",
			len(w.words), len(commonWords))
	}
	return &w, nil
}

// Text implements Texter.
func (w *WordTexter) Text(ids []uint32) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(w.words[int(id)%len(w.words)])
	}
	return b.String(), nil
}
