package gateway

import (
	"bytes"
	"strings"
	"testing"
)

// relayPieces feeds input to an event-stream Response in the pieces sizes
// gives (the rest in one last piece) and returns what the client receives,
// the Response and the number of first-token reports.
func relayPieces(input string, drop bool, sizes []int) (string, *Response, int) {
	return relayBoundedPieces(input, drop, DefaultMaxStreamEventBytes, sizes)
}

// relayBoundedPieces is relayPieces with events bounded to maxEvent bytes.
func relayBoundedPieces(input string, drop bool, maxEvent int, sizes []int) (string, *Response, int) {
	firsts := 0
	r := &Response{status: 200, sse: true, maxEvent: maxEvent,
		events: eventReader{dropUsage: drop, firstToken: func() { firsts++ }}}
	var out, dst []byte
	rest := []byte(input)
	for _, n := range sizes {
		n = min(n, len(rest))
		dst = r.Body(dst[:0], rest[:n], false)
		out = append(out, dst...)
		rest = rest[n:]
	}
	dst = r.Body(dst[:0], rest, true)
	out = append(out, dst...)
	return string(out), r, firsts
}

func TestResponseRelaysWhatTheProxyRelaysWhateverThePieces(t *testing.T) {
	role := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	token := `data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}` + "\r\n\r\n"
	usageEvent := `data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}` + "\n\n"
	done := "data: [DONE]\n\n"
	input := role + ": ping\n\n" + token + usageEvent + done
	for _, drop := range []bool{false, true} {
		want := input
		if drop {
			want = role + ": ping\n\n" + token + done
		}
		check := func(name string, sizes []int) {
			t.Helper()
			out, r, firsts := relayPieces(input, drop, sizes)
			if out != want || !r.events.hasUsage || r.events.usage != (usage{PromptTokens: 7, CompletionTokens: 2}) || firsts != 1 {
				t.Fatalf("%s, drop %v: out %q, usage %+v %v, first tokens %d", name, drop, out, r.events.usage, r.events.hasUsage, firsts)
			}
		}
		check("whole", nil)
		ones := make([]int, len(input))
		for i := range ones {
			ones[i] = 1
		}
		check("byte by byte", ones)
		for cut := 1; cut < len(input); cut++ {
			check("cut", []int{cut})
		}
	}
}

func TestResponseRelaysAnOversizedEventAsItComes(t *testing.T) {
	big := "data: " + strings.Repeat("x", DefaultMaxStreamEventBytes) + "\n\n"
	input := big + big + `data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}` + "\n\n"
	out, r, _ := relayPieces(input, true, []int{len(big) / 2, len(big)/2 - 1, 1, len(big) - 1, 1})
	if out != big+big {
		t.Fatalf("relayed %d bytes, want the oversized events (%d bytes each) whole and the usage chunk withheld", len(out), len(big))
	}
	if !r.events.hasUsage || len(r.partial) != 0 {
		t.Errorf("usage read %v, %d bytes held at the end", r.events.hasUsage, len(r.partial))
	}
	if n := r.OversizedEvents(); n != 2 {
		t.Errorf("%d oversized events counted, want 2", n)
	}
}

func TestResponseEndsEventsOnlyAtBlankLinesWhateverThePieces(t *testing.T) {
	const bound = 64
	for _, nl := range []string{"\n", "\r\n"} {
		token := `data: {"choices":[{"text":"Hi"}]}` + nl + nl
		// An event of two lines each longer than the bound.
		big := "data: " + strings.Repeat("x", 2*bound) + nl + "data: " + strings.Repeat("y", 2*bound) + nl + nl
		// An event longer than the bound, after the usage, whose second line
		// alone would read as usage: its own, when it came whole in a piece.
		trap := ": " + strings.Repeat("c", 2*bound) + nl + `data: {"choices":[],"usage":{"prompt_tokens":99}}` + nl + nl
		usageEvent := `data: {"choices":[],"usage":{"prompt_tokens":7}}` + nl + nl
		input := token + big + usageEvent + trap + "data: [DONE]" + nl + nl
		// held reports whether a piece other than the last ends within the
		// event from start to end more than the bound past its start: the
		// event is then relayed unread, and counted.
		held := func(sizes []int, start, end int) bool {
			p := 0
			for _, size := range sizes {
				if p += size; p-start > bound && p < end {
					return true
				}
			}
			return false
		}
		check := func(name string, sizes []int) {
			t.Helper()
			out, r, firsts := relayBoundedPieces(input, false, bound, sizes)
			if out != input {
				t.Fatalf("%q endings, %s %v: relayed %q, want %q", nl, name, sizes, out, input)
			}
			oversized, want := 0, usage{PromptTokens: 99}
			if held(sizes, len(token), len(token+big)) {
				oversized++
			}
			if held(sizes, len(token+big+usageEvent), len(token+big+usageEvent+trap)) {
				oversized, want = oversized+1, usage{PromptTokens: 7}
			}
			if !r.events.hasUsage || r.events.usage != want || firsts != 1 {
				t.Fatalf("%q endings, %s %v: usage %+v %v, first tokens %d; want usage %+v and one first token",
					nl, name, sizes, r.events.usage, r.events.hasUsage, firsts, want)
			}
			if n := r.OversizedEvents(); n != oversized {
				t.Fatalf("%q endings, %s %v: %d oversized events counted, want %d", nl, name, sizes, n, oversized)
			}
			// Withholding usage withholds the usage chunks read, only.
			wantOut := token + big + trap + "data: [DONE]" + nl + nl
			if want.PromptTokens == 99 {
				wantOut = token + big + "data: [DONE]" + nl + nl
			}
			if out, _, _ := relayBoundedPieces(input, true, bound, sizes); out != wantOut {
				t.Fatalf("%q endings, %s %v, usage withheld: relayed %q, want %q", nl, name, sizes, out, wantOut)
			}
		}
		for cut := 1; cut < len(input); cut++ {
			check("cut at", []int{cut})
			check("cut and an empty piece at", []int{cut, 0})
		}
		for size := 1; size < len(input); size++ {
			sizes := make([]int, len(input)/size)
			for i := range sizes {
				sizes[i] = size
			}
			check("pieces of", sizes)
		}
	}
}

