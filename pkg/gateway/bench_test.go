package gateway

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/routing"
)

// BenchmarkProxy measures one request through the whole gateway over
// loopback, as a client sees it: decode, tokenizer cache hit, kv-aware
// decision on a prompt the index holds, request tracking, forwarding over
// a keep-alive connection to an engine answering at once with canned
// bytes, and relaying the response with its usage read. ns/op and allocs
// include the client's and the engine's HTTP work on the same machine;
// overhead-ns/op is the gateway's own share before the request leaves for
// the pod (kvgate_gateway_overhead_seconds: decode, tokenize, route).
// slo-completion routes with slo-least-load-pulling through the model's SLO
// queue (an objective every pod meets) instead of kv-aware.
func BenchmarkProxy(b *testing.B) {
	f := startFleet(b, []string{"a", "b"}, fleetOptions{env: map[string]string{"KVGATE_SLO_TTFT": "60s"}})
	tokens := toyTokens(sharedPrompt)
	f.waitMatched(tokens, "b", len(f.engine("b").storePrompt(tokens)))
	whole := []byte(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"llama","choices":[{"index":0,` +
		`"text":" a b c","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":352,"total_tokens":355,"completion_tokens":3}}`)
	events := streamEvents("llama", false, len(tokens), true)
	for _, e := range f.engines {
		e.forget = true
		e.setAnswer(func(w http.ResponseWriter, r *http.Request, body []byte) {
			if !strings.Contains(string(body), `"stream":true`) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(whole)
				return
			}
			writeSSE(w, events)
		})
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for _, bc := range []struct{ name, body, algorithm string }{
		{"completion", completion(sharedPrompt, `,"max_tokens":3`), routing.KVAware},
		{"stream", completion(sharedPrompt, `,"max_tokens":3,"stream":true`), routing.KVAware},
		{"slo-completion", completion(sharedPrompt, `,"max_tokens":3`), routing.SLOLeastLoadPulling},
	} {
		b.Run(bc.name, func(b *testing.B) {
			do := func() {
				req, _ := http.NewRequest(http.MethodPost, f.url+"/v1/completions", strings.NewReader(bc.body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(routing.HeaderRoutingStrategy, bc.algorithm)
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/b" {
					b.Fatalf("%d from %q", resp.StatusCode, resp.Header.Get(HeaderTargetPodName))
				}
			}
			do() // the first request fills the tokenizer's cache
			sum0, n0 := f.metric("kvgate_gateway_overhead_seconds_sum"), f.metric("kvgate_gateway_overhead_seconds_count")
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				do()
			}
			b.StopTimer()
			sum, n := f.metric("kvgate_gateway_overhead_seconds_sum")-sum0, f.metric("kvgate_gateway_overhead_seconds_count")-n0
			b.ReportMetric(sum/n*1e9, "overhead-ns/op")
		})
	}
	if n := f.metric(`kvgate_gateway_tokenization_failures_total{reason="status"}`); n != 0 {
		b.Fatalf("%v tokenization failures", n)
	}
}

// relayBenchStream is a whole three-token stream of one API's events.
type relayBenchStream struct {
	name   string
	kind   kind
	events []string
}

// relayBenchStreams are the streams the relay benchmarks read, one per
// API that streams events.
func relayBenchStreams() []relayBenchStream {
	return []relayBenchStream{
		{"chat", kindChat, streamEvents("llama", true, 352, true)},
		{"messages", kindMessages, messagesEvents("llama", 352)},
		{"responses", kindResponses, responsesEvents("llama", responsesUsage(352))},
	}
}

// BenchmarkRelayInspect measures reading one whole three-token stream of
// each API's events as the relay reads them, in process: the first token
// found and the usage read, every event relayed.
func BenchmarkRelayInspect(b *testing.B) {
	for _, bc := range relayBenchStreams() {
		events := make([][]byte, len(bc.events))
		for i, ev := range bc.events {
			events[i] = []byte(ev)
		}
		b.Run(bc.name, func(b *testing.B) {
			firsts := 0
			b.ReportAllocs()
			for b.Loop() {
				r := eventReader{kind: bc.kind, firstToken: func() { firsts++ }}
				for _, ev := range events {
					r.inspect(ev)
				}
				if !r.hasUsage || !r.seenToken {
					b.Fatalf("usage %v, first token %v", r.hasUsage, r.seenToken)
				}
			}
		})
	}
}

// BenchmarkRelayRun measures relaying one whole three-token stream of each
// API's events as the proxy does, in process: every event held within
// DefaultMaxStreamEventBytes, read and written, the usage found.
func BenchmarkRelayRun(b *testing.B) {
	for _, bc := range relayBenchStreams() {
		input := strings.NewReader(strings.Join(bc.events, ""))
		src := bufio.NewReaderSize(input, 64<<10)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			s := &sseRelay{}
			firstToken := func() {}
			for b.Loop() {
				_, _ = input.Seek(0, io.SeekStart)
				src.Reset(input)
				*s = sseRelay{dst: io.Discard, flush: func() error { return nil }, src: src, maxEvent: DefaultMaxStreamEventBytes,
					event: s.event[:0], eventReader: eventReader{kind: bc.kind, dropUsage: true, firstToken: firstToken}}
				if err := s.run(); err != nil || !s.hasUsage {
					b.Fatalf("run: %v, usage %v", err, s.hasUsage)
				}
			}
		})
	}
}

// BenchmarkResponseBody measures reading one whole three-token chat
// stream through Response.Body as the external processor hands it over, in
// pieces of a given size (about a token event, and a few events): every
// event held within DefaultMaxStreamEventBytes, read and relayed, the
// usage found. "oversized" adds two events of 4 KiB read with a bound of
// 1 KiB, relayed unread.
func BenchmarkResponseBody(b *testing.B) {
	events := streamEvents("llama", true, 352, true)
	big := "data: " + strings.Repeat("x", 4<<10) + "\n\n"
	for _, bc := range []struct {
		name     string
		input    string
		maxEvent int
		piece    int
	}{
		{"pieces=64", strings.Join(events, ""), DefaultMaxStreamEventBytes, 64},
		{"pieces=512", strings.Join(events, ""), DefaultMaxStreamEventBytes, 512},
		{"oversized/pieces=512", events[0] + big + big + strings.Join(events[1:], ""), 1 << 10, 512},
		// Events held whole in many pieces: one of 256 KiB on one line, one
		// of 256 KiB on many lines.
		{"held/line/pieces=512", events[0] + "data: " + strings.Repeat("x", 256<<10) + "\n\n" + strings.Join(events[1:], ""),
			DefaultMaxStreamEventBytes, 512},
		{"held/lines/pieces=512", events[0] + strings.Repeat("data: "+strings.Repeat("x", 250)+"\n", 1<<10) + "\n" +
			strings.Join(events[1:], ""), DefaultMaxStreamEventBytes, 512},
	} {
		input := []byte(bc.input)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			r := &Response{}
			var dst []byte
			for b.Loop() {
				*r = Response{status: 200, sse: true, maxEvent: bc.maxEvent, partial: r.partial[:0],
					events: eventReader{kind: kindChat, dropUsage: true, firstToken: func() {}}}
				for rest := input; len(rest) > 0; {
					n := min(bc.piece, len(rest))
					dst = r.Body(dst[:0], rest[:n], n == len(rest))
					rest = rest[n:]
				}
				if !r.events.hasUsage {
					b.Fatal("no usage read")
				}
			}
		})
	}
}
