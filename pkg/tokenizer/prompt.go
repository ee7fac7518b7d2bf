package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// prompt returns r's single prompt: text, the raw JSON string to send to
// vLLM, or ids when the prompt is already token ids.
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
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, nil, fmt.Errorf("decode prompt list: %w", err)
	}
	if len(items) == 0 {
		return nil, nil, errors.New("prompt is an empty list")
	}
	switch first := items[0][0]; {
	case first == '"' || first == '[':
		if len(items) > 1 {
			return nil, nil, fmt.Errorf("%w (%d)", ErrMultiplePrompts, len(items))
		}
		if first == '"' {
			return items[0], nil, nil
		}
		raw = items[0]
	case first != '-' && (first < '0' || first > '9'):
		return nil, nil, errors.New("prompt list holds neither strings, token ids nor lists of token ids")
	}
	ids, err = decodeTokenIDs(raw)
	return nil, ids, err
}

// decodeTokenIDs decodes a prompt given as a JSON list of token ids. It is
// apart from prompt so that a text prompt does not pay for ids escaping.
func decodeTokenIDs(raw json.RawMessage) ([]uint32, error) {
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err != nil {
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