func TestResponseKeepsOtherBodiesAsTheyAreAndReadsTheirUsage(t *testing.T) {
	body := `{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":3,"completion_tokens":4}}`
	r := &Response{status: 200}
	var got []byte
	for _, piece := range []string{body[:10], body[10:]} {
		out := r.Body(nil, []byte(piece), false)
		if !bytes.Equal(out, []byte(piece)) {
			t.Fatalf("piece %q became %q", piece, out)
		}
		got = append(got, out...)
	}
	if u, ok := responseUsage(r.whole.Bytes(), kindCompletion); !ok || u != (usage{PromptTokens: 3, CompletionTokens: 4}) || string(got) != body {
		t.Errorf("usage %+v %v from %q", u, ok, got)
	}
}

// FuzzResponseReadsTheEventsTheBoundAllowsWhateverThePieces feeds a stream
// to a Response bounding events to 24 bytes, in pieces of the sizes given
// (the rest in one last piece), and checks it against the events the whole
// stream splits into at its blank lines: every byte is relayed in order,
// an event is counted oversized exactly when a piece other than the last
// ended within it more than the bound past its start, and the others,
// complete, are read.
func FuzzResponseReadsTheEventsTheBoundAllowsWhateverThePieces(f *testing.F) {
	const bound = 24
	f.Add("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n: "+strings.Repeat("c", 30)+
		"\r\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9}}\r\n\r\ndata: [DONE]\n\n", []byte{34 + 50 + 32, 0, 2, 1})
	f.Add("data: "+strings.Repeat("x", 30)+"\r\n\r\ndata: {}\n\n", []byte{36, 1, 1})
	f.Add("data: "+strings.Repeat("x", 30)+"\n\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n", []byte{36, 1})
	f.Fuzz(func(t *testing.T, input string, pieces []byte) {
		sizes := make([]int, len(pieces))
		for i, n := range pieces {
			sizes[i] = int(n)
		}
		out, r, firsts := relayBoundedPieces(input, false, bound, sizes)
		if out != input {
			t.Fatalf("relayed %q, want %q", out, input)
		}
		// The piece ends other than the last, as offsets into input.
		var cuts []int
		p := 0
		for _, size := range sizes {
			p = min(p+size, len(input))
			cuts = append(cuts, p)
		}
		wantFirsts, oversized := 0, 0
		want := eventReader{firstToken: func() { wantFirsts++ }}
		for start := 0; start < len(input); {
			end := eventEnd([]byte(input[start:]))
			complete := end >= 0
			if complete {
				end += start
			} else {
				end = len(input)
			}
			held := false
			for _, p := range cuts {
				held = held || (p-start > bound && (p < end || !complete && p == end))
			}
			switch {
			case held:
				oversized++
			case complete:
				want.inspect([]byte(input[start:end]))
			}
			start = end
		}
		if n := r.OversizedEvents(); n != oversized {
			t.Errorf("%d oversized events counted, want %d", n, oversized)
		}
		if r.events.usage != want.usage || r.events.hasUsage != want.hasUsage || firsts != wantFirsts {
			t.Errorf("usage %+v %v, first tokens %d; want %+v %v, %d", r.events.usage, r.events.hasUsage, firsts, want.usage, want.hasUsage, wantFirsts)
		}
	})
}
