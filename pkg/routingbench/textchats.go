package routingbench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// TokenizationStats says how the gateway's tokenization of a text workload
// compared with the engines'.
type TokenizationStats struct {
	// Tokenizer names the tokenizer: "sim" for the simulator's, else the
	// directory of the model's files.
	Tokenizer string `json:"tokenizer"`
	// Requests counts the requests; Equal those the gateway tokenized as
	// the engines do, Prefix those it tokenized as a prefix of the engines'
	// ids (the ids of an earlier turn, while the whole chat was tokenized
	// in the background), and Differ the others.
	Requests int `json:"requests"`
	Equal    int `json:"equal"`
	Prefix   int `json:"prefix"`
	Differ   int `json:"differ"`
	// InProcess reports that the gateway tokenized chats in process, its
	// model's files agreeing with the engine's tokenizer.
	InProcess bool `json:"inProcess"`
}

// TokenizeSharedPrefix lays out the conversations of
// GenerateSharedPrefixChats as OpenAI chat requests of text and tokenizes
// every request twice, as a fleet of vLLM engines and the gateway do: the
// engines by rendering the chat with the model's template and tokenizing
// it (POST /tokenize of a simulated vLLM server, package simserver), the
// gateway with package tokenizer, in process with the model's files once
// the engine agreed with them, or from the engine's /tokenize with the ids
// of the earlier turns while the whole chat is tokenized in the background.
// dir holds the model's Hugging Face tokenizer files; "" means the
// simulator's tokenizer, which the gateway has no files of and asks the
// engine for. The engines compute the requests' Prompt; the routers route
// on their RouteTokens.
//
// Texts spell the workload's token ids (SimTexter, or a WordTexter of the
// model's tokenizer), so that the prompts keep their lengths. Each turn
// carries the previous turns' answers: the text of the tokens the engines
// generate (sim.GeneratedTokens, decoded as simserver does), which the
// engine tokenizes back, with a real model's tokenizer, into ids that may
// differ from the ones it generated. Requests are tokenized in the order
// they arrive; before the next turn of a conversation, the gateway's
// background tokenization of the previous one has ended, as a user's
// reading time lets it. The workload's engines must take cfg's vocabulary
// (Config.Engine.VocabSize: the tokenizer's VocabSize).
func TokenizeSharedPrefix(ctx context.Context, cfg SharedPrefixConfig, dir string) (Workload, TokenizationStats, error) {
	stats := TokenizationStats{Tokenizer: cmp.Or(dir, "sim")}
	chats, err := GenerateSharedPrefixChats(cfg)
	if err != nil {
		return Workload{}, stats, err
	}
	tc, err := newTextChats(dir)
	if err != nil {
		return Workload{}, stats, err
	}
	defer tc.close()

	systems := make([]string, len(chats.Systems))
	for i, ids := range chats.Systems {
		if systems[i], err = tc.texter.Text(ids); err != nil {
			return Workload{}, stats, fmt.Errorf("system prompt %d: %w", i, err)
		}
	}
	// The turns in order of arrival, each with its conversation's messages
	// so far.
	type turn struct {
		conv, turn int
		at         time.Duration
	}
	var turns []turn
	for c, conv := range chats.Conversations {
		at := conv.Start
		for k, t := range conv.Turns {
			at += t.Gap
			turns = append(turns, turn{c, k, at})
		}
	}
	slices.SortStableFunc(turns, func(a, b turn) int { return cmp.Compare(a.at, b.at) })
	messages := make([][]chatMessage, len(chats.Conversations))
	w := Workload{Name: "shared-prefix-text"}
	for _, tn := range turns {
		conv := chats.Conversations[tn.conv]
		t := conv.Turns[tn.turn]
		user, err := tc.texter.Text(t.User)
		if err != nil {
			return Workload{}, stats, fmt.Errorf("conversation %d, turn %d: %w", tn.conv, tn.turn, err)
		}
		if tn.turn == 0 {
			messages[tn.conv] = []chatMessage{{Role: "system", Content: systems[conv.System]}}
		}
		messages[tn.conv] = append(messages[tn.conv], chatMessage{Role: "user", Content: user})
		raw, err := json.Marshal(messages[tn.conv])
		if err != nil {
			return Workload{}, stats, err
		}
		engine, err := tc.engineIDs(ctx, raw)
		if err != nil {
			return Workload{}, stats, fmt.Errorf("conversation %d, turn %d: engine: %w", tn.conv, tn.turn, err)
		}
		gateway, err := tc.gatewayIDs(ctx, raw)
		if err != nil {
			return Workload{}, stats, fmt.Errorf("conversation %d, turn %d: gateway: %w", tn.conv, tn.turn, err)
		}
		stats.Requests++
		switch {
		case slices.Equal(gateway, engine):
			stats.Equal++
		case len(gateway) < len(engine) && slices.Equal(gateway, engine[:len(gateway)]):
			stats.Prefix++
		default:
			stats.Differ++
		}
		w.Requests = append(w.Requests, Request{
			ID:           fmt.Sprintf("chat-%d-%d", tn.conv, tn.turn),
			Arrival:      tn.at,
			Prompt:       engine,
			RouteTokens:  gateway,
			OutputTokens: len(t.Answer),
		})
		answer := sim.Tokenizer{}.Decode(sim.GeneratedTokens(0, engine, 0, len(t.Answer)))
		messages[tn.conv] = append(messages[tn.conv], chatMessage{Role: "assistant", Content: answer})
	}
	stats.InProcess = tc.inProcess()
	w.Tokenization = &stats
	return w, stats, nil
}

