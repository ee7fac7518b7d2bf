package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/pkg/routing"
)

// relayAll runs an sseRelay over input read in pieces by wrap, and returns
// what the client received, the usage found and the number of first-token
// calls.
func relayAll(t testing.TB, input string, dropUsage bool, wrap func(io.Reader) io.Reader) (string, *sseRelay, int) {
	return relayBounded(t, input, dropUsage, 0, wrap)
}

// relayBounded is relayAll with the relay's maxEvent.
func relayBounded(t testing.TB, input string, dropUsage bool, maxEvent int, wrap func(io.Reader) io.Reader) (string, *sseRelay, int) {
	var out bytes.Buffer
	firsts := 0
	s := &sseRelay{dst: &out, flush: func() error { return nil }, maxEvent: maxEvent,
		src:         bufio.NewReaderSize(wrap(strings.NewReader(input)), 16),
		eventReader: eventReader{dropUsage: dropUsage, firstToken: func() { firsts++ }}}
	if err := s.run(); err != nil {
		t.Fatalf("run: %v", err)
	}
	return out.String(), s, firsts
}

func TestSSERelayFindsTheFirstTokenAndTheUsageChunk(t *testing.T) {
	role := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	token := `data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}` + "\r\n\r\n"
	usageEvent := `data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}` + "\n\n"
	done := "data: [DONE]\n\n"
	input := role + ": ping\n\n" + token + usageEvent + done
	for name, wrap := range map[string]func(io.Reader) io.Reader{
		"whole": func(r io.Reader) io.Reader { return r }, "byte by byte": iotest.OneByteReader, "halves": iotest.HalfReader,
	} {
		for _, drop := range []bool{false, true} {
			out, s, firsts := relayAll(t, input, drop, wrap)
			want := input
			if drop {
				want = role + ": ping\n\n" + token + done
			}
			if out != want || !s.hasUsage || s.usage != (usage{PromptTokens: 7, CompletionTokens: 2}) || firsts != 1 {
				t.Errorf("%s, drop %v: out %q, usage %+v %v, first tokens %d", name, drop, out, s.usage, s.hasUsage, firsts)
			}
		}
	}
}

// TestSSERelayPassesAnOversizedEventOnUnread: an event beyond maxEvent is
// relayed as it comes, unread, to the blank line ending it, in either line
// ending, however the reads cut it; the events after it are read again,
// and what the relay holds stays within the bound and a read.
func TestSSERelayPassesAnOversizedEventOnUnread(t *testing.T) {
	const bound = 128
	role := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	token := `data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}` + "\n\n"
	big := "event: x\nid: 1\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("\\n", bound) + "\"}}]}\n\n"
	usageEvent := `data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}` + "\n\n"
	bigUsage := `data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2},"pad":"` + strings.Repeat("p", 2*bound) + "\"}\n\n"
	done := "data: [DONE]\n\n"
	for _, tc := range []struct {
		name       string
		events     []string
		withheld   int // the index of the event withheld, -1 for none
		oversized  int
		usage      bool
		firstToken bool
	}{
		{"an oversized event amid the stream", []string{role, big, token, usageEvent, done}, 3, 1, true, true},
		{"the first token in an oversized event", []string{role, big, usageEvent, done}, 2, 1, true, false},
		{"an oversized usage chunk", []string{role, token, bigUsage, done}, -1, 1, false, true},
		{"oversized events in a row", []string{big, big, bigUsage, token, done}, -1, 3, false, true},
		{"an oversized event at the end without its blank line", []string{role, token, usageEvent, big[:len(big)-1]}, 2, 1, true, true},
	} {
		for _, crlf := range []bool{false, true} {
			for name, wrap := range map[string]func(io.Reader) io.Reader{
				"whole": func(r io.Reader) io.Reader { return r }, "byte by byte": iotest.OneByteReader, "halves": iotest.HalfReader,
			} {
				var input, want strings.Builder
				for i, ev := range tc.events {
					if crlf {
						ev = strings.ReplaceAll(ev, "\n", "\r\n")
					}
					input.WriteString(ev)
					if i != tc.withheld {
						want.WriteString(ev)
					}
				}
				var out bytes.Buffer
				firsts := 0
				counted := prometheus.NewCounter(prometheus.CounterOpts{Name: "oversized"})
				s := &sseRelay{dst: &out, flush: func() error { return nil }, maxEvent: bound, oversized: counted,
					src:         bufio.NewReaderSize(wrap(strings.NewReader(input.String())), 16),
					eventReader: eventReader{dropUsage: true, firstToken: func() { firsts++ }}}
				err := s.run()
				wantFirsts := 0
				if tc.firstToken {
					wantFirsts = 1
				}
				if err != nil || out.String() != want.String() || s.hasUsage != tc.usage || firsts != wantFirsts {
					t.Errorf("%s, CRLF %v, %s: %v, relayed %q, usage %v, %d first tokens; want %q, usage %v, %d first tokens",
						tc.name, crlf, name, err, out.String(), s.hasUsage, firsts, want.String(), tc.usage, wantFirsts)
				}
				var m dto.Metric
				if err := counted.Write(&m); err != nil {
					t.Fatal(err)
				}
				if n := m.GetCounter().GetValue(); n != float64(tc.oversized) {
					t.Errorf("%s, CRLF %v, %s: %v oversized events counted, want %d", tc.name, crlf, name, n, tc.oversized)
				}
				if c := cap(s.event); c > 2*(bound+16) {
					t.Errorf("%s, CRLF %v, %s: the relay held %d bytes, want at most the bound and a read", tc.name, crlf, name, c)
				}
			}
		}
	}
}

