package tokenizer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
)

// benchSizes are prompt lengths in tokens; the text is 4 bytes a token,
// about what a BPE tokenizer averages on English.
var benchSizes = []int{1 << 10, 8 << 10, 32 << 10}

// benchChat returns a chat request of about tokens tokens: a system prompt
// and user/assistant turns of 2 KiB each, as a /v1/chat/completions body
// decoded into a ChatRequest.
func benchChat(b *testing.B, tokens int) *ChatRequest {
	rng := rand.New(rand.NewPCG(uint64(tokens), 7))
	words := strings.Fields("the of and to in is that for it with as was on be by this are from at or an which")
	var msgs []map[string]string
	for size, i := 0, 0; size < 4*tokens; i++ {
		var text strings.Builder
		for text.Len() < 2048 {
			text.WriteString(words[rng.IntN(len(words))])
			text.WriteByte(' ')
		}
		role := "user"
		switch {
		case i == 0:
			role = "system"
		case i%2 == 0:
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": text.String()})
		size += text.Len()
	}
	body, err := json.Marshal(map[string]any{
		"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": msgs, "temperature": 0.7, "stream": true,
		"tools":                []any{map[string]any{"type": "function", "function": map[string]any{"name": "search"}}},
		"chat_template_kwargs": map[string]any{"enable_thinking": false},
	})
	if err != nil {
		b.Fatal(err)
	}
	return chatRequest(b, string(body))
}

// benchServer answers every /tokenize call with tokens ids.
func benchServer(b *testing.B, tokens int) *fakeVLLM {
	ids := make([]uint32, tokens)
	for i := range ids {
		ids[i] = uint32(i * 7 % 128256)
	}
	resp, _ := json.Marshal(map[string]any{"count": tokens, "max_model_len": 131072, "tokens": ids})
	f := newFakeVLLM(b)
	f.handle = reply(http.StatusOK, string(resp))
	return f
}

// BenchmarkTokenizeChatHit measures a cached chat request: the digest of
// the request's fields, the lookup and the LRU update.
func BenchmarkTokenizeChatHit(b *testing.B) {
	for _, tokens := range benchSizes {
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			f := benchServer(b, tokens)
			tk, _ := newTestTokenizer(b, Config{})
			req := benchChat(b, tokens)
			ctx := context.Background()
			if _, err := tk.TokenizeChat(ctx, f.URL, req); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(req.Messages)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tk.TokenizeChat(ctx, f.URL, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkChatKey measures the digest alone, the part of a hit that grows
// with the request.
func BenchmarkChatKey(b *testing.B) {
	for _, tokens := range benchSizes {
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			req := benchChat(b, tokens)
			b.SetBytes(int64(len(req.Messages)))
			b.ReportAllocs()
			for b.Loop() {
				req.key(42)
			}
		})
	}
}

func BenchmarkTokenizeCompletionHit(b *testing.B) {
	const tokens = 8 << 10
	f := benchServer(b, tokens)
	tk, _ := newTestTokenizer(b, Config{})
	prompt, _ := json.Marshal(strings.Repeat("lorem ipsum dolor sit amet ", 4*tokens/27))
	req := &CompletionRequest{Model: "m", Prompt: prompt}
	ctx := context.Background()
	if _, err := tk.TokenizeCompletion(ctx, f.URL, req); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(prompt)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tk.TokenizeCompletion(ctx, f.URL, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTokenizeChatHitParallel measures hits from every core on 64
// cached 8k-token conversations, which share the cache's lock.
func BenchmarkTokenizeChatHitParallel(b *testing.B) {
	const tokens, convs = 8 << 10, 64
	f := benchServer(b, tokens)
	tk, _ := newTestTokenizer(b, Config{})
	ctx := context.Background()
	reqs := make([]*ChatRequest, convs)
	for i := range reqs {
		reqs[i] = benchChat(b, tokens)
		reqs[i].Model = fmt.Sprint("model-", i)
		if _, err := tk.TokenizeChat(ctx, f.URL, reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if _, err := tk.TokenizeChat(ctx, f.URL, reqs[i%convs]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkTokenizeChatMiss measures a miss against a local server that
// answers at once with 8k ids: what the client adds to vLLM's own time.
func BenchmarkTokenizeChatMiss(b *testing.B) {
	const tokens = 8 << 10
	f := benchServer(b, tokens)
	tk, _ := newTestTokenizer(b, Config{})
	req := benchChat(b, tokens)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		req.Model = fmt.Sprint("model-", i)
		if _, err := tk.TokenizeChat(ctx, f.URL, req); err != nil {
			b.Fatal(err)
		}
	}
}
