package main

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/pkg/routingbench"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// texter writes the workload's token ids as text that the engines'
// tokenizer turns back into as many tokens.
type texter = routingbench.Texter

// loadTexter loads the tokenizer files in dir, which the demo's chats
// need with a chat template, and returns a texter of their words.
func loadTexter(dir string) (*routingbench.WordTexter, error) {
	tk, err := hf.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("-tokenizer: %w", err)
	}
	if !tk.HasChatTemplate() {
		return nil, errors.New("-tokenizer: the files hold no chat template, and the demo sends chats")
	}
	texter, err := routingbench.NewWordTexter(tk)
	if err != nil {
		return nil, fmt.Errorf("-tokenizer: %w", err)
	}
	return texter, nil
}
