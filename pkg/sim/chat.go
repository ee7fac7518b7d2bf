package sim

import "strings"

// ChatMessage is one message of a chat conversation.
type ChatMessage struct {
	Role    string
	Content string
}

// RenderChat renders messages through the simulator's chat template, a
// ChatML template:
//
//	<|im_start|>{role}\n{content}<|im_end|>\n     for each message
//	<|im_start|>assistant\n                      if addGenerationPrompt
//
// vLLM's chat endpoints and /tokenize add the generation prompt unless a
// request says otherwise.
func RenderChat(messages []ChatMessage, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range messages {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteString("<|im_end|>\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}
