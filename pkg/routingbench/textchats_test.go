package routingbench

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// smallTextChat is a shared-prefix workload small enough to tokenize in a
// test.
var smallTextChat = SharedPrefixConfig{
	Groups: 2, SystemPromptTokens: 600, Conversations: 12, Turns: 3,
	MinUserTokens: 20, MaxUserTokens: 60, MinAnswerTokens: 10, MaxAnswerTokens: 30,
	ConversationsPerSecond: 4, MeanTurnGap: 2e9, Seed: 5,
}

func TestTextChatsGoThroughTheGatewaysTokenizer(t *testing.T) {
	w, st, err := TokenizeSharedPrefix(context.Background(), smallTextChat, "")
	if err != nil {
		t.Fatal(err)
	}
	// The gateway has no files of the simulator's tokenizer: it asks the
	// engine, and answers a follow-up turn at once with the ids of the
	// turns before, the prefix of the engine's ids the chat shares with
	// the previous turn.
	if st.Requests != 36 || st.Equal+st.Prefix != 36 || st.Differ != 0 || st.InProcess || st.Prefix == 0 {
		t.Fatalf("tokenization %+v: want 36 requests, each tokenized as the engine does or as a prefix of it", st)
	}
	if w.Tokenization == nil || *w.Tokenization != st {
		t.Errorf("the workload carries %+v, want the stats", w.Tokenization)
	}
	for _, r := range w.Requests {
		if len(r.RouteTokens) > len(r.Prompt) || !slices.Equal(r.RouteTokens, r.Prompt[:len(r.RouteTokens)]) {
			t.Fatalf("%s: the gateway routes on %d ids that are not a prefix of the engine's %d", r.ID, len(r.RouteTokens), len(r.Prompt))
		}
		if strings.HasSuffix(r.ID, "-0") && len(r.RouteTokens) != len(r.Prompt) {
			t.Errorf("%s, a first turn, was tokenized as a prefix", r.ID)
		}
	}

	cfg := smallFleet()
	cfg.Policies = []string{routing.LeastRequest, routing.KVAware}
	rep, err := Run(context.Background(), cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	logTable(t, rep)
	if kv, lr := rep.Result(routing.KVAware), rep.Result(routing.LeastRequest); kv.HitRatio < 0.8*rep.Bound.HitRatio || kv.HitRatio <= lr.HitRatio {
		t.Errorf("kv-aware's hit ratio %.3f on the gateway's ids, least-request's %.3f, the bound %.3f", kv.HitRatio, lr.HitRatio, rep.Bound.HitRatio)
	}
}

func TestTextChatsWithAModelsTokenizerAreTokenizedInProcess(t *testing.T) {
	dir := filepath.Join(testsupport.TokenizerModels(t), "qwen3")
	w, st, err := TokenizeSharedPrefix(context.Background(), smallTextChat, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !st.InProcess || st.Equal != st.Requests || st.Requests != 36 {
		t.Fatalf("tokenization %+v: want every prompt tokenized in process as the engine does", st)
	}
	tk, err := hf.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := smallFleet()
	cfg.Engine.VocabSize = tk.VocabSize()
	cfg.Policies = []string{routing.KVAware}
	if _, err := Run(context.Background(), cfg, w); err != nil {
		t.Fatal(err)
	}
	cfg.Engine.VocabSize = 0
	if _, err := Run(context.Background(), cfg, w); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
		t.Errorf("engines of the simulator's vocabulary took a model's ids: %v", err)
	}
}

func TestWordTexterSpellsEachIDAsOneToken(t *testing.T) {
	tk, err := hf.Load(filepath.Join(testsupport.TokenizerModels(t), "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWordTexter(tk)
	if err != nil {
		t.Fatal(err)
	}
	ids := []uint32{300, 301, 302, 300, 31999, 7, 1000, 1000}
	text, err := w.Text(ids)
	if err != nil {
		t.Fatal(err)
	}
	got := tk.Encode(text, false)
	if len(got) != len(ids) || got[0] != got[3] || got[6] != got[7] {
		t.Errorf("Text(%v) = %q encodes to %v: want one token per id, equal ids equal tokens", ids, text, got)
	}
}