// TestSSERelayEndsAnEventOnlyAtABlankLine: a line ending that a read
// returns alone, the rest of its line read before, ends the line, not the
// event.
func TestSSERelayEndsAnEventOnlyAtABlankLine(t *testing.T) {
	// The usage chunk's data line is 80 bytes before its ending: the
	// relay's reader, of 16 bytes, returns its ending alone.
	token := "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"
	data := `data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}`
	data = data[:len(data)-1] + strings.Repeat(" ", 80-len(data)) + "}"
	for _, end := range []string{"\n", "\r\n"} {
		usageEvent := data + end + end
		if len(data) != 80 {
			t.Fatalf("data line of %d bytes", len(data))
		}
		out, s, _ := relayAll(t, token+usageEvent+"data: [DONE]"+end+end, true, iotest.OneByteReader)
		if out != token+"data: [DONE]"+end+end || !s.hasUsage {
			t.Errorf("line ending %q: relayed %q, usage %v; want the usage chunk read and withheld whole", end, out, s.hasUsage)
		}
	}
}

func TestSSERelayReportsAStreamThatBreaksOff(t *testing.T) {
	var out bytes.Buffer
	broken := errors.New("connection reset")
	src := io.MultiReader(strings.NewReader("data: {\"choices\":[]}\n\ndata: {\"cho"), iotest.ErrReader(broken))
	s := &sseRelay{dst: &out, flush: func() error { return nil }, src: bufio.NewReader(src), eventReader: eventReader{firstToken: func() {}}}
	if err := s.run(); !errors.Is(err, broken) {
		t.Fatalf("run = %v, want the read error", err)
	}
	// The incomplete event is dropped: the client's next event is to be the
	// error the caller writes, not a fragment it cannot parse.
	if out.String() != "data: {\"choices\":[]}\n\n" {
		t.Errorf("relayed %q, want the whole events read", out.String())
	}
}

func TestSSERelayStopsWhenTheClientLeaves(t *testing.T) {
	s := &sseRelay{dst: failingWriter{}, flush: func() error { return nil },
		src: bufio.NewReader(strings.NewReader("data: x\n\n")), eventReader: eventReader{firstToken: func() {}}}
	if err := s.run(); !errors.Is(err, errClientGone) {
		t.Fatalf("run = %v, want errClientGone", err)
	}
}

func TestSSERelayLeavesTheLastEventToTheEndOfTheResponse(t *testing.T) {
	// The engine's events come one read at a time. Each is flushed as it
	// comes, but the last: the engine's body has ended by then, and the
	// event goes out with the end of the response.
	events := &eventSource{events: []string{"data: a\n\n", "data: b\n\n", "data: [DONE]\n\n"}}
	var out bytes.Buffer
	var flushed []string
	s := &sseRelay{dst: &out, flush: func() error { flushed = append(flushed, out.String()); return nil },
		src: bufio.NewReader(events), more: func() int { return 0 }, ended: func() bool { return len(events.events) == 0 },
		eventReader: eventReader{firstToken: func() {}}}
	if err := s.run(); err != nil {
		t.Fatal(err)
	}
	want := []string{"data: a\n\n", "data: a\n\ndata: b\n\n"}
	if out.String() != "data: a\n\ndata: b\n\ndata: [DONE]\n\n" || strings.Join(flushed, "|") != strings.Join(want, "|") {
		t.Errorf("relayed %q, flushed after %q; want flushes after %q", out.String(), flushed, want)
	}
}

