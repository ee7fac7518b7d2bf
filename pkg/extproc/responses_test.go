package extproc

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
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
	f := start(t, 1, options{})
	withUsage, withoutUsage := responsesEngine(t, true), responsesEngine(t, false)
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
				r := responsesRequest(words(mode.name+c.name, 30), c.extra)
				r.pieces = 2
				x := f.envoy.start(t, mode, r)
				if string(x.body) != r.body {
					t.Fatalf("forwarded body %s; want the client's %s", x.body, r.body)
				}
				x.forwardTo(c.engine, 37)
				if x.status != http.StatusOK || c.stream != strings.HasPrefix(string(x.respBody), "event: response.created\n") ||
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

func TestResponsesWhosePromptCannotBeReproducedArePickedOnLoadAlone(t *testing.T) {
	f := start(t, 1, options{})
	r := request{method: http.MethodPost, path: gateway.PathResponses, headers: map[string]string{routing.HeaderRoutingStrategy: routing.KVAware},
		body: `{"model":"sim","input":[{"type":"message","role":"user","content":[{"type":"input_image",` +
			`"image_url":"data:image/png;base64,iVBORw0KGgo="}]}]}`}
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
