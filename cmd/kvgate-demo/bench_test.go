package main

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/localfleet"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/routingbench"
)

// Shape of BenchmarkGatewayUnderLoad's load.
const (
	// loadClientsPerCPU times GOMAXPROCS is the number of concurrent
	// clients.
	loadClientsPerCPU = 8
	// loadPrompts is the number of distinct chats the clients send, each
	// a system prompt of loadSystemTokens and a user message.
	loadPrompts      = 32
	loadSystemTokens = 1024
	loadAnswerTokens = 4
)

// BenchmarkGatewayUnderLoad measures what the gateway adds to a request
// under concurrent load: GOMAXPROCS x 8 clients on 127.0.0.1 send
// streamed chat completions (32 distinct chats of some 1,100 tokens, each
// already in the gateway's tokenizer cache and in the prefix index) to
// two vllm-sim engines with no latency, through the gateway binary
// (kv-aware routing) or, for comparison, straight to the engines. An op is
// one request; the benchmark time bounds the number of requests.
//
// It reports the percentiles of the client's end-to-end time
// (e2e-p50-us, e2e-p99-us) and, through the gateway, of the gateway's own
// time up to the stream's first byte (overhead-p50-us, overhead-p99-us,
// its Server-Timing "gateway": reading, tokenizer cache hit, kv-aware
// decision, sending, relaying the headers),
// and the requests per second.
func BenchmarkGatewayUnderLoad(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fleet, err := localfleet.Start(ctx, localfleet.Config{
		BinDir:  binDir,
		Engines: 2,
		EngineArgs: []string{"-step-overhead", "0", "-prefill-time-per-token", "0", "-decode-time-per-token", "0",
			"-num-gpu-blocks", "8192"},
		GatewayEnv: []string{"KVGATE_SHUTDOWN_TIMEOUT=5s"},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer fleet.Close()
	prompts := loadChats(b)
	gw := chatClient{http: newHTTPClient(64), url: fleet.GatewayURL() + "/v1/chat/completions", model: fleet.Model()}
	// Twice each: the first fills the tokenizer's cache and the engines'
	// caches, whose events reach the index by the second.
	for range 2 {
		for _, p := range prompts {
			if _, err := gw.send(ctx, routing.KVAware, p, loadAnswerTokens); err != nil {
				b.Fatal(err)
			}
		}
	}
	var direct []chatClient
	for _, e := range fleet.Engines() {
		direct = append(direct, chatClient{http: gw.http, url: e.URL + "/v1/chat/completions", model: fleet.Model()})
	}
	b.Run("direct", func(b *testing.B) { runLoad(ctx, b, prompts, direct) })
	base := fleet.GatewayURL()
	misses0, decided0 := tokenizerMisses(ctx, b, gw.http, base), scrapedDecisions(ctx, b, gw.http, base)
	b.Run("gateway", func(b *testing.B) { runLoad(ctx, b, prompts, []chatClient{gw}) })
	if err := fleet.Err(); err != nil {
		b.Fatal(err)
	}
	// What the benchmark claims to measure: cache hits and prefix
	// decisions only.
	if n := tokenizerMisses(ctx, b, gw.http, base) - misses0; n != 0 {
		b.Errorf("%v tokenizer cache misses under load, want none", n)
	}
	for _, d := range scrapedDecisions(ctx, b, gw.http, base).since(decided0) {
		if d.outcome != "prefix_hit" && d.outcome != "load_over_prefix" {
			b.Errorf("%v decisions %s/%s under load, want the index to match every prompt", d.count, d.algorithm, d.outcome)
		}
	}
}

// tokenizerMisses reads the gateway's count of tokenizer cache misses.
func tokenizerMisses(ctx context.Context, b *testing.B, client *http.Client, gatewayURL string) float64 {
	families, err := localfleet.Metrics(ctx, client, gatewayURL)
	if err != nil {
		b.Fatal(err)
	}
	return families["kvgate_tokenizer_cache_misses_total"].GetMetric()[0].GetCounter().GetValue()
}

func scrapedDecisions(ctx context.Context, b *testing.B, client *http.Client, gatewayURL string) decisions {
	c, err := scrapeCounts(ctx, client, gatewayURL)
	if err != nil {
		b.Fatal(err)
	}
	return c.decisions
}

// loadChats returns the benchmark's chats: the first turns of a
// shared-prefix workload, as messages.
func loadChats(b *testing.B) [][]chatMessage {
	w, err := newWorkload(routingbench.SharedPrefixConfig{
		Groups: 8, SystemPromptTokens: loadSystemTokens, Conversations: loadPrompts, Turns: 1,
		MinUserTokens: 50, MaxUserTokens: 150, MinAnswerTokens: loadAnswerTokens, MaxAnswerTokens: loadAnswerTokens, Seed: 1,
	}, routingbench.SimTexter{})
	if err != nil {
		b.Fatal(err)
	}
	var out [][]chatMessage
	for c, ok := w.conversation(); ok; c, ok = w.conversation() {
		messages, _, err := w.startDialog(c).nextTurn()
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, messages)
	}
	return out
}

// runLoad sends b.N requests from concurrent clients, each client taking
// the prompts and targets in turn, and reports the latency percentiles.
func runLoad(ctx context.Context, b *testing.B, prompts [][]chatMessage, targets []chatClient) {
	rec := newRecorder(time.Now())
	var clients atomic.Int64
	b.SetParallelism(loadClientsPerCPU)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := int(clients.Add(1)); pb.Next(); i++ {
			rec.begin()
			res, err := targets[i%len(targets)].send(ctx, routing.KVAware, prompts[i%len(prompts)], loadAnswerTokens)
			if err != nil {
				rec.fail(err)
				b.Error(err)
				return
			}
			rec.end(res)
		}
	})
	b.StopTimer()
	s := rec.summarize(time.Now(), nil)
	micros := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	b.ReportMetric(micros(s.e2e.p50), "e2e-p50-us")
	b.ReportMetric(micros(s.e2e.p99), "e2e-p99-us")
	if own := s.timing[gateway.ServerTimingGateway]; own.ok {
		b.ReportMetric(micros(own.p50), "overhead-p50-us")
		b.ReportMetric(micros(own.p99), "overhead-p99-us")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}
