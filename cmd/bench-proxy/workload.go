package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// Names of the workloads.
const (
	wlCompletions = "completions"
	wlStream      = "stream"
	wlKVSeen      = "kv-seen"
	wlKVNew       = "kv-new"
)

// workload is one kind of request the benchmark sends.
type workload struct {
	name string
	// title describes it in the report.
	title string
	path  string
	// bodies are sent in turn.
	bodies [][]byte
	// unique marks bodies holding a counter placeholder (counterWidth
	// zeros after counterMark) that each request replaces with a number of
	// its own, so that no two prompts are alike.
	unique bool
	stream bool
	// concurrency lists the numbers of concurrent clients it runs at.
	concurrency []int
	// targets name what it is sent through (see target.name).
	targets []string
}

// counterMark precedes the placeholder of a unique prompt's number.
const (
	counterMark  = "request "
	counterWidth = 12
)

// words make up the prompts; the simulator tokenizes each as one token or
// a few.
var words = strings.Fields(`the quick brown fox jumps over a lazy dog while seven tired engineers
measure how much time each proxy spends on every request that passes through it on its way to
one of two simulated engines answering at once with a single token of output`)

// prompt returns n words drawn from words with seed.
func prompt(n int, seed uint64) string {
	r := rand.New(rand.NewPCG(seed, 0x6b7667617465))
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()
}

// completionBody is a /v1/completions body.
func completionBody(model, prompt string, maxTokens int, stream bool) []byte {
	body := map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "temperature": 0}
	if stream {
		body["stream"] = true
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return b
}

// workloadOptions shape the workloads.
type workloadOptions struct {
	model        string
	concurrency  []int
	streamConc   []int
	streamTokens int
	// longWords is the length in words of the long prompts of the
	// kv-aware workloads; seenPrompts how many of them are sent in turn.
	longWords   int
	seenPrompts int
	// proxies are the reverse proxies found, by name.
	proxies []string
	// baseline adds, after each of the gateway's targets, the same through
	// the baseline build.
	baseline bool
}

// workloads returns the workloads named in names.
func workloads(o workloadOptions, names []string) ([]workload, error) {
	all := append([]string{targetDirect}, o.proxies...)
	var out []workload
	for _, name := range names {
		w := workload{name: name, path: "/v1/completions", concurrency: o.concurrency}
		switch name {
		case wlCompletions:
			w.title = "Completions, short prompt, max_tokens 1"
			w.bodies = [][]byte{completionBody(o.model, prompt(24, 1), 1, false)}
			w.targets = append(all, gatewayTarget("random"), gatewayTarget("least-request"))
		case wlStream:
			w.title = fmt.Sprintf("Streamed completions, short prompt, %d tokens", o.streamTokens)
			w.bodies = [][]byte{completionBody(o.model, prompt(24, 2), o.streamTokens, true)}
			w.stream, w.concurrency = true, o.streamConc
			w.targets = append(all, gatewayTarget("random"), gatewayTarget("least-request"))
		case wlKVSeen:
			w.title = fmt.Sprintf("Completions, %d-word prompts seen before (%d in turn), max_tokens 1", o.longWords, o.seenPrompts)
			for i := range o.seenPrompts {
				w.bodies = append(w.bodies, completionBody(o.model, prompt(o.longWords, 100+uint64(i)), 1, false))
			}
			w.targets = []string{targetDirect, gatewayTarget("least-request"), gatewayTarget("kv-aware")}
		case wlKVNew:
			w.title = fmt.Sprintf("Completions, a new %d-word prompt each time, max_tokens 1", o.longWords)
			p := counterMark + strings.Repeat("0", counterWidth) + " " + prompt(o.longWords, 99)
			w.bodies, w.unique = [][]byte{completionBody(o.model, p, 1, false)}, true
			w.targets = []string{targetDirect, gatewayTarget("least-request"), gatewayTarget("kv-aware")}
		default:
			return nil, fmt.Errorf("unknown workload %q: want %s, %s, %s or %s", name, wlCompletions, wlStream, wlKVSeen, wlKVNew)
		}
		if o.baseline {
			var ts []string
			for _, t := range w.targets {
				ts = append(ts, t)
				if alg, ok := strings.CutPrefix(t, gatewayTarget("")); ok {
					ts = append(ts, baselineTarget(alg))
				}
			}
			w.targets = ts
		}
		out = append(out, w)
	}
	return out, nil
}

// numberRequest writes n into body's counter placeholder, which starts at
// offset.
func numberRequest(body []byte, offset int, n uint64) {
	for i := offset + counterWidth - 1; i >= offset; i-- {
		body[i] = byte('0' + n%10)
		n /= 10
	}
}
