package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/routing"
)

// storedResponse is what the tests read of a Responses API response.
type storedResponse struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Usage  *struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

// readStoredResponse reads body, a whole Responses API response or a
// stream, whose response.completed event carries the response.
func readStoredResponse(t *testing.T, body []byte) storedResponse {
	t.Helper()
	data := responseObject(t, body)
	var r storedResponse
	if err := json.Unmarshal([]byte(data), &r); err != nil || r.ID == "" {
		t.Fatalf("no response in %s: %v", body, err)
	}
	return r
}

// TestAConversationContinuedByIDStaysOnTheEngineThatStoredIt runs a
// conversation through the Responses API as OpenAI's SDKs do with the
// store (each turn naming the last response as its previous_response_id)
// against three simulated vLLM engines with VLLM_ENABLE_RESPONSES_API_STORE,
// each turn routed by random choice: every turn reaches the engine that
// stored the conversation, which continues it from its prefix cache, and
// so do the reads of the stored response and of a background one.
func TestAConversationContinuedByIDStaysOnTheEngineThatStoredIt(t *testing.T) {
	engines := []*simEngine{startSimEngine(t, "a", true), startSimEngine(t, "b", true), startSimEngine(t, "c", true)}
	f := startLivenessFleet(t, engines...)
	random := map[string]string{routing.HeaderRoutingStrategy: routing.Random}
	resp, body := post(t, f.url+PathResponses, `{"model":"llama","max_output_tokens":8,"instructions":"You are a coding agent.",`+
		`"input":`+jsonString(simPrompt(5, 80))+`}`, random)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("turn 1: %d %s", resp.StatusCode, body)
	}
	owner, last := resp.Header.Get(HeaderTargetPodName), readStoredResponse(t, body)
	for turn := 2; turn <= 7; turn++ {
		stream := turn%2 == 0
		resp, body = post(t, f.url+PathResponses, fmt.Sprintf(`{"model":"llama","max_output_tokens":8,"stream":%v,`+
			`"previous_response_id":%q,"input":%s}`, stream, last.ID, jsonString(simPrompt(turn, 10))), random)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != owner {
			t.Fatalf("turn %d: %d from %q, want 200 from %s, which stored the conversation: %s", turn, resp.StatusCode,
				resp.Header.Get(HeaderTargetPodName), owner, body)
		}
		next := readStoredResponse(t, body)
		if next.Usage == nil || next.Usage.InputTokens <= last.Usage.InputTokens ||
			next.Usage.InputTokensDetails.CachedTokens < last.Usage.InputTokens-2*testBlockSize {
			t.Errorf("turn %d: usage %+v after %+v; want a longer prompt whose earlier turns the engine found cached", turn,
				next.Usage, last.Usage)
		}
		last = next
	}

	get := func(method, path string) (*http.Response, []byte) {
		t.Helper()
		return send(t, method, f.url+path, random)
	}
	for range 6 {
		resp, body := get(http.MethodGet, PathResponses+"/"+last.ID)
		if got := readStoredResponse(t, body); resp.StatusCode != http.StatusOK || got.ID != last.ID ||
			resp.Header.Get(HeaderTargetPodName) != owner {
			t.Fatalf("GET %s: %d from %q: %s", last.ID, resp.StatusCode, resp.Header.Get(HeaderTargetPodName), body)
		}
	}
	resp, body = get(http.MethodPost, PathResponses+"/"+last.ID+"/cancel")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Cannot cancel a synchronous response.") {
		t.Errorf("cancelling a completed response: %d %s; want the engine's 400", resp.StatusCode, body)
	}

	// A background response, queued at once, read until it ended.
	resp, body = post(t, f.url+PathResponses, `{"model":"llama","max_output_tokens":8,"background":true,"input":"hi"}`, random)
	queued := readStoredResponse(t, body)
	if resp.StatusCode != http.StatusOK || queued.Status != "queued" {
		t.Fatalf("background: %d %s", resp.StatusCode, body)
	}
	maker := resp.Header.Get(HeaderTargetPodName)
	testsupport.EventuallyWhy(t, "the background response to end", func() (string, bool) {
		resp, body := get(http.MethodGet, PathResponses+"/"+queued.ID)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != maker {
			t.Fatalf("GET %s: %d from %q, want 200 from %s: %s", queued.ID, resp.StatusCode, resp.Header.Get(HeaderTargetPodName),
				maker, body)
		}
		status := readStoredResponse(t, body).Status
		return string(body), status != "queued" && status != "in_progress"
	})
	owned := `kvgate_gateway_stored_response_requests_total{endpoint="/v1/responses/{id}",result="owner"}`
	if got := f.metric(owned); got < 7 {
		t.Errorf("%s = %v, want at least 7", owned, got)
	}

	// The engine holding the conversation goes away: the follow-ups are
	// sent to no other engine, and the client learns which engine it was
	// (once a connection to it is refused, that it holds the response).
	for _, e := range engines {
		if "static/"+e.name == owner {
			e.cut()
		}
	}
	for i := 0; ; i++ {
		resp, body = post(t, f.url+PathResponses, fmt.Sprintf(`{"model":"llama","max_output_tokens":8,"previous_response_id":%q,`+
			`"input":"and now?"}`, last.ID), random)
		if resp.StatusCode/100 != 5 || !strings.Contains(string(body), owner) {
			t.Fatalf("a follow-up whose engine is unreachable: %d %s; want a 5xx naming %s", resp.StatusCode, body, owner)
		}
		if resp.StatusCode == http.StatusServiceUnavailable {
			if !strings.Contains(string(body), "holds the stored response") {
				t.Errorf("503 %s; want it to say the pod holds the stored response", body)
			}
			break
		}
		if i == 3 {
			t.Fatalf("still %d %s after %d follow-ups; want the pod refused and ejected", resp.StatusCode, body, i+1)
		}
	}
}
