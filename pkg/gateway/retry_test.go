package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
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

// requestsOnlyEject turns metric scraping off, as for a pod whose engine
// died before a scrape noticed: routing cannot tell it from a live one, and
// only requests eject or readmit it. Ejections last an hour, so that none
// ends during the test.
func requestsOnlyEject(c *Config) {
	c.Cache.PodMetricRefreshInterval = -1
	c.Cache.EjectionBackoff, c.Cache.MaxEjectionBackoff = time.Hour, time.Hour
}

func TestRefusedConnectionIsRetriedOnceOnAnotherPod(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{configure: requestsOnlyEject})
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
	// a is ejected: the next request goes to b at once.
	if n := f.metric(`kvgate_cache_pod_ejections_total{pod="static/a",reason="connection_refused"}`); n != 1 {
		t.Errorf("ejections of a = %v, want 1", n)
	}
	resp, body = post(t, f.url+"/v1/completions", tokenPrompt(tokens), map[string]string{"routing-strategy": "kv-aware"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/b" ||
		f.metric(`kvgate_gateway_retries_total{reason="connection_refused"}`) != 1 {
		t.Errorf("second request: %d from %q, %s; want 200 from b without a retry", resp.StatusCode,
			resp.Header.Get(HeaderTargetPodName), body)
	}
	// The requests ended on b: nothing stays counted on either pod.
	testsupport.EventuallyWhy(t, "the request to be released", func() (string, bool) {
		m := f.match(tokens)
		c := m.Decisions[0].Candidates
		return mustJSON(c), len(c) == 1 && c[0].Running == 0 && c[0].InFlightPrefills == 0
	})
}

func TestPodsAllEjectedAreStillTriedAndTheOneThatAnswersIsReadmitted(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{configure: requestsOnlyEject})
	for _, e := range f.engines {
		e.srv.Close()
	}
	// Each pod is tried once: both are ejected, and the request fails.
	resp, body := post(t, f.url+"/v1/completions", tokenPrompt([]uint32{1, 2, 3}), nil)
	e := decodeError(t, body)
	if resp.StatusCode != http.StatusServiceUnavailable || e.Code != codePodsUnreachable ||
		!strings.Contains(e.Message, "static/a") || !strings.Contains(e.Message, "static/b") {
		t.Errorf("got %d %s; want 503 %s naming both pods", resp.StatusCode, body, codePodsUnreachable)
	}
	if n := f.metric(`kvgate_gateway_retries_total{reason="connection_refused"}`); n != 1 {
		t.Errorf("retries = %v, want exactly 1", n)
	}
	if n := f.metric("kvgate_cache_ejected_pods"); n != 2 {
		t.Errorf("ejected pods = %v, want 2", n)
	}

	// a comes back. Every pod being ejected, requests still try one of
	// them, without a retry; the first one that reaches a readmits it.
	f.engine("a").restart()
	testsupport.EventuallyWhy(t, "a request to reach a", func() (string, bool) {
		resp, body := post(t, f.url+"/v1/completions", tokenPrompt([]uint32{1, 2, 3}), nil)
		return string(body), resp.StatusCode == http.StatusOK
	})
	if n := f.metric(`kvgate_gateway_retries_total{reason="connection_refused"}`); n != 1 {
		t.Errorf("retries = %v; a request among ejected pods must not be retried", n)
	}
	for range 10 {
		resp, body := post(t, f.url+"/v1/completions", tokenPrompt([]uint32{1, 2, 3}), map[string]string{"routing-strategy": "random"})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/a" {
			t.Fatalf("got %d from %q: %s; want 200 from a, b staying ejected", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), body)
		}
	}
	if n := f.metric("kvgate_cache_ejected_pods"); n != 1 {
		t.Errorf("ejected pods = %v, want b alone", n)
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

// TestAHopByHopRequestIDIsReplacedByTheGatewaysOwn: a client's X-Request-Id
// that its Connection header names is hop-by-hop, not forwarded; the engine
// gets the gateway's id in its place, never none.
func TestAHopByHopRequestIDIsReplacedByTheGatewaysOwn(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	post(t, f.url+"/v1/completions", completion("hi", ""), map[string]string{"X-Request-Id": "client-42",
		"Connection": "X-Request-Id"})
	got := f.engine("a").received()
	if ids := got[0].header.Values("X-Request-Id"); len(ids) != 1 || !strings.HasPrefix(ids[0], "kvgate-") {
		t.Errorf("the engine got X-Request-Id %q, want the gateway's kvgate-...", ids)
	}
}

func TestRequestIsRetriedOnEachPodUntilOneAnswers(t *testing.T) {
	f := startFleet(t, []string{"dead1", "dead2", "live"}, fleetOptions{configure: requestsOnlyEject})
	tokens := f.holdPrompt("dead1")
	half := tokens[:len(tokens)/2]
	f.waitMatched(tokens, "dead2", len(f.engine("dead2").storePrompt(half)))
	f.engine("dead1").srv.Close()
	f.engine("dead2").srv.Close()

	// kv-aware tries the pod holding the most of the prompt first: dead1,
	// then dead2, then live.
	resp, body := post(t, f.url+"/v1/completions", tokenPrompt(tokens), map[string]string{"routing-strategy": "kv-aware"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/live" {
		t.Fatalf("got %d from %q: %s; want 200 from live", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), body)
	}
	if n := f.metric(`kvgate_gateway_retries_total{reason="connection_refused"}`); n != 2 {
		t.Errorf("retries = %v, want 2", n)
	}
	if n := f.metric("kvgate_cache_ejected_pods"); n != 2 {
		t.Errorf("ejected pods = %v, want 2", n)
	}
}
