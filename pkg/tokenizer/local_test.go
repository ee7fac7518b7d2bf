package tokenizer

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// The tests of in-process tokenization run simulated vLLM servers
// (simserver) as the engines: with Qwen3's real tokenizer files, as a
// vLLM serving Qwen3 would, or with the simulator's own tokenizer, as an
// engine whose tokenizer differs from the files would.

const localModelName = "Qwen/Qwen3-8B"

// engine is a simulated vLLM server and the /tokenize calls it received.
type engine struct {
	url   string
	calls *atomic.Int64
}

// startEngine serves a simulated vLLM for localModelName that tokenizes
// with tk, or with the simulator's tokenizer when tk is nil, configured
// further by mods.
func startEngine(t testing.TB, tk *hf.Tokenizer, mods ...func(*simserver.Config)) engine {
	t.Helper()
	cfg := simserver.Config{Model: localModelName, Tokenizer: tk,
		Ranks: []simserver.Rank{{Engine: sim.EngineConfig{NumGPUBlocks: 2048}}}}
	for _, mod := range mods {
		mod(&cfg)
	}
	s, err := simserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	calls := new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == tokenizePath {
			calls.Add(1)
		}
		s.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return engine{url: srv.URL, calls: calls}
}

// qwen3Dir returns a directory laid out as Config.LocalDir wants, holding
// Qwen3's files for localModelName, and the files' directory.
func qwen3Dir(t testing.TB) (localDir, files string) {
	t.Helper()
	files = filepath.Join(testsupport.TokenizerModels(t), "qwen3")
	localDir = t.TempDir()
	if err := os.MkdirAll(filepath.Join(localDir, "Qwen"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(files, filepath.Join(localDir, localModelName)); err != nil {
		t.Fatal(err)
	}
	return localDir, files
}

var qwen3 struct {
	once sync.Once
	tk   *hf.Tokenizer
	err  error
}

// loadQwen3 loads Qwen3's tokenizer for the engines, once.
func loadQwen3(t testing.TB) *hf.Tokenizer {
	t.Helper()
	files := filepath.Join(testsupport.TokenizerModels(t), "qwen3")
	qwen3.once.Do(func() { qwen3.tk, qwen3.err = hf.Load(files) })
	if qwen3.err != nil {
		t.Fatal(qwen3.err)
	}
	return qwen3.tk
}

// localActive reports 1 when the model's form is tokenized in process, 0
// otherwise.
func localActive(t testing.TB, tk *Tokenizer, form string) float64 {
	t.Helper()
	lm := tk.LocalModels()[0]
	state := lm.Completion
	if form == FormChat {
		state = lm.Chat
	}
	if state == LocalActive {
		return 1
	}
	return 0
}

// conversation returns the chat request of the first turns of a
// conversation, as JSON.
func conversation(turns int) string {
	msgs := []string{`{"role":"system","content":"You are a concise assistant. Café, naïve, 日本語, 1234567."}`}
	for i := range turns {
		msgs = append(msgs, `{"role":"user","content":"Question `+strings.Repeat("why ", i+1)+`is the sky blue?"}`)
		if i < turns-1 {
			msgs = append(msgs, `{"role":"assistant","content":"Because of Rayleigh scattering, turn `+strings.Repeat("x", i+1)+`."}`)
		}
	}
	return `{"model":"` + localModelName + `","messages":[` + strings.Join(msgs, ",") + `]}`
}

func TestVerifiedModelIsTokenizedInProcessWithTheEnginesIDs(t *testing.T) {
	localDir, _ := qwen3Dir(t)
	eng := startEngine(t, loadQwen3(t))
	tk, reg := newTestTokenizer(t, Config{LocalDir: localDir, VerifyFraction: -1})

	// The first request names a ready pod: the engine tokenizes it while
	// the in-process tokenizer is compared with it.
	first := mustTokenize(t, tk, eng.url, conversation(1))
	testsupport.Eventually(t, "both forms to be verified", func() bool {
		return localActive(t, tk, FormChat) == 1 && localActive(t, tk, FormCompletion) == 1
	})
	for _, lm := range tk.LocalModels() {
		if lm.Model != localModelName || lm.Completion != LocalActive || lm.Chat != LocalActive {
			t.Fatalf("LocalModels: %+v, want %s active in both forms", lm, localModelName)
		}
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_tokenizer_local_forms", map[string]string{"state": "active"}); n != 2 {
		t.Fatalf("local_forms{state=active} = %v, want 2", n)
	}
	callsBefore := eng.calls.Load()
	bodies := []string{
		conversation(2), conversation(5),
		`{"model":"` + localModelName + `","prompt":"Hello world! 12345 <|im_start|>x","max_tokens":3}`,
		`{"model":"` + localModelName + `","prompt":"Hello world!","add_special_tokens":false}`,
	}
	var local [][]uint32
	for _, b := range bodies {
		local = append(local, mustTokenize(t, tk, eng.url, b))
	}
	if n := eng.calls.Load() - callsBefore; n != 0 {
		t.Fatalf("the engine received %d /tokenize calls for requests tokenized in process", n)
	}
	// Ask the engine itself, through a tokenizer without files.
	remote, _ := newTestTokenizer(t, Config{NoPrefixReuse: true})
	wantTokens(t, first, mustTokenize(t, remote, eng.url, conversation(1)))
	for i, b := range bodies {
		if want := mustTokenize(t, remote, eng.url, b); !slices.Equal(local[i], want) {
			t.Errorf("request %d: in process %v, engine %v", i, local[i], want)
		}
	}
	if n := testsupport.MetricValue(t, reg, "kvgate_tokenizer_local_tokenizations_total", map[string]string{"form": FormChat}); n != 2 {
		t.Errorf("local_tokenizations_total{form=chat} = %v, want 2", n)
	}
}

func TestEngineThatDisagreesAtStartKeepsTokenizing(t *testing.T) {
	localDir, _ := qwen3Dir(t)
	eng := startEngine(t, nil) // the simulator's tokenizer, not Qwen3's
	tk, reg := newTestTokenizer(t, Config{LocalDir: localDir, NoPrefixReuse: true})

	mustTokenize(t, tk, eng.url, conversation(1))
	mismatches := func() float64 {
		return testsupport.MetricValue(t, reg, "kvgate_tokenizer_mismatches_total", map[string]string{"model": localModelName, "form": FormChat})
	}
	testsupport.Eventually(t, "both forms to fall back", func() bool {
		return mismatches() == 1 && tk.LocalModels()[0].Completion == LocalFallback
	})
	lm := tk.LocalModels()[0]
	if lm.Chat != LocalFallback || !strings.Contains(lm.ChatReason, "first difference at") {
		t.Fatalf("LocalModels: %+v, want the chat form falling back with the difference", lm)
	}
	before := eng.calls.Load()
	got := mustTokenize(t, tk, eng.url, conversation(3))
	if eng.calls.Load() != before+1 {
		t.Fatal("a chat of a model that fell back was not tokenized by the engine")
	}
	remote, _ := newTestTokenizer(t, Config{NoPrefixReuse: true})
	wantTokens(t, got, mustTokenize(t, remote, eng.url, conversation(3)))
	if localActive(t, tk, FormChat) != 0 {
		t.Error("the chat form is still active")
	}
}

func TestLiveMismatchSendsTheModelBackToTheEngine(t *testing.T) {
	localDir, _ := qwen3Dir(t)
	agrees := startEngine(t, loadQwen3(t))
	differs := startEngine(t, nil)
	tk, reg := newTestTokenizer(t, Config{LocalDir: localDir, VerifyFraction: 1, NoPrefixReuse: true})

	mustTokenize(t, tk, agrees.url, conversation(1))
	testsupport.Eventually(t, "both forms to be verified", func() bool {
		return localActive(t, tk, FormChat) == 1 && localActive(t, tk, FormCompletion) == 1
	})
	// Every in-process tokenization is now compared, here with an engine
	// whose tokenizer differs: the first comparison turns the form off.
	mustTokenize(t, tk, differs.url, conversation(2))
	testsupport.Eventually(t, "the live mismatch to be counted", func() bool {
		return testsupport.MetricValue(t, reg, "kvgate_tokenizer_mismatches_total", map[string]string{"model": localModelName, "form": FormChat}) == 1
	})
	if lm := tk.LocalModels()[0]; lm.Chat != LocalFallback || !strings.HasPrefix(lm.ChatReason, "live traffic") {
		t.Fatalf("LocalModels: %+v, want the chat form falling back after live traffic", lm)
	}
	before := differs.calls.Load()
	mustTokenize(t, tk, differs.url, conversation(4))
	if differs.calls.Load() != before+1 {
		t.Fatal("a chat after the mismatch was not tokenized by the engine")
	}
}

func TestUnreachableEngineLeavesTheModelUnverified(t *testing.T) {
	localDir, _ := qwen3Dir(t)
	tk, reg := newTestTokenizer(t, Config{LocalDir: localDir})
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	if _, err := tokenize(t, tk, down.URL, conversation(1)); err == nil {
		t.Fatal("tokenization against a closed server succeeded")
	}
	testsupport.Eventually(t, "the verification to give up for now", func() bool {
		return tk.LocalModels()[0].Chat == LocalUnverified &&
			testsupport.MetricValue(t, reg, "kvgate_tokenizer_verifications_total",
				map[string]string{"model": localModelName, "form": FormChat, "result": verifyError}) == 1
	})
}

func TestLocalDirIsValidatedAtStart(t *testing.T) {
	empty := t.TempDir()
	bad := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bad, "m"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "m", hf.TokenizerFile), []byte(`{"model":{"type":"WordPiece"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{
		empty:                     "holds no tokenizer.json",
		bad:                       `type "WordPiece" is not implemented`,
		filepath.Join(empty, "x"): "no such file",
	} {
		_, err := New(Config{LocalDir: dir}, prometheus.NewRegistry())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New with LocalDir %s: %v, want an error containing %q", dir, err, want)
		}
	}
}

func TestRequestsTheTemplateCannotRenderGoToTheEngine(t *testing.T) {
	localDir, _ := qwen3Dir(t)
	eng := startEngine(t, loadQwen3(t))
	tk, reg := newTestTokenizer(t, Config{LocalDir: localDir, VerifyFraction: -1})
	mustTokenize(t, tk, eng.url, conversation(1))
	testsupport.Eventually(t, "both forms to be verified", func() bool {
		return localActive(t, tk, FormChat) == 1 && localActive(t, tk, FormCompletion) == 1
	})

	const user = `{"role":"user","content":"Weather in Paris?"}`
	for i, req := range []string{
		`{"model":"` + localModelName + `","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		// Templates here print floats unlike Python.
		`{"model":"` + localModelName + `","messages":[` + user + `],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"t":{"type":"number","default":1.0}}}}}]}`,
		`{"model":"` + localModelName + `","messages":[` + user + `,{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"t\":0.5}"}}]}]}`,
		`{"model":"` + localModelName + `","messages":[` + user + `],"chat_template_kwargs":{"n":1e6}}`,
	} {
		before := eng.calls.Load()
		_, _ = tokenize(t, tk, eng.url, req)
		if eng.calls.Load() != before+1 {
			t.Errorf("chat %s was not sent to the engine", req)
		}
		if n := testsupport.MetricValue(t, reg, "kvgate_tokenizer_local_fallbacks_total", map[string]string{"reason": fallbackRender}); n != float64(i+1) {
			t.Errorf("after chat %s: local_fallbacks_total{reason=render} = %v, want %d", req, n, i+1)
		}
	}
	if localActive(t, tk, FormChat) != 1 {
		t.Errorf("chats the template cannot render turned in-process tokenization off: %+v", tk.LocalModels()[0])
	}
}
