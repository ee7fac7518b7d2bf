package simserver

import (
	"net/http"
	"path/filepath"
	"slices"
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