// TestSSERelayEndsWithTheBoundsErrorOncePastIt: an event read after the
// response's bound passed is not flushed, whose write would fail at the
// client's connection and close it; the relay ends with errResponseTimeout,
// for the gateway to write the error event the bound calls for.
func TestSSERelayEndsWithTheBoundsErrorOncePastIt(t *testing.T) {
	var bound clock
	bound.boundResponse(time.Now().Add(time.Hour))
	events := &eventSource{events: []string{"data: a\n\n", "data: b\n\n", "data: c\n\n"}}
	var out bytes.Buffer
	var flushed []string
	s := &sseRelay{dst: &out, src: bufio.NewReader(events), more: func() int { return 0 }, bound: &bound,
		eventReader: eventReader{firstToken: func() {}}}
	s.flush = func() error {
		flushed = append(flushed, out.String())
		bound.boundResponse(time.Now().Add(-time.Millisecond)) // passed while the engine sent the next event
		return nil
	}
	if err := s.run(); !errors.Is(err, errResponseTimeout) {
		t.Fatalf("run = %v, want errResponseTimeout", err)
	}
	if strings.Join(flushed, "|") != "data: a\n\n" {
		t.Errorf("flushed after %q, want once, after the first event", flushed)
	}
}

// eventSource returns one event a read, then io.EOF.
type eventSource struct{ events []string }

