package simserver

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// TestRealTokenizerGivesTheModelsIDsEverywhere runs a server with Qwen3's
// tokenizer files and checks /tokenize, the prompt of a chat completion
// and the KV events against the ids Hugging Face's tokenizers compute.
func TestRealTokenizerGivesTheModelsIDsEverywhere(t *testing.T) {
	tk, err := hf.Load(filepath.Join(testsupport.TokenizerModels(t), "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	ref := testsupport.ReadTokenizerGolden(t, "qwen3")
	ts := startServer(t, 1, func(c *Config) { c.Tokenizer = tk })

	for _, c := range ref.Texts[:12] {
		status, body := ts.post(t, "/tokenize", map[string]any{"model": testModel, "prompt": c.Text, "add_special_tokens": c.AddSpecialTokens})
		if got := decode[tokenizeResponse](t, body); status != http.StatusOK || !slices.Equal(got.Tokens, c.IDs) {
			t.Errorf("/tokenize %q: status %d, %v; want %v", c.Text, status, got.Tokens, c.IDs)
		}
	}
	for _, c := range ref.Chats {
		if c.Name != "system_and_user" && c.Name != "unicode_and_specials" {
			continue
		}
		status, body := ts.post(t, "/tokenize", map[string]any{"messages": c.Request.Messages})
		if got := decode[tokenizeResponse](t, body); status != http.StatusOK || !slices.Equal(got.Tokens, c.IDs) {
			t.Fatalf("/tokenize %s: status %d, %v; want %v", c.Name, status, got.Tokens, c.IDs)
		}
		before := len(ts.sinks[0].storedTokens())
		status, body = ts.post(t, "/v1/chat/completions", map[string]any{"messages": c.Request.Messages, "max_tokens": 1})
		if status != http.StatusOK {
			t.Fatalf("chat %s: status %d: %s", c.Name, status, body)
		}
		// The blocks of the system prompt may be cached already: the
		// events carry the blocks after them.
		full := len(c.IDs) / testBS * testBS
		got := ts.sinks[0].storedTokens()[before:]
		if len(got) == 0 || !slices.Equal(got, c.IDs[full-len(got):full]) {
			t.Errorf("chat %s: events stored %v, want the reference ids up to %d, %v", c.Name, got, full, c.IDs[:full])
		}
	}
}

// TestAssistantReasoningReachesTheTemplateAsTheConfiguredVLLMPassesIt
// serves Qwen3, whose template writes the reasoning of the assistant's
// last turn in a think block, with each vLLM convention: a chat carrying
// reasoning is served, and its prompt holds the reasoning the convention
// passes, rendered as package hf renders it.
func TestAssistantReasoningReachesTheTemplateAsTheConfiguredVLLMPassesIt(t *testing.T) {
	tk, err := hf.Load(filepath.Join(testsupport.TokenizerModels(t), "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	const thought = "The user greets me; greet back."
	for _, c := range []struct {
		name    string
		config  hf.ReasoningPassing // as Config.Reasoning
		passing hf.ReasoningPassing
		renders string // the member whose reasoning the prompt holds
	}{
		{"default", hf.ReasoningPassing{}, hf.VLLMReasoning, "reasoning"},
		{"recent vLLM", hf.VLLMReasoning, hf.VLLMReasoning, "reasoning"},
		{"earlier vLLM", hf.VLLMReasoningContent, hf.VLLMReasoningContent, "reasoning_content"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := startServer(t, 1, func(cfg *Config) { cfg.Tokenizer, cfg.Reasoning = tk, c.config })
			for _, member := range []string{"reasoning", "reasoning_content"} {
				msgs := []map[string]any{{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello.", member: thought}}
				raw, _ := json.Marshal(msgs)
				text, err := tk.RenderChat(hf.Chat{Messages: raw, Reasoning: c.passing})
				if err != nil {
					t.Fatal(err)
				}
				want := tk.Encode(text, false)
				status, body := ts.post(t, "/tokenize", map[string]any{"messages": msgs, "add_generation_prompt": false})
				got := decode[tokenizeResponse](t, body)
				if status != http.StatusOK || !slices.Equal(got.Tokens, want) {
					t.Fatalf("/tokenize with %s: status %d, %s; want %v", member, status, body, want)
				}
				if holds := strings.Contains(text, thought); holds != (member == c.renders) {
					t.Errorf("/tokenize with %s: prompt %q holds the reasoning: %v, want %v", member, text, holds, member == c.renders)
				}
				msgs = append(msgs, map[string]any{"role": "user", "content": "How are you?"})
				if status, body := ts.post(t, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 1}); status != http.StatusOK {
					t.Errorf("chat completion with %s: status %d: %s", member, status, body)
				}
			}
		})
	}
}
