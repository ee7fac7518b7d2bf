package extproc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/routing"
)

// messagesRequest is a POST /v1/messages with one user message, user.
func messagesRequest(user, extra string) request {
	u, _ := json.Marshal(user)
	return request{method: http.MethodPost, path: gateway.PathMessages, headers: map[string]string{routing.HeaderRoutingStrategy: routing.KVAware},
		body: `{"model":"` + simModel + `","max_tokens":8,"system":"Be brief.","messages":[{"role":"user","content":` + string(u) + `}]` + extra + `}`}
}

// messagesEngine answers POST /v1/messages as vLLM does, three tokens
// generated: a whole message, or its events; withUsage false leaves the
// usage out of the stream's message_delta.
func messagesEngine(t *testing.T, withUsage bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream bool `json:"stream"`
		}
		if r.URL.Path != gateway.PathMessages || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprint(w, `{"id":"msg-1","type":"message","role":"assistant","content":[{"type":"text","text":" a b c"}],`+
				`"model":"sim","stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":17,"output_tokens":3}}`)
			return
		}
		usage := `,"usage":{"input_tokens":17,"output_tokens":3}`
		if !withUsage {
			usage = ""
		}
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		for _, ev := range []string{
			`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg-1","type":"message","role":"assistant",` +
				`"content":[],"model":"sim","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}`,
			`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" a b c"}}`,
			`event: content_block_stop` + "\n" + `data: {"type":"content_block_stop","index":0}`,
			`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"}` + usage + `}`,
			`event: message_stop` + "\n" + `data: {"type":"message_stop"}`,
		} {
			_, _ = fmt.Fprint(w, ev+"\n\n")
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// forwardTo sends the request as forwarded to engine rather than to the
// endpoint picked, and relays the response as forward does.
func (x *exchange) forwardTo(engine string, chunk int) {
	x.t.Helper()
	x.destination()
	resp, err := http.Post(engine+x.headers[":path"], "application/json", bytes.NewReader(x.body))
	if err != nil {
		x.t.Fatal(err)
	}
	defer resp.Body.Close()
	x.relayHeaders(resp, nil)
	x.relayBody(resp.Body, chunk, -1)
	x.close()
}

func TestMessagesResponsesAreReadForTheFirstTokenAndUsage(t *testing.T) {
	readsFirstTokenAndUsage(t, messagesRequest, messagesEngine, "event: message_start\n")
}

func TestMessagesWhosePromptCannotBeReproducedArePickedOnLoadAlone(t *testing.T) {
	pickedOnLoadAlone(t, request{method: http.MethodPost, path: gateway.PathMessages, headers: map[string]string{routing.HeaderRoutingStrategy: routing.KVAware},
		body: `{"model":"sim","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":` +
			`{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}]}`})
}

func TestRefusalsOfMessagesRequestsAreImmediateResponsesWithAnthropicErrors(t *testing.T) {
	f := start(t, 2, options{})
	tests := []struct {
		name   string
		r      request
		status int
		typ    string
	}{
		{"unknown model", request{method: http.MethodPost, path: gateway.PathMessages,
			body: `{"model":"nope","max_tokens":8,"messages":[]}`}, http.StatusNotFound, "invalid_request_error"},
		{"token count without a model", request{method: http.MethodPost, path: "/v1/messages/count_tokens",
			body: `{"messages":[]}`}, http.StatusBadRequest, "invalid_request_error"},
		{"not JSON", request{method: http.MethodPost, path: gateway.PathMessages + "?beta=true", body: `{"model":`},
			http.StatusBadRequest, "invalid_request_error"},
		{"empty subset", request{method: http.MethodPost, path: gateway.PathMessages,
			body: `{"model":"` + simModel + `","max_tokens":8,"messages":[]}`, subset: []string{}},
			http.StatusServiceUnavailable, "service_unavailable_error"},
	}
	for _, mode := range modes {
		for _, tt := range tests {
			t.Run(mode.name+"/"+tt.name, func(t *testing.T) {
				x := f.envoy.start(t, mode, tt.r)
				ir := x.immediate
				if ir == nil {
					t.Fatalf("no immediate response; the request went to %s", x.headers[HeaderDestination])
				}
				var outer map[string]json.RawMessage
				var inner map[string]string
				if err := json.Unmarshal(ir.GetBody(), &outer); err != nil || len(outer) != 2 || string(outer["type"]) != `"error"` ||
					json.Unmarshal(outer["error"], &inner) != nil || len(inner) != 2 || inner["message"] == "" {
					t.Fatalf("body %s is not an Anthropic error (%v)", ir.GetBody(), err)
				}
				if int(ir.GetStatus().GetCode()) != tt.status || inner["type"] != tt.typ {
					t.Errorf("%d %s, want %d of type %s", ir.GetStatus().GetCode(), ir.GetBody(), tt.status, tt.typ)
				}
			})
		}
	}
	// A chat completion's refusal keeps OpenAI's shape.
	x := f.envoy.start(t, buffered, request{method: http.MethodPost, path: gateway.PathChatCompletions, body: `{"model":"nope","messages":[]}`})
	if x.immediate == nil {
		t.Fatal("a chat completion of an unknown model was not refused")
	}
	if _, code := errorOf(t, x.immediate.GetBody()); code != "model_not_found" {
		t.Errorf("a chat completion's refusal has code %q, want model_not_found", code)
	}
}
