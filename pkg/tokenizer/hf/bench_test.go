package hf

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// benchText returns about bytes bytes of English-like text with code and
// numbers, about 4 bytes a token.
func benchText(seed uint64, bytes int) string {
	rng := rand.New(rand.NewPCG(seed, 1))
	words := strings.Fields("the of and to in is that for it with as was on be by this are from at or an which " +
		"cache prefix routing gateway engine request token block latency throughput don't we'll 2024 3.14 x+y {k: v} naïve")
	var b strings.Builder
	for b.Len() < bytes {
		b.WriteString(words[rng.IntN(len(words))])
		if rng.IntN(12) == 0 {
			b.WriteString(".\n")
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// BenchmarkEncode encodes an 8k-token prompt: cold, every word through the
// BPE merges, and again, served by the segment cache.
func BenchmarkEncode(b *testing.B) {
	for _, model := range []string{"qwen3", "llama3", "llama2"} {
		tk := loadModel(b, model)
		text := benchText(1, 32<<10)
		tokens := len(tk.Encode(text, false))
		b.Run(model+"/cold", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.segments = newSegmentCache(DefaultSegmentCacheBytes)
				tk.model.words = newWordCache()
				tk.Encode(text, false)
			}
			b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
		b.Run(model+"/words-cached", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			tk.Encode(text, false)
			for b.Loop() {
				tk.segments = newSegmentCache(DefaultSegmentCacheBytes)
				tk.Encode(text, false)
			}
			b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
		b.Run(model+"/cached", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.Encode(text, false)
			}
			b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// benchChat returns a chat of turns user and assistant turns of about 400
// tokens each after a system prompt, as JSON messages.
func benchChat(turns int) json.RawMessage {
	msgs := []map[string]string{{"role": "system", "content": benchText(0, 1600)}}
	for i := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": benchText(uint64(i+1), 1600)})
	}
	raw, _ := json.Marshal(msgs)
	return raw
}

// BenchmarkEncodeMarkup encodes 32 KB of HTML, whose every "<" is where an
// added token could start (Llama 3's 256 all start with "<|"), its segment
// not cached and its words cached.
func BenchmarkEncodeMarkup(b *testing.B) {
	text := strings.Repeat(`<div class="row"><span id="a1">value</span><a href="/x?y=1">link</a></div>`+"\n", 400)
	for _, model := range []string{"qwen3", "llama3", "llama2"} {
		tk := loadModel(b, model)
		tk.Encode(text, false)
		b.Run(model, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.segments = newSegmentCache(DefaultSegmentCacheBytes)
				tk.Encode(text, false)
			}
		})
	}
}

// BenchmarkEncodeChatNextTurn renders and encodes the last turn of a
// 20-turn chat of about 8k tokens whose earlier turns were encoded before:
// the cost of a new turn.
func BenchmarkEncodeChatNextTurn(b *testing.B) {
	for _, model := range []string{"qwen3", "llama3"} {
		tk := loadModel(b, model)
		b.Run(model, func(b *testing.B) {
			prev := Chat{Messages: benchChat(18), AddGenerationPrompt: true}
			if _, err := tk.EncodeChat(prev, false); err != nil {
				b.Fatal(err)
			}
			next := Chat{Messages: benchChat(19), AddGenerationPrompt: true}
			ids, _ := tk.EncodeChat(next, false)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tk.EncodeChat(next, false); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(ids)), "tokens")
		})
	}
}

// BenchmarkRenderChat renders the 20-turn chat alone.
func BenchmarkRenderChat(b *testing.B) {
	tk := loadModel(b, "qwen3")
	c := Chat{Messages: benchChat(19), AddGenerationPrompt: true}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tk.RenderChat(c); err != nil {
			b.Fatal(err)
		}
	}
	_ = fmt.Sprint
}

// BenchmarkEncodeChatNewSystemPrompt renders and encodes a chat whose 8k
// token system prompt was never seen, made of words that were: the first
// request of a conversation under a new system prompt.
func BenchmarkEncodeChatNewSystemPrompt(b *testing.B) {
	tk := loadModel(b, "qwen3")
	words := strings.Fields("the of and to in is that for it with as was on be by this are from at or an which " +
		"cache prefix routing gateway engine request token block latency throughput")
	chat := func(seed uint64) Chat {
		rng := rand.New(rand.NewPCG(seed, 2))
		var sys, user strings.Builder
		for range 8192 {
			sys.WriteString(" " + words[rng.IntN(len(words))])
		}
		for range 250 {
			user.WriteString(" " + words[rng.IntN(len(words))])
		}
		raw, _ := json.Marshal([]map[string]string{{"role": "system", "content": sys.String()}, {"role": "user", "content": user.String()}})
		return Chat{Messages: raw, AddGenerationPrompt: true}
	}
	if _, err := tk.EncodeChat(chat(0), false); err != nil {
		b.Fatal(err)
	}
	chats := make([]Chat, 64)
	for i := range chats {
		chats[i] = chat(uint64(i + 1))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i == len(chats) {
			b.StopTimer()
			tk.segments = newSegmentCache(DefaultSegmentCacheBytes)
			i = 0
			b.StartTimer()
		}
		if _, err := tk.EncodeChat(chats[i], false); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
