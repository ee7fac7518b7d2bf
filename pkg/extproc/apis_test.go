package extproc

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// readsFirstTokenAndUsage checks, in every mode, that the responses to
// requests of an API the gateway converts into a chat (Messages,
// Responses) are read for their first token and usage: newRequest builds
// a request with one user message, user, plus extra members; newEngine
// answers it as vLLM does, its usage left out when withUsage is false;
// a stream starts with streamStart.
func readsFirstTokenAndUsage(t *testing.T, newRequest func(user, extra string) request,
	newEngine func(t *testing.T, withUsage bool) *httptest.Server, streamStart string) {
	f := start(t, 1, options{})
	withUsage, withoutUsage := newEngine(t, true), newEngine(t, false)
	for _, mode := range modes {
		for _, c := range []struct {
			name, extra, engine string
			stream, usage       bool
		}{
			{"whole", "", withUsage.URL, false, true},
			{"stream", `,"stream":true`, withUsage.URL, true, true},
			{"stream without usage", `,"stream":true`, withoutUsage.URL, true, false},
		} {
			t.Run(mode.name+"/"+c.name, func(t *testing.T) {
				missing := f.metric(t, "kvgate_gateway_responses_without_usage_total", nil)
				ttft := f.metric(t, "kvgate_extproc_time_to_first_token_seconds", nil)
				r := newRequest(words(mode.name+c.name, 30), c.extra)
				r.pieces = 2
				x := f.envoy.start(t, mode, r)
				if string(x.body) != r.body {
					t.Fatalf("forwarded body %s; want the client's %s", x.body, r.body)
				}
				x.forwardTo(c.engine, 37)
				if x.status != http.StatusOK || c.stream != strings.HasPrefix(string(x.respBody), streamStart) ||
					!strings.Contains(string(x.respBody), `" a b c"`) {
					t.Fatalf("relayed %d %q", x.status, x.respBody)
				}
				wantMissing, wantTTFT := missing, ttft
				if !c.usage {
					wantMissing++
				}
				if c.stream {
					wantTTFT++
				}
				if n := f.metric(t, "kvgate_gateway_responses_without_usage_total", nil); n != wantMissing {
					t.Errorf("responses without usage = %v, want %v", n, wantMissing)
				}
				if n := f.metric(t, "kvgate_extproc_time_to_first_token_seconds", nil); n != wantTTFT {
					t.Errorf("first tokens observed: %v, want %v", n, wantTTFT)
				}
			})
		}
	}
}

// pickedOnLoadAlone checks that r, a request whose prompt the gateway
// cannot reproduce, is picked (on the only engine) and counted as an
// unsupported tokenization.
func pickedOnLoadAlone(t *testing.T, r request) {
	f := start(t, 1, options{})
	x := f.envoy.start(t, buffered, r)
	if x.destination() != f.engines[0].address {
		t.Errorf("picked %s, want the only engine", x.destination())
	}
	x.close()
	labels := map[string]string{"reason": "unsupported"}
	if n := f.metric(t, "kvgate_gateway_tokenization_failures_total", labels); n != 1 {
		t.Errorf("unsupported tokenizations = %v, want 1", n)
	}
}
