package simserver

import (
	"encoding/json"

	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// promptTokenizer turns prompts into the token ids the engines compute
// with, cache and publish.
type promptTokenizer interface {
	// encode tokenizes a completion prompt.
	encode(text string, addSpecialTokens bool) []uint32
	// encodeChat renders a chat with the model's template and tokenizes it.
	encodeChat(c chatPrompt) ([]uint32, error)
}

// chatPrompt is what a chat request gives its template.
type chatPrompt struct {
	messages, tools, kwargs json.RawMessage
	addGenerationPrompt     bool
	continueFinalMessage    bool
	addSpecialTokens        bool
}

// simTokenizer is the simulator's own word-piece tokenizer with its
// ChatML template (sim.Tokenizer).
type simTokenizer struct{}

func (simTokenizer) encode(text string, addSpecialTokens bool) []uint32 {
	return sim.Tokenizer{}.Encode(text, addSpecialTokens)
}

func (simTokenizer) encodeChat(c chatPrompt) ([]uint32, error) {
	var msgs []chatMessage
	if err := json.Unmarshal(c.messages, &msgs); err != nil {
		return nil, badRequestf("messages: %v", err)
	}
	sm, err := toSimMessages(msgs)
	if err != nil {
		return nil, err
	}
	return sim.Tokenizer{}.Encode(sim.RenderChat(sm, c.addGenerationPrompt), c.addSpecialTokens), nil
}

// hfTokenizer is a model's own tokenizer and chat template, from its
// Hugging Face tokenizer files, and how assistant reasoning reaches the
// template.
type hfTokenizer struct {
	tk        *hf.Tokenizer
	reasoning hf.ReasoningPassing
}

func (h hfTokenizer) encode(text string, addSpecialTokens bool) []uint32 {
	return h.tk.Encode(text, addSpecialTokens)
}

func (h hfTokenizer) encodeChat(c chatPrompt) ([]uint32, error) {
	if len(c.messages) == 0 || string(c.messages) == "[]" {
		return nil, badRequestf("messages must not be empty")
	}
	ids, err := h.tk.EncodeChat(hf.Chat{
		Messages: c.messages, Tools: c.tools, TemplateKwargs: c.kwargs,
		AddGenerationPrompt: c.addGenerationPrompt, ContinueFinalMessage: c.continueFinalMessage,
		Reasoning: h.reasoning,
	}, c.addSpecialTokens)
	if err != nil {
		return nil, badRequestf("chat template: %v", err)
	}
	return ids, nil
}
