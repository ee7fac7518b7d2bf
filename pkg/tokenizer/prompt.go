package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
)

// prompt returns r's single prompt: text, the raw JSON string to send to
// vLLM, or ids when the prompt is already token ids. Both share r.Prompt's
// storage or are new: they never alias a caller's buffer beyond it.
func (r *CompletionRequest) prompt() (text json.RawMessage, ids []uint32, err error) {
	raw := bytes.TrimSpace(r.Prompt)
	if !present(raw) {
		return nil, nil, errors.New("completion request has no prompt")
	}
	switch raw[0] {
	case '"':
		return raw, nil, nil
	case '[':
	default:
		return nil, nil, errors.New("prompt is neither a string nor a list")
	}
	var first []byte
	n := 0
	if err := jsonscan.ArrayElements(raw, func(elem []byte) {
		if n == 0 {
			first = elem
		}
		n++
	}); err != nil {
		return nil, nil, fmt.Errorf("decode prompt list: %w", err)
	}
	if n == 0 {
		return nil, nil, errors.New("prompt is an empty list")
	}
	switch c := first[0]; {
	case c == '"' || c == '[':
		if n > 1 {
			return nil, nil, fmt.Errorf("%w (%d)", ErrMultiplePrompts, n)
		}
		if c == '"' {
			return first, nil, nil
		}
		raw = first
	case c != '-' && (c < '0' || c > '9'):
		return nil, nil, errors.New("prompt list holds neither strings, token ids nor lists of token ids")
	}
	ids, err = decodeTokenIDs(raw)
	return nil, ids, err
}

// decodeTokenIDs decodes a prompt given as a JSON list of token ids, by
// hand: prompts of token ids can be long.
func decodeTokenIDs(raw json.RawMessage) ([]uint32, error) {
	ids, end, err := jsonscan.ParseTokenIDs(raw, 0, nil)
	if err == nil {
		err = jsonscan.Trailing(raw, end)
	}
	if err != nil {
		return nil, fmt.Errorf("decode prompt token ids: %w", err)
	}
	if len(ids) == 0 {
		return nil, errors.New("prompt is an empty list of token ids")
	}
	return ids, nil
}

// truncate applies r's truncation to res; see Truncation in the package
// documentation.
func (r *CompletionRequest) truncate(res result) ([]uint32, error) {
	maxOutput := 16 // vLLM's default max_tokens for completions
	if r.MaxTokens != nil {
		maxOutput = *r.MaxTokens
	}
	ids, err := truncate(res, r.TruncatePromptTokens, r.TruncationSide, maxOutput)
	if err != nil {
		return nil, inputError(r.Model, err)
	}
	return ids, nil
}

// truncate applies r's truncation to res; see Truncation in the package
// documentation.
func (r *ChatRequest) truncate(res result) ([]uint32, error) {
	maxOutput := 0
	switch {
	case r.MaxCompletionTokens != nil:
		maxOutput = *r.MaxCompletionTokens
	case r.MaxTokens != nil:
		maxOutput = *r.MaxTokens
	}
	ids, err := truncate(res, r.TruncatePromptTokens, r.TruncationSide, maxOutput)
	if err != nil {
		return nil, inputError(r.Model, err)
	}
	return ids, nil
}

// checkTruncation rejects the truncation fields vLLM rejects, before any
// call is made for them.
func checkTruncation(model string, keep *int, side string) error {
	if side != "" && side != "left" && side != "right" {
		return inputError(model, fmt.Errorf("truncation_side %q is neither left nor right", side))
	}
	if keep != nil && *keep < -1 {
		return inputError(model, fmt.Errorf("truncate_prompt_tokens %d is below -1", *keep))
	}
	return nil
}

// truncate keeps what vLLM keeps of res.tokens for truncate_prompt_tokens
// keep and truncation_side side, which checkTruncation accepted: the last
// keep tokens, or the first ones for side "right"; keep -1 means the
// model's context length minus maxOutput. The result shares res.tokens and
// cannot grow into it.
func truncate(res result, keep *int, side string, maxOutput int) ([]uint32, error) {
	tokens := res.tokens[:len(res.tokens):len(res.tokens)]
	if keep == nil {
		return tokens, nil
	}
	n := *keep
	switch {
	case n == -1 && res.maxModelLen == 0:
		return nil, errors.New("truncate_prompt_tokens -1 needs the model's context length, unknown for a prompt of token ids")
	case n == -1:
		n = res.maxModelLen - maxOutput
		if n < 0 {
			return nil, fmt.Errorf("max output tokens %d exceed the model's context length %d", maxOutput, res.maxModelLen)
		}
	}
	if n >= len(tokens) {
		return tokens, nil
	}
	if side == "right" {
		return tokens[:n:n], nil
	}
	return tokens[len(tokens)-n:], nil
}
