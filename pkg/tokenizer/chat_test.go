package tokenizer

import (
	"context"
	"testing"
)

const userHi = "<|im_start|>user\nhi<|im_end|>\n"
const genPrompt = "<|im_start|>assistant\n"

// TestTokenizeChatRendersLikeTheChatEndpoint decodes /v1/chat/completions
// bodies into ChatRequests and checks both what is sent to /tokenize
// (golden files under testdata/chat) and the text the template renders
// from it, which is what the chat endpoint renders for the same body.
func TestTokenizeChatRendersLikeTheChatEndpoint(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		rendered string
		bos      bool
	}{
		{
			name:     "defaults",
			body:     `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			rendered: userHi + genPrompt,
		},
		{
			name: "sampling_fields_ignored",
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.2,"stream":true,` +
				`"max_tokens":64,"tool_choice":"auto","cache_salt":"s"}`,
			rendered: userHi + genPrompt,
		},
		{
			name:     "no_generation_prompt",
			body:     `{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`,
			rendered: userHi,
		},
		{
			name: "continue_final_message",
			body: `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure, "}],` +
				`"add_generation_prompt":false,"continue_final_message":true}`,
			rendered: userHi + "<|im_start|>assistant\nSure, ",
		},
		{
			name:     "special_tokens",
			body:     `{"model":"m","messages":[{"role":"user","content":"hi"}],"add_special_tokens":true}`,
			rendered: userHi + genPrompt,
			bos:      true,
		},
		{
			name: "tools",
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}],` +
				`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`,
			rendered: `<tools>[{"function":{"name":"get_weather","parameters":{"type":"object"}},"type":"function"}]</tools>` +
				"\n" + userHi + genPrompt,
		},
		{
			name:     "documents",
			body:     `{"model":"m","messages":[{"role":"user","content":"hi"}],"documents":[{"title":"a","text":"b"}]}`,
			rendered: `<docs>[{"text":"b","title":"a"}]</docs>` + "\n" + userHi + genPrompt,
		},
		{
			name: "documents_override_template_kwargs",
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"documents":[{"text":"new"}],` +
				`"chat_template_kwargs":{"documents":[{"text":"old"}],"custom":1}}`,
			rendered: `<docs>[{"text":"new"}]</docs>` + "\n" + userHi + genPrompt,
		},
		{
			name:     "template_kwargs_documents_kept",
			body:     `{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"documents":[{"text":"old"}]}}`,
			rendered: `<docs>[{"text":"old"}]</docs>` + "\n" + userHi + genPrompt,
		},
		{
			name:     "reasoning_effort_enables_thinking",
			body:     `{"model":"m","messages":[{"role":"user","content":"hi"}],"reasoning_effort":"high"}`,
			rendered: "<effort>high</effort>\n" + userHi + genPrompt + "<think>\n",
		},
		{
			name:     "reasoning_effort_none_disables_thinking",
			body:     `{"model":"m","messages":[{"role":"user","content":"hi"}],"reasoning_effort":"none"}`,
			rendered: "<effort>none</effort>\n" + userHi + genPrompt,
		},
		{
			name: "template_kwargs_enable_thinking_wins",
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"reasoning_effort":"high",` +
				`"chat_template_kwargs":{"enable_thinking":false}}`,
			rendered: "<effort>high</effort>\n" + userHi + genPrompt,
		},
		{
			name: "nulls_are_absent",
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":null,"documents":null,` +
				`"chat_template_kwargs":null,"add_generation_prompt":null,"mm_processor_kwargs":null}`,
			rendered: userHi + genPrompt,
		},
		{
			name:     "chat_template",
			body:     `{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template":"{{ messages }}"}`,
			rendered: "[template {{ messages }}]\n" + userHi + genPrompt,
		},
		{
			name: "content_parts_and_multimodal_kwargs",
			body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"h"},{"type":"text","text":"i"}]}],` +
				`"mm_processor_kwargs":{"max_pixels":1024},"media_io_kwargs":{"video":{"num_frames":8}}}`,
			rendered: userHi + genPrompt,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVLLM(t, "m")
			tk, _ := newTestTokenizer(t, Config{})
			got, err := tk.TokenizeChat(context.Background(), f.URL, chatRequest(t, tt.body))
			if err != nil {
				t.Fatalf("TokenizeChat: %v", err)
			}
			wantTokens(t, got, fakeEncode(tt.rendered, tt.bos))
			wantSent(t, f, "chat/"+tt.name+".json")
		})
	}
}

func TestTokenizeChatRefusesRequestsWithoutACall(t *testing.T) {
	tests := []struct {
		name string
		req  *ChatRequest
	}{
		{"no_messages", &ChatRequest{Model: "m"}},
		{"null_messages", &ChatRequest{Model: "m", Messages: []byte(`null`)}},
		{"messages_not_json", &ChatRequest{Model: "m", Messages: []byte(`[{"role":`)}},
		{"template_kwargs_not_an_object", &ChatRequest{Model: "m", Messages: []byte(`[]`),
			Documents: []byte(`[]`), ChatTemplateKwargs: []byte(`[1]`)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVLLM(t, "m")
			tk, _ := newTestTokenizer(t, Config{})
			_, err := tk.TokenizeChat(context.Background(), f.URL, tt.req)
			wantInputError(t, err, f, "m")
		})
	}
}
