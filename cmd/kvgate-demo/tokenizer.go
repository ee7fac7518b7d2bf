package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvgate/kvgate/pkg/routingbench"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// texter writes the workload's token ids as text that the engines'
// tokenizer turns back into as many tokens.
type texter = routingbench.Texter

// realTokenizer is a model's tokenizer files as the demo uses them: the
// engines tokenize with dir, and the gateway finds them in gatewayDir,
// under the served model's name.
type realTokenizer struct {
	dir        string
	gatewayDir string
	texter     *routingbench.WordTexter
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
	texter, err := routingbench.NewWordTexter(tk)
	if err != nil {
		return nil, fmt.Errorf("-tokenizer: %w", err)
	}
	gw, err := os.MkdirTemp("", "kvgate-demo-tokenizers-")
	if err != nil {
		return nil, err
	}
	link := filepath.Join(gw, filepath.FromSlash(model))
	if err = os.MkdirAll(filepath.Dir(link), 0o755); err == nil {
		err = os.Symlink(abs, link)
	}
	if err != nil {
		os.RemoveAll(gw)
		return nil, fmt.Errorf("lay out the gateway's tokenizer directory: %w", err)
	}
	return &realTokenizer{dir: abs, gatewayDir: gw, texter: texter}, nil
}
