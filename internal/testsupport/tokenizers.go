package testsupport

import (
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
		if os.Getenv("CI") == "true" {
			t.Fatalf("tokenizer files missing (%v): run hack/install-tokenizers.sh", err)
		}
		t.Skipf("tokenizer files missing (%v): run hack/install-tokenizers.sh", err)
	}
	return dir
}
