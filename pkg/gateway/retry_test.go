package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// tokenPrompt is a completion body whose prompt is token ids, which need
// no /tokenize call.
func tokenPrompt(tokens []uint32) string {
	b, _ := json.Marshal(tokens)
	return `{"model":"llama","prompt":` + string(b) + `}`
}

// holdPrompt makes engine name hold sharedPrompt's blocks and waits for
// the gateway to know it; requests for the prompt then go to that engine.
func (f *testFleet) holdPrompt(name string) []uint32 {
	f.t.Helper()
	tokens := toyTokens(sharedPrompt)
	f.waitMatched(tokens, name, len(f.engine(name).storePrompt(tokens)))
	return tokens
}

func TestRefusedConnectionIsRetriedOnceOnAnotherPod(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	tokens := f.holdPrompt("a")
	// a's HTTP server goes away while its KV events still say it holds
	// the prompt, so a is chosen and refuses the connection.
	f.engine("a").srv.Close()

	resp, body := post(t, f.url+"/v1/completions", tokenPrompt(tokens), map[string]string{"routing-strategy": "kv-aware"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/b" {
		t.Fatalf("got %d from %q: %s; want 200 from b", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), body)
	}
	if n := len(f.engine("b").received()); n != 1 {
		t.Errorf("b received %d requests, want 1", n)
	}
	if n := f.metric(`kvgate_gateway_retries_total{reason="connection_refused"}`); n != 1 {
		t.Errorf("retries = %v, want 1", n)
	}
	if n := f.metric(`kvgate_gateway_upstream_failures_total{reason="connection_refused"}`); n != 1 {
		t.Errorf("refused connections = %v, want 1", n)
	}
	// The request ended on b: nothing stays counted on either pod.
	eventually(t, "the request to be released", func() (string, bool) {
		m := f.match(tokens)
		c := m.Decisions[0].Candidates
		return mustJSON(c), c[0].Running == 0 && c[1].Running == 0 && c[0].InFlightPrefills == 0 && c[1].InFlightPrefills == 0
	})
}

func TestUnreachablePodsAre503AfterOneRetry(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	for _, e := range f.engines {
		e.srv.Close()
	}
	resp, body := post(t, f.url+"/v1/completions", tokenPrompt([]uint32{1, 2, 3}), nil)
	e := decodeError(t, body)
	if resp.StatusCode != http.StatusServiceUnavailable || e.Code != codePodsUnreachable ||
		!strings.Contains(e.Message, "static/a") || !strings.Contains(e.Message, "static/b") {
		t.Errorf("got %d %s; want 503 %s naming both pods", resp.StatusCode, body, codePodsUnreachable)
	}
	if n := f.metric(`kvgate_gateway_retries_total{reason="connection_refused"}`); n != 1 {
		t.Errorf("retries = %v, want exactly 1", n)
	}
}

func TestPodFailingAfterTheRequestWasSentIs502WithoutRetry(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	tokens := f.holdPrompt("a")
	f.engine("a").setAnswer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	resp, body := post(t, f.url+"/v1/completions", tokenPrompt(tokens), map[string]string{"routing-strategy": "kv-aware"})
	if e := decodeError(t, body); resp.StatusCode != http.StatusBadGateway || e.Code != codeUpstreamFailed {
		t.Errorf("got %d %s; want 502 %s", resp.StatusCode, body, codeUpstreamFailed)
	}
	if n := len(f.engine("b").received()); n != 0 {
		t.Errorf("b received %d requests; a request that may have reached a pod must not be sent again", n)
	}
	if n := f.metric(`kvgate_gateway_upstream_failures_total{reason="send"}`); n != 1 {
		t.Errorf("send failures = %v, want 1", n)
	}
}

func TestForwardedRequestsKeepEndToEndHeadersAndCarryARequestID(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	headers := map[string]string{"Authorization": "Bearer sk-1", "Connection": "X-Hop", "X-Hop": "1",
		"Accept-Encoding": "gzip", "OpenAI-Organization": "org"}
	post(t, f.url+"/v1/completions", completion("hi", ""), headers)
	headers["X-Request-Id"] = "client-42"
	post(t, f.url+"/v1/completions", completion("hi", ""), headers)
	got := f.engine("a").received()
	for i, want := range []string{"kvgate-", "client-42"} {
		h := got[i].header
		if h.Get("Authorization") != "Bearer sk-1" || h.Get("Openai-Organization") != "org" ||
			h.Get("X-Hop") != "" || h.Get("Accept-Encoding") != "" || !strings.HasPrefix(h.Get("X-Request-Id"), want) {
			t.Errorf("request %d reached the engine with headers %v; want end-to-end headers, no hop-by-hop ones, "+
				"no Accept-Encoding, X-Request-Id %s...", i, h, want)
		}
	}
}
