package testsupport

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TokenizerModels returns the directory holding real models' tokenizer
// files, a directory per model (qwen3, llama3, llama2, each with
// tokenizer.json and tokenizer_config.json): $KVGATE_TOKENIZER_MODELS, or
// hack/tokenizers/models as hack/install-tokenizers.sh lays it out. When
// the files are missing it skips the test, except in CI (CI=true), where
// it fails it.
func TokenizerModels(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("KVGATE_TOKENIZER_MODELS")
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(file), "..", "..", "hack", "tokenizers", "models")
	}
	if _, err := os.Stat(filepath.Join(dir, "qwen3", "tokenizer.json")); err != nil {
		SkipUnlessCI(t, "tokenizer files missing (%v): run hack/install-tokenizers.sh", err)
	}
	return dir
}

// TokenizerGolden is a golden file of pkg/tokenizer/hf: texts and chat
// requests with the ids Hugging Face's own tokenizers computed for them
// from a model's files (hack/tokenizers/golden.mjs writes them).
type TokenizerGolden struct {
	Model string `json:"model"`
	Texts []struct {
		Text             string   `json:"text"`
		AddSpecialTokens bool     `json:"add_special_tokens"`
		IDs              []uint32 `json:"ids"`
	} `json:"texts"`
	Chats []struct {
		Name    string `json:"name"`
		Request struct {
			Messages             json.RawMessage `json:"messages"`
			Tools                json.RawMessage `json:"tools"`
			ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
			AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
			ContinueFinalMessage bool            `json:"continue_final_message"`
		} `json:"request"`
		Rendered string   `json:"rendered"`
		IDs      []uint32 `json:"ids"`
	} `json:"chats"`
}

// ReadTokenizerGolden reads pkg/tokenizer/hf's golden file of model
// (qwen3, llama3 or llama2).
func ReadTokenizerGolden(t testing.TB, model string) TokenizerGolden {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "pkg", "tokenizer", "hf", "testdata", "golden", model+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var g TokenizerGolden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	return g
}
