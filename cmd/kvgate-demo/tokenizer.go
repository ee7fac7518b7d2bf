package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// texter writes the workload's token ids as text that the engines'
// tokenizer turns back into as many tokens.
type texter interface {
	Text(ids []uint32) (string, error)
}

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

// wordTexter spells token ids with words its tokenizer encodes as one
// token each: id i becomes word i mod the number of words. Equal ids give
// equal words, so shared prefixes of ids stay shared prefixes of text, and
// a text of n ids is n tokens.
type wordTexter struct{ words []string }

// newWordTexter keeps the common words tk encodes as one token after a
// space, alone and between other words.
func newWordTexter(tk *hf.Tokenizer) (*wordTexter, error) {
	var w wordTexter
	for _, word := range commonWords {
		if len(tk.Encode(" "+word, false)) == 1 {
			w.words = append(w.words, " "+word)
		}
	}
	if len(w.words) < 64 {
		return nil, fmt.Errorf("the tokenizer encodes only %d of %d common English words as one token: the demo's texts would not have the workload's lengths",
			len(w.words), len(commonWords))
	}
	return &w, nil
}

func (w *wordTexter) Text(ids []uint32) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(w.words[int(id)%len(w.words)])
	}
	return b.String(), nil
}

// simTexter spells ids for the simulator's tokenizer (sim.Tokenizer.Text).
type simTexter struct{}

func (simTexter) Text(ids []uint32) (string, error) { return sim.Tokenizer{}.Text(ids) }

// realTokenizer is a model's tokenizer files as the demo uses them: the
// engines tokenize with dir, and the gateway finds them in gatewayDir,
// under the served model's name.
type realTokenizer struct {
	dir        string
	gatewayDir string
	texter     *wordTexter
}

// setUpTokenizer loads the files in dir and lays out the gateway's
// tokenizer directory for model in a new temporary directory, which the
// caller removes.
func setUpTokenizer(dir, model string) (*realTokenizer, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	tk, err := hf.Load(abs)
	if err != nil {
		return nil, fmt.Errorf("-tokenizer: %w", err)
	}
	if !tk.HasChatTemplate() {
		return nil, errors.New("-tokenizer: the files hold no chat template, and the demo sends chats")
	}
	texter, err := newWordTexter(tk)
	if err != nil {
		return nil, fmt.Errorf("-tokenizer: %w", err)
	}
	gw, err := os.MkdirTemp("", "kvgate-demo-tokenizers-")
	if err != nil {
		return nil, err
	}
	link := filepath.Join(gw, filepath.FromSlash(model))
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err == nil {
		err = os.Symlink(abs, link)
	}
	if err != nil {
		os.RemoveAll(gw)
		return nil, fmt.Errorf("lay out the gateway's tokenizer directory: %w", err)
	}
	return &realTokenizer{dir: abs, gatewayDir: gw, texter: texter}, nil
}
