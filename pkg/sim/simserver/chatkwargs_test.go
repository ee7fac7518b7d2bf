package simserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// variablesTemplate is a chat template that prints the variables vLLM's
// chat endpoint passes beside the messages.
const variablesTemplate = `{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor -%}
documents={{ documents | tojson if documents is defined else "absent" }}
reasoning_effort={{ reasoning_effort if reasoning_effort is defined else "absent" }}
enable_thinking={{ enable_thinking if enable_thinking is defined else "absent" }}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`

// TestChatsRenderWithTheVariablesTheGatewaysTokenizerPasses checks that
// the prompt a server renders for a chat completion, Messages, token count
// or Responses body, as its usage and KV events show it, is the one the
// gateway's in-process tokenizer computes for the same body: with the
// chat's documents, its reasoning effort and the enable_thinking vLLM
// derives from it among the template's variables.
func TestChatsRenderWithTheVariablesTheGatewaysTokenizerPasses(t *testing.T) {
	const (
		user  = `[{"role":"user","content":"Why route requests by prefix?"}]`
		chat  = `{"model":"` + testModel + `","max_tokens":1,"messages":` + user
		msgs  = `{"model":"` + testModel + `","max_tokens":1,"system":"Be brief.","messages":` + user
		count = `{"model":"` + testModel + `","system":"Be brief.","messages":` + user
		resp  = `{"model":"` + testModel + `","max_output_tokens":1,"instructions":"Be brief.","input":"Why route requests by prefix?"`
	)
	qwen3 := filepath.Join(testsupport.TokenizerModels(t), "qwen3")
	variables := modelFiles(t, qwen3, variablesTemplate)
	models := map[string]*filesModel{} // by files
	for _, tc := range []struct {
		name, files, path string
		// body is the request; without, when not empty, the same request
		// without what the case is about, which the gateway tokenizes
		// differently.
		body, without string
	}{
		{"Qwen3, a chat", qwen3, "/v1/chat/completions", chat + `}`, ""},
		{"Qwen3, a chat with reasoning_effort none", qwen3, "/v1/chat/completions",
			chat + `,"reasoning_effort":"none"}`, chat + `}`},
		{"Qwen3, a chat whose chat_template_kwargs set enable_thinking", qwen3, "/v1/chat/completions",
			chat + `,"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true}}`, chat + `,"reasoning_effort":"none"}`},
		{"Qwen3, a Responses request with reasoning.effort none", qwen3, "/v1/responses",
			resp + `,"reasoning":{"effort":"none"}}`, resp + `}`},
		{"a chat with documents and reasoning_effort", variables, "/v1/chat/completions",
			chat + `,"documents":[{"title":"a","text":"b"}],"reasoning_effort":"high",` +
				`"chat_template_kwargs":{"documents":[{"text":"old"}],"enable_thinking":false}}`,
			chat + `,"chat_template_kwargs":{"documents":[{"text":"old"}],"enable_thinking":false}}`},
		{"a Messages request with output_config.effort", variables, "/v1/messages",
			msgs + `,"output_config":{"effort":"low"}}`, msgs + `}`},
		// vLLM's token count reads no output_config.
		{"a token count with output_config.effort", variables, "/v1/messages/count_tokens",
			count + `,"output_config":{"effort":"high"}}`, ""},
		{"a Responses request with reasoning.effort", variables, "/v1/responses",
			resp + `,"reasoning":{"effort":"medium"}}`, resp + `}`},
	} {
		m := models[tc.files]
		if m == nil {
			m = &filesModel{}
			var err error
			if m.engine, err = hf.Load(tc.files); err != nil {
				t.Fatal(err)
			}
			m.gateway = gatewayTokenizer(t, tc.files, startServer(t, 1, m.withFiles).url)
			models[tc.files] = m
		}
		t.Run(tc.name, func(t *testing.T) {
			withFiles, gateway := m.withFiles, m.gateway
			want := gatewayIDs(t, gateway, tc.path, tc.body)
			if tc.without != "" && slices.Equal(want, gatewayIDs(t, gateway, tc.path, tc.without)) {
				t.Fatalf("the gateway tokenizes the body as it does without the case's members: %v", want)
			}

			ts := startServer(t, 1, withFiles)
			status, out := ts.postRaw(t, tc.path, tc.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, out)
			}
			if got := promptLength(t, tc.path, out); got != len(want) {
				t.Errorf("the server's prompt has %d tokens, the gateway's %d: %v", got, len(want), want)
			}
			if tc.path == "/v1/messages/count_tokens" {
				return
			}
			full := len(want) / testBS * testBS
			if got := ts.sinks[0].storedTokens(); !slices.Equal(got, want[:full]) {
				t.Errorf("the server stored the blocks of\n%v\nthe gateway's prompt is\n%v", got, want)
			}
		})
	}
}

