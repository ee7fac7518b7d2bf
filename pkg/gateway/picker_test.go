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
	firsts := 0
	r := &Response{status: 200, sse: true, maxEvent: DefaultMaxStreamEventBytes,
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