// chatMessage is a message of an OpenAI chat request.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// textChats tokenizes chats as an engine and as the gateway do.
type textChats struct {
	texter  Texter
	server  *httptest.Server
	gateway *tokenizer.Tokenizer
	dir     string // the gateway's tokenizer directory, removed on close
	local   bool   // the gateway has the model's files
}

// tokenizeTimeout bounds one tokenization, and the wait for the gateway to
// verify its files against the engine.
const tokenizeTimeout = 30 * time.Second

func newTextChats(dir string) (*textChats, error) {
	tc := &textChats{texter: SimTexter{}}
	scfg := simserver.Config{Model: benchModel, Ranks: []simserver.Rank{{Engine: DefaultEngine}}, Registry: prometheus.NewRegistry()}
	var gcfg tokenizer.Config
	if dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, err
		}
		tk, err := hf.Load(abs)
		if err != nil {
			return nil, fmt.Errorf("tokenizer files: %w", err)
		}
		if !tk.HasChatTemplate() {
			return nil, fmt.Errorf("tokenizer files in %s hold no chat template", abs)
		}
		if tc.texter, err = NewWordTexter(tk); err != nil {
			return nil, err
		}
		scfg.Tokenizer = tk
		// The gateway finds a model's files under its name.
		if tc.dir, err = os.MkdirTemp("", "routingbench-tokenizers-"); err != nil {
			return nil, err
		}
		if err := os.Symlink(abs, filepath.Join(tc.dir, benchModel)); err != nil {
			tc.close()
			return nil, err
		}
		gcfg.LocalDir, tc.local = tc.dir, true
	}
	srv, err := simserver.New(scfg)
	if err != nil {
		tc.close()
		return nil, err
	}
	tc.server = httptest.NewServer(srv.Handler())
	if tc.gateway, err = tokenizer.New(gcfg, prometheus.NewRegistry()); err != nil {
		tc.close()
		return nil, err
	}
	return tc, nil
}

func (tc *textChats) close() {
	if tc.gateway != nil {
		tc.gateway.Close()
	}
	if tc.server != nil {
		tc.server.Close()
	}
	if tc.dir != "" {
		os.RemoveAll(tc.dir)
	}
}

// engineIDs returns the ids the engine computes for a chat of messages.
func (tc *textChats) engineIDs(ctx context.Context, messages json.RawMessage) ([]uint32, error) {
	body, err := json.Marshal(struct {
		Model    string          `json:"model"`
		Messages json.RawMessage `json:"messages"`
	}{benchModel, messages})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, tokenizeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tc.server.URL+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := tc.server.Client().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/tokenize answered %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

// gatewayIDs returns the ids the gateway routes a chat of messages on,
// then waits for what it tokenizes in the background to end. The first
// chat of a gateway with the model's files waits until it has verified
// them against the engine.
func (tc *textChats) gatewayIDs(ctx context.Context, messages json.RawMessage) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, tokenizeTimeout)
	defer cancel()
	req := &tokenizer.ChatRequest{Model: benchModel, Messages: messages}
	ids, err := tc.gateway.TokenizeChat(ctx, tc.server.URL, req)
	if err != nil {
		return nil, err
	}
	// A second call for the same chat joins a background tokenization of
	// it, if one runs, and returns when it ends.
	if _, err := tc.gateway.TokenizeChat(ctx, tc.server.URL, req); err != nil {
		return nil, err
	}
	for tc.local && !tc.inProcess() {
		if tc.settled() {
			break
		}
		select {
		case <-ctx.Done():
			return nil, errors.New("the gateway did not verify its tokenizer files against the engine in time")
		case <-time.After(10 * time.Millisecond):
		}
	}
	return ids, nil
}

// inProcess reports whether the gateway tokenizes chats in process.
func (tc *textChats) inProcess() bool {
	for _, m := range tc.gateway.LocalModels() {
		if m.Model == benchModel && m.Chat == tokenizer.LocalActive {
			return true
		}
	}
	return false
}

// settled reports whether the gateway is done verifying its files for
// chats, whatever it concluded.
func (tc *textChats) settled() bool {
	for _, m := range tc.gateway.LocalModels() {
		if m.Model == benchModel {
			return m.Chat != tokenizer.LocalUnverified && m.Chat != tokenizer.LocalVerifying
		}
	}
	return true
}