// modelFiles returns the directory of a model's tokenizer files: files,
// or, with a template, a directory holding files' tokenizer files and the
// template as chat_template.jinja.
func modelFiles(t *testing.T, files, template string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{hf.TokenizerFile, hf.ConfigFile} {
		if err := os.Symlink(filepath.Join(files, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, hf.TemplateFile), []byte(template), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// gatewayTokenizer returns the gateway's tokenizer, tokenizing testModel
// in process with files once verified against the engine at url.
func gatewayTokenizer(t *testing.T, files, url string) *tokenizer.Tokenizer {
	t.Helper()
	localDir := t.TempDir()
	if err := os.Symlink(files, filepath.Join(localDir, testModel)); err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.New(tokenizer.Config{LocalDir: localDir, VerifyFraction: -1, NoPrefixReuse: true}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tk.Close)
	warmUp := &tokenizer.ChatRequest{Model: testModel, Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`)}
	if _, err := tk.TokenizeChat(context.Background(), url, warmUp); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the gateway to tokenize chats in process", func() bool {
		return tk.LocalModels()[0].Chat == tokenizer.LocalActive
	})
	return tk
}

// gatewayIDs returns the ids the gateway's tokenizer computes for body,
// posted to path.
func gatewayIDs(t *testing.T, tk *tokenizer.Tokenizer, path, body string) []uint32 {
	t.Helper()
	var req *tokenizer.ChatRequest
	var err error
	switch path {
	case "/v1/chat/completions":
		req = new(tokenizer.ChatRequest)
		err = json.Unmarshal([]byte(body), req)
	case "/v1/messages":
		req, err = tokenizer.ChatFromAnthropic([]byte(body))
	case "/v1/messages/count_tokens":
		req, err = tokenizer.ChatFromAnthropicCountTokens([]byte(body))
	case "/v1/responses":
		req, err = tokenizer.ChatFromResponses([]byte(body))
	default:
		err = fmt.Errorf("no conversion for %s", path)
	}
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tk.TokenizeChat(context.Background(), "http://127.0.0.1:1", req)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// promptLength returns the prompt's length a response to path reports.
func promptLength(t *testing.T, path string, body []byte) int {
	t.Helper()
	type usage struct {
		PromptTokens *int `json:"prompt_tokens"`
		InputTokens  *int `json:"input_tokens"`
	}
	r := decode[struct {
		usage
		Usage usage `json:"usage"`
	}](t, body)
	for _, n := range []*int{r.InputTokens, r.Usage.PromptTokens, r.Usage.InputTokens} {
		if n != nil {
			return *n
		}
	}
	t.Fatalf("%s answered no prompt length: %s", path, body)
	return 0
}

// filesModel holds the engines' and the gateway's tokenizers of a
// model's files.
type filesModel struct {
	engine  *hf.Tokenizer
	gateway *tokenizer.Tokenizer
}

// withFiles configures a server to render with m's files and vLLM's
// conversion of Responses requests.
func (m *filesModel) withFiles(c *Config) {
	c.Tokenizer = m.engine
	c.Responses = convertResponsesAsVLLM
}

// convertResponsesAsVLLM is the ResponsesConverter package simresponses
// gives, vLLM's conversion by tokenizer.ChatFromResponses.
func convertResponsesAsVLLM(body []byte) (*ResponsesChat, error) {
	chat, err := tokenizer.ChatFromResponses(body)
	if err != nil {
		var te *tokenizer.Error
		if errors.As(err, &te) && te.Reason == tokenizer.ReasonUnsupported {
			return nil, fmt.Errorf("%w: %v", ErrResponsesUnsupported, te.Err)
		}
		return nil, err
	}
	return &ResponsesChat{Messages: chat.Messages, Tools: chat.Tools, ChatTemplateKwargs: chat.ChatTemplateKwargs,
		AddGenerationPrompt: chat.AddGenerationPrompt, ContinueFinalMessage: chat.ContinueFinalMessage,
		ReasoningEffort: chat.ReasoningEffort}, nil
}