func (e *eventSource) Read(p []byte) (int, error) {
	if len(e.events) == 0 {
		return 0, io.EOF
	}
	n := copy(p, e.events[0])
	e.events = e.events[1:]
	return n, nil
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestDataPayload(t *testing.T) {
	tests := []struct {
		event, payload string
		ok             bool
	}{
		{"data: {}\n\n", "{}", true},
		{"data:{}\r\n\r\n", "{}", true},
		{"id: 1\nevent: x\ndata: [DONE]\n\n", "[DONE]", true},
		{": comment\n\n", "", false},
		{"data: a\ndata: b\n\n", "", false},
	}
	for _, tt := range tests {
		p, ok := dataPayload([]byte(tt.event))
		if string(p) != tt.payload || ok != tt.ok {
			t.Errorf("dataPayload(%q) = %q, %v; want %q, %v", tt.event, p, ok, tt.payload, tt.ok)
		}
	}
}

func FuzzSSERelayPassesEveryByteThrough(f *testing.F) {
	f.Add("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n")
	f.Add(": c\r\n\r\nid: 1\ndata: {\"x\":1}\n\n\n\ndata: {")
	f.Fuzz(func(t *testing.T, input string) {
		out, s, firsts := relayAll(t, input, false, iotest.HalfReader)
		if out != input {
			t.Fatalf("relayed %q, want %q", out, input)
		}
		if firsts > 1 {
			t.Fatalf("first token reported %d times", firsts)
		}
		dropped, ds, _ := relayAll(t, input, true, iotest.OneByteReader)
		if ds.hasUsage != s.hasUsage || (!s.hasUsage && dropped != input) || len(dropped) > len(input) {
			t.Fatalf("withholding usage relayed %q of %q", dropped, input)
		}
		// Events beyond a small bound are relayed unread, whole.
		if bounded, _, _ := relayBounded(t, input, false, 24, iotest.HalfReader); bounded != input {
			t.Fatalf("bounded to 24 bytes an event, relayed %q, want %q", bounded, input)
		}
	})
}

func TestWithStreamUsage(t *testing.T) {
	tests := []struct{ body, opts, want string }{
		{`{"model":"m","stream":true}`, ``, `{` + usageOption + `,"model":"m","stream":true}`},
		{` {}`, ``, ` {` + usageOption + `}`},
		{`{"stream":true,"stream_options":null}`, `null`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`, `{"include_usage":false,"continuous_usage_stats":true}`,
			`{"stream":true,"stream_options":{"continuous_usage_stats":false,"include_usage":true}}`},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		got, err := withStreamUsage(&buf, []byte(tt.body), json.RawMessage(tt.opts))
		if err != nil || string(got) != tt.want {
			t.Errorf("withStreamUsage(%s) = %s, %v; want %s", tt.body, got, err, tt.want)
		}
	}
}

func FuzzWithStreamUsageChangesOnlyStreamOptions(f *testing.F) {
	f.Add(`{"model":"m","prompt":"hi","stream":true}`)
	f.Add(`{"stream":true,"stream_options":{"x":1}, "n":2}`)
	f.Add(` { "a" : [1, {"b":null}] } `)
	f.Fuzz(func(t *testing.T, body string) {
		var in inference
		if in.decode(kindCompletion, []byte(body)) != nil {
			return
		}
		var buf bytes.Buffer
		out, err := withStreamUsage(&buf, []byte(body), in.comp.StreamOptions)
		if err != nil {
			return
		}
		var before, after map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &before); err != nil {
			t.Fatalf("decoded body does not decode as an object: %v", err)
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("result %q is not a JSON object: %v", out, err)
		}
		var opts struct {
			IncludeUsage bool `json:"include_usage"`
		}
		if json.Unmarshal(after["stream_options"], &opts) != nil || !opts.IncludeUsage {
			t.Fatalf("result %q does not ask for usage", out)
		}
		delete(before, "stream_options")
		delete(after, "stream_options")
		if len(before) != len(after) {
			t.Fatalf("members changed: %q -> %q", body, out)
		}
		for k, v := range before {
			var a, b bytes.Buffer
			if json.Compact(&a, v) != nil || json.Compact(&b, after[k]) != nil || a.String() != b.String() {
				t.Fatalf("member %q changed: %q -> %q", k, body, out)
			}
		}
	})
}

func TestReadUsageTakesTheCachedTokensWhenReported(t *testing.T) {
	for _, tc := range []struct {
		body string
		want usage
		ok   bool
	}{
		{`{"prompt_tokens":2048,"completion_tokens":5}`, usage{PromptTokens: 2048, CompletionTokens: 5}, true},
		{`{"prompt_tokens":2048,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":1536}}`,
			usage{PromptTokens: 2048, CompletionTokens: 5, CachedTokens: 1536, CachedReported: true}, true},
		{`{"prompt_tokens_details":{"audio_tokens":null,"cached_tokens":0},"prompt_tokens":9,"completion_tokens":1}`,
			usage{PromptTokens: 9, CompletionTokens: 1, CachedReported: true}, true},
		// vLLM without --enable-prompt-tokens-details writes null.
		{`{"prompt_tokens":9,"completion_tokens":1,"prompt_tokens_details":null}`, usage{PromptTokens: 9, CompletionTokens: 1}, true},
		{`{"prompt_tokens":9,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":null}}`,
			usage{PromptTokens: 9, CompletionTokens: 1}, true},
		{`{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":"many"}}`, usage{PromptTokens: 9}, false},
		{`{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":1`, usage{}, false},
	} {
		got, ok := readUsage([]byte(tc.body))
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("readUsage(%s) = %+v, %v; want %+v, %v", tc.body, got, ok, tc.want, tc.ok)
		}
	}
}

func TestReadUsageRefusesNegativeTokenCounts(t *testing.T) {
	for _, body := range []string{
		`{"prompt_tokens":-1,"completion_tokens":5}`,
		`{"prompt_tokens":9,"completion_tokens":-300}`,
		`{"prompt_tokens":9,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":-4}}`,
	} {
		if got, ok := readUsage([]byte(body)); ok {
			t.Errorf("readUsage(%s) = %+v, read; want it refused", body, got)
		}
		if got, ok := responseUsage([]byte(`{"choices":[],"usage":`+body+`}`), kindCompletion); ok {
			t.Errorf("responseUsage with usage %s = %+v, read; want it refused", body, got)
		}
	}
}

func TestADeclaredLengthReservesLittleBeforeItsBytesArrive(t *testing.T) {
	var buf bytes.Buffer
	growForDeclared(&buf, 16<<20)
	if buf.Cap() > 2*maxPreGrow {
		t.Errorf("16 MiB declared: %d bytes reserved, want at most %d", buf.Cap(), 2*maxPreGrow)
	}
	var small bytes.Buffer
	growForDeclared(&small, 3000)
	if small.Cap() < 3000 {
		t.Errorf("3000 bytes declared: %d bytes reserved, want room for all", small.Cap())
	}
	// A body longer than the room made still arrives whole.
	var keep bytes.Buffer
	body := strings.Repeat("x", 3*maxPreGrow)
	complete, err := readWhole(strings.NewReader(body), &keep, 16<<20, 4<<20, new(io.LimitedReader))
	if err != nil || !complete || keep.String() != body {
		t.Errorf("readWhole: complete %v, %v, %d bytes of %d", complete, err, keep.Len(), len(body))
	}
}

// podResponseWith returns a pod's response whose header lines are lines,
// each "Name: value".
func podResponseWith(lines ...string) *podResponse {
	res := &podResponse{status: 200}
	for _, l := range lines {
		start := len(res.headerBytes)
		res.headerBytes = append(res.headerBytes, l...)
		res.fields = append(res.fields, headerField{start: start, colon: start + strings.Index(l, ":"), end: len(res.headerBytes)})
	}
	return res
}

func TestTheEndToEndHeadersOfAPodsResponseAreCopied(t *testing.T) {
	var vs headerValues
	res := podResponseWith("Content-Type: application/json", "Connection: X-Hop", "X-Hop: a", "Keep-Alive: timeout=5",
		"set-cookie: a=1", "Set-Cookie: b=2", "Content-Length: 10", "Server: engine")
	for range 2 { // the second response's values are the first's, seen
		hd := http.Header{}
		copyResponseHeader(hd, res, &vs)
		want := http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}, "Server": {"engine"}}
		if !reflect.DeepEqual(hd, want) {
			t.Fatalf("copied %v, want %v", hd, want)
		}
		// Appending to one value slice leaves the others be.
		hd["Content-Type"] = append(hd["Content-Type"], "text/plain")
		if hd.Get("Server") != "engine" {
			t.Errorf("appending to Content-Type changed Server to %q", hd.Get("Server"))
		}
		vs.reset()
	}
}

