package extproc

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"

	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/routing"
)

// responsesRequest is a POST /v1/responses with instructions and the
// input user.
func responsesRequest(user, extra string) request {
	u, _ := json.Marshal(user)
	return request{method: http.MethodPost, path: gateway.PathResponses, headers: map[string]string{routing.HeaderRoutingStrategy: routing.KVAware},
		body: `{"model":"` + simModel + `","max_output_tokens":8,"store":false,"instructions":"Be brief.","input":` + string(u) + extra + `}`}
}

// responsesEngine answers POST /v1/responses as vLLM does, three tokens
// generated: a whole response, or its events (response.created and
// response.in_progress, the output, then response.completed carrying the
// usage); withUsage false leaves the usage null.
func responsesEngine(t *testing.T, withUsage bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream bool `json:"stream"`
		}
		if r.URL.Path != gateway.PathResponses || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		usage := `{"input_tokens":17,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,` +
			`"output_tokens_details":{"reasoning_tokens":0},"total_tokens":20}`
		if !withUsage {
			usage = "null"
		}
		response := func(status, output, usage string) string {
			return `{"id":"resp_1","created_at":1,"model":"sim","object":"response","output":` + output +
				`,"status":"` + status + `","usage":` + usage + `}`
		}
		output := `[{"id":"msg_1","content":[{"annotations":[],"text":" a b c","type":"output_text"}],"role":"assistant",` +
			`"status":"completed","type":"message"}]`
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprint(w, response("completed", output, usage))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		for i, ev := range [][2]string{
			{"response.created", `"response":` + response("in_progress", "[]", "null")},
			{"response.in_progress", `"response":` + response("in_progress", "[]", "null")},
			{"response.output_item.added", `"output_index":0,"item":{"id":"msg_1","content":[],"role":"assistant","status":"in_progress","type":"message"}`},
			{"response.content_part.added", `"output_index":0,"item_id":"msg_1","content_index":0,"part":{"annotations":[],"text":"","type":"output_text"}`},
			{"response.output_text.delta", `"output_index":0,"item_id":"msg_1","content_index":0,"delta":" a b c","logprobs":[]}`},
			{"response.output_text.done", `"output_index":0,"item_id":"msg_1","content_index":0,"text":" a b c","logprobs":[]`},
			{"response.completed", `"response":` + response("completed", output, usage)},
		} {
			_, _ = fmt.Fprintf(w, "event: %s\ndata: {\"type\":%q,%s,\"sequence_number\":%d}\n\n", ev[0], ev[0], ev[1], i)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestResponsesAPIResponsesAreReadForTheFirstTokenAndUsage(t *testing.T) {
	readsFirstTokenAndUsage(t, responsesRequest, responsesEngine, "event: response.created\n")
}

func TestResponsesWhosePromptCannotBeReproducedArePickedOnLoadAlone(t *testing.T) {
	pickedOnLoadAlone(t, request{method: http.MethodPost, path: gateway.PathResponses, headers: map[string]string{routing.HeaderRoutingStrategy: routing.KVAware},
		body: `{"model":"sim","input":[{"type":"message","role":"user","content":[{"type":"input_image",` +
			`"image_url":"data:image/png;base64,iVBORw0KGgo="}]}]}`})
}

func TestRefusalsOfResponsesRequestsAreImmediateResponsesWithOpenAIErrors(t *testing.T) {
	f := start(t, 2, options{})
	for _, tt := range []struct {
		name   string
		r      request
		status int
		code   string
	}{
		{"unknown model", request{method: http.MethodPost, path: gateway.PathResponses, body: `{"model":"nope","input":"hi"}`},
			http.StatusNotFound, "model_not_found"},
		{"no model", request{method: http.MethodPost, path: gateway.PathResponses, body: `{"input":"hi"}`},
			http.StatusBadRequest, "missing_field"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			x := f.envoy.start(t, buffered, tt.r)
			if x.immediate == nil {
				t.Fatalf("no immediate response; the request went to %s", x.headers[HeaderDestination])
			}
			if _, code := errorOf(t, x.immediate.GetBody()); int(x.immediate.GetStatus().GetCode()) != tt.status || code != tt.code {
				t.Errorf("%d %s, want %d with code %s", x.immediate.GetStatus().GetCode(), x.immediate.GetBody(), tt.status, tt.code)
			}
		})
	}
}

// TestRequestsForAStoredResponseArePickedOnTheEngineThatMadeIt makes
// responses through Envoy on one of three engines, whole and streamed, in
// each mode: every follow-up naming one as its previous_response_id, by
// random choice, and every GET /v1/responses/{id} and cancel is picked on
// the engine that made it, which alone holds it; a GET with another
// method is refused, and one for a response the gateway never relayed is
// answered 404 by kvgate itself.
func TestRequestsForAStoredResponseArePickedOnTheEngineThatMadeIt(t *testing.T) {
	f := start(t, 3, options{})
	random := map[string]string{routing.HeaderRoutingStrategy: routing.Random}
	idOf := regexp.MustCompile(`"id":"(resp_[0-9a-f]+)"`)
	for _, mode := range modes {
		for _, stream := range []bool{false, true} {
			first := request{method: http.MethodPost, path: gateway.PathResponses, headers: random,
				body: fmt.Sprintf(`{"model":%q,"max_output_tokens":4,"input":"hello","stream":%v}`, simModel, stream)}
			x := f.envoy.start(t, mode, first)
			owner := x.destination()
			x.forward(64)
			m := idOf.FindSubmatch(x.respBody)
			if x.status != http.StatusOK || m == nil {
				t.Fatalf("%s: %d %s", mode.name, x.status, x.respBody)
			}
			id := string(m[1])
			for i := range 9 {
				r := request{method: http.MethodPost, path: gateway.PathResponses, headers: random,
					body: fmt.Sprintf(`{"model":%q,"input":"more","previous_response_id":%q}`, simModel, id)}
				switch i % 3 {
				case 1:
					r = request{method: http.MethodGet, path: gateway.PathResponses + "/" + id, headers: random}
				case 2:
					r = request{method: http.MethodPost, path: gateway.PathResponses + "/" + id + "/cancel", headers: random}
				}
				if got := f.envoy.start(t, mode, r).destination(); got != owner {
					t.Fatalf("%s %s (%s, stream %v) picked %s; only %s, which made the response, holds it",
						r.method, r.path, mode.name, stream, got, owner)
				}
			}
		}
	}
	// The usage of each response was read with its id.
	if n := f.metric(t, "kvgate_gateway_responses_without_usage_total", nil); n != 0 {
		t.Errorf("%v responses without usage, want none", n)
	}
	for _, tt := range []struct {
		r      request
		status int
		code   string
	}{
		{request{method: http.MethodGet, path: gateway.PathResponses + "/resp_unknown"}, http.StatusNotFound, "not_found"},
		{request{method: http.MethodDelete, path: gateway.PathResponses + "/resp_unknown"}, http.StatusMethodNotAllowed, "method_not_allowed"},
	} {
		x := f.envoy.start(t, buffered, tt.r)
		if x.immediate == nil {
			t.Fatalf("%s %s went to %s", tt.r.method, tt.r.path, x.headers[HeaderDestination])
		}
		if _, code := errorOf(t, x.immediate.GetBody()); int(x.immediate.GetStatus().GetCode()) != tt.status || code != tt.code {
			t.Errorf("%s %s: %d %s, want %d with code %s", tt.r.method, tt.r.path, x.immediate.GetStatus().GetCode(),
				x.immediate.GetBody(), tt.status, tt.code)
		}
	}
}
