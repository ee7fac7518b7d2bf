// Package simresponses gives simulated vLLM engines (package simserver)
// vLLM's conversion of Responses bodies (POST /v1/responses) into chat
// completion requests, tokenizer.ChatFromResponses. It is a package of its
// own so that package simserver does not import package tokenizer, whose
// tests run simulated engines.
package simresponses

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// Convert is a simserver.ResponsesConverter: the chat vLLM renders body
// as, by tokenizer.ChatFromResponses. A body the tokenizer refuses as
// unsupported fails with an error wrapping
// simserver.ErrResponsesUnsupported; one vLLM refuses with the
// conversion's reason.
func Convert(body []byte) (*simserver.ResponsesChat, error) {
	chat, err := tokenizer.ChatFromResponses(body)
	if err != nil {
		var te *tokenizer.Error
		if !errors.As(err, &te) {
			return nil, err
		}
		if te.Reason == tokenizer.ReasonUnsupported {
			return nil, fmt.Errorf("%w: %v", simserver.ErrResponsesUnsupported, te.Err)
		}
		return nil, te.Err
	}
	return &simserver.ResponsesChat{Messages: chat.Messages, Tools: chat.Tools,
		ChatTemplateKwargs: chat.ChatTemplateKwargs, AddGenerationPrompt: chat.AddGenerationPrompt,
		ContinueFinalMessage: chat.ContinueFinalMessage, ReasoningEffort: chat.ReasoningEffort}, nil
}