// TestThePodsCopiesOfTheGatewaysHeadersAreDropped: a pod's Target-Pod,
// Target-Pod-Name or Routing-Strategy, in any case, is not copied beside
// the gateway's own: the client gets the gateway's values alone.
func TestThePodsCopiesOfTheGatewaysHeadersAreDropped(t *testing.T) {
	var vs headerValues
	res := podResponseWith("Target-Pod: 6.6.6.6:80", "target-pod-name: evil/pod", "ROUTING-STRATEGY: forged",
		"Content-Type: application/json")
	hd := http.Header{}
	d := routing.Decision{PodKey: "static/a", Algorithm: "kv-aware"}
	setHeader(hd, res, &d, "10.0.0.1:8000", &vs)
	want := http.Header{HeaderTargetPod: {"10.0.0.1:8000"}, HeaderTargetPodName: {"static/a"},
		routing.HeaderRoutingStrategy: {"kv-aware"}, "Content-Type": {"application/json"}}
	if !reflect.DeepEqual(hd, want) {
		t.Errorf("response headers %v, want %v", hd, want)
	}
}

func TestHeaderValuesReuseTheStringsOfValuesSeen(t *testing.T) {
	var vs headerValues
	common := []byte("application/json")
	first := vs.str(common)
	if n := testing.AllocsPerRun(100, func() {
		if vs.str(common) != first {
			t.Fatal("a different value")
		}
	}); n != 0 {
		t.Errorf("a value seen before costs %v allocations, want 0", n)
	}
	long := bytes.Repeat([]byte("v"), maxSeenValue+1)
	vs.str(long)
	if n := testing.AllocsPerRun(10, func() { vs.str(long) }); n != 1 {
		t.Errorf("a value over %d bytes costs %v allocations, want 1: it is not kept", maxSeenValue, n)
	}
	// More values than it keeps: the oldest go, and every value is right.
	for i := range 3 * len(vs.seen) {
		v := []byte(strings.Repeat("x", i+1))
		if got := vs.str(v); got != string(v) {
			t.Fatalf("str(%q) = %q", v, got)
		}
	}
	// One-element slices: more than the slots still work.
	var all [][]string
	for i := range len(vs.slots) + 2 {
		all = append(all, vs.one(strconv.Itoa(i)))
	}
	for i, s := range all {
		if len(s) != 1 || cap(s) != 1 || s[0] != strconv.Itoa(i) {
			t.Errorf("slice %d = %q (cap %d)", i, s, cap(s))
		}
	}
	vs.reset()
	if vs.used != 0 || vs.slots[0] != "" {
		t.Error("reset kept the slots")
	}
}

func TestTheRoutingStrategyHeaderIsReadWithoutAllocating(t *testing.T) {
	h := http.Header{}
	h.Set(routing.HeaderRoutingStrategy, "kv-aware")
	if n := testing.AllocsPerRun(100, func() {
		if h.Get(routingStrategyKey) != "kv-aware" {
			t.Fatal("header not found")
		}
	}); n != 0 {
		t.Errorf("reading it costs %v allocations, want 0", n)
	}
}
