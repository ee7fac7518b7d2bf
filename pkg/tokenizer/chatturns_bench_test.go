package tokenizer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// chatTurnsWords are the words of the benchmark's chats, each one token
// after a space in Qwen3's vocabulary.
var chatTurnsWords = strings.Fields("the of and to in is that for it with as was on be by this are from at or an which " +
	"cache block token prefix request engine model memory page batch queue route gateway pod fast slow warm cold")

// chatTurnsText returns about tokens words of text.
func chatTurnsText(rng *rand.Rand, tokens int) string {
	var b strings.Builder
	for range tokens {
		b.WriteByte(' ')
		b.WriteString(chatTurnsWords[rng.IntN(len(chatTurnsWords))])
	}
	return b.String()
}

// chatTurns returns the request bodies of the 20 turns of a conversation
// of about 8k tokens (Qwen3's): a system prompt of 400 tokens and 20 turns
// of a 200-token question and a 180-token answer; turn t holds the
// answers of the turns before it.
func chatTurns(seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 20))
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", fmt.Sprintf("Conversation %d.", seed) + chatTurnsText(rng, 400)}}
	var bodies []string
	for range 20 {
		msgs = append(msgs, msg{"user", chatTurnsText(rng, 200)})
		body, _ := json.Marshal(map[string]any{"model": localModelName, "messages": msgs, "stream": true, "max_tokens": 180})
		bodies = append(bodies, string(body))
		msgs = append(msgs, msg{"assistant", chatTurnsText(rng, 180)})
	}
	return bodies
}

// BenchmarkChatTurns measures the tokenization path of a 20-turn chat of
// about 8k tokens, turn after turn, against a simulated vLLM with Qwen3's
// tokenizer on loopback, in three ways: the engine's /tokenize for every
// turn (remote), the engine's with prefix reuse (prefix), and in process
// (local). Each iteration is a new conversation. It reports the time a
// request waits for its ids per turn (ns/turn; ns/op also counts building
// the requests and the think time), and the /tokenize calls per turn made on the request path
// (calls/turn) and in the background (bg-calls/turn). Between turns it
// waits, untimed, for the background calls, as a user's think time would.
func BenchmarkChatTurns(b *testing.B) {
	localDir, _ := qwen3Dir(b)
	for _, mode := range []string{"remote", "prefix", "local"} {
		b.Run(mode, func(b *testing.B) {
			eng := startEngine(b, loadQwen3(b))
			cfg := Config{NoPrefixReuse: mode == "remote", VerifyFraction: -1}
			if mode == "local" {
				cfg.LocalDir = localDir
			}
			tk, reg := newTestTokenizer(b, cfg)
			ctx := context.Background()
			if mode == "local" {
				tokenize(b, tk, eng.url, chatTurns(0)[0])
				testsupport.Eventually(b, "the chat form to be verified", func() bool { return tk.LocalModels()[0].Chat == LocalActive })
			}
			background := func() float64 {
				return testsupport.MetricValue(b, reg, "kvgate_tokenizer_cache_partial_hits_total", nil)
			}
			var turns int
			var waitedFor time.Duration
			startCalls, startBackground := eng.calls.Load(), background()
			seed := uint64(1)
			for b.Loop() {
				bodies := chatTurns(seed)
				seed++
				reqs := make([]*ChatRequest, len(bodies))
				for i, body := range bodies {
					reqs[i] = chatRequest(b, body)
				}
				for _, req := range reqs {
					start := time.Now()
					if _, err := tk.TokenizeChat(ctx, eng.url, req); err != nil {
						b.Fatal(err)
					}
					waitedFor += time.Since(start)
					turns++
					// The user's think time: the background call ends,
					// and with it the slot it held.
					for len(tk.background) > 0 {
						time.Sleep(50 * time.Microsecond)
					}
				}
			}
			bg := background() - startBackground
			calls := float64(eng.calls.Load()-startCalls) - bg
			b.ReportMetric(float64(waitedFor.Nanoseconds())/float64(turns), "ns/turn")
			b.ReportMetric(calls/float64(turns), "calls/turn")
			b.ReportMetric(bg/float64(turns), "bg-calls/turn")
		})
	}
}
