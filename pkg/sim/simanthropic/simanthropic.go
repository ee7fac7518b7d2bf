// Package simanthropic gives simulated vLLM engines (package simserver)
// vLLM's conversion of Anthropic Messages bodies into chat completion
// requests, tokenizer.ChatFromAnthropic. It is a package of its own so
// that package simserver does not import package tokenizer, whose tests
// run simulated engines.
package simanthropic

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// Convert is a simserver.AnthropicConverter: the chat vLLM serves body as,
// by tokenizer.ChatFromAnthropic (ChatFromAnthropicCountTokens when
// countTokens). A body the tokenizer refuses as unsupported fails with an
// error wrapping simserver.ErrAnthropicUnsupported; one vLLM refuses with
// the conversion's reason.
func Convert(body []byte, countTokens bool) (*simserver.AnthropicChat, error) {
	convert := tokenizer.ChatFromAnthropic
	if countTokens {
		convert = tokenizer.ChatFromAnthropicCountTokens
	}
	chat, err := convert(body)
	if err != nil {
		var te *tokenizer.Error
		if !errors.As(err, &te) {
			return nil, err
		}
		if te.Reason == tokenizer.ReasonUnsupported {
			return nil, fmt.Errorf("%w: %v", simserver.ErrAnthropicUnsupported, te.Err)
		}
		return nil, te.Err
	}
	out := &simserver.AnthropicChat{Model: chat.Model, Messages: chat.Messages, Tools: chat.Tools,
		ChatTemplateKwargs: chat.ChatTemplateKwargs, ReasoningEffort: chat.ReasoningEffort}
	if chat.MaxTokens != nil {
		out.MaxTokens = *chat.MaxTokens
	}
	return out, nil
}
