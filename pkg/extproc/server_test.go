package extproc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/routing"
)

// words returns a prompt of n words starting with tag: many blocks of the
// simulator's tokenizer, unique to tag.
func words(tag string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", tag, i)
	}
	return strings.Join(w, " ")
}

func TestARepeatedPrefixGoesToThePodHoldingIt(t *testing.T) {
	f := start(t, 3, options{})
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			prompt := words(strings.ReplaceAll(mode.name, "-", ""), 120)
			r := completionRequest(prompt, "")
			r.pieces = 3
			x := f.envoy.start(t, mode, r)
			first := x.destination()
			x.forward(256)
			if x.status != http.StatusOK || !strings.Contains(string(x.respBody), `"choices"`) {
				t.Fatalf("first request through %s: %d %s", first, x.status, x.respBody)
			}
			testsupport.EventuallyWhy(t, "the index to credit the pod that served the prompt with its blocks", func() (string, bool) {
				n := f.matchedBlocks(t, prompt, first)
				return fmt.Sprintf("%d blocks", n), n > 0
			})
			for _, alg := range []string{"", routing.PrefixCache} {
				r := completionRequest(prompt, "")
				r.pieces = 2
				if alg != "" {
					r.headers = map[string]string{routing.HeaderRoutingStrategy: alg}
				}
				x := f.envoy.start(t, mode, r)
				if got := x.destination(); got != first {
					t.Fatalf("algorithm %q sent the repeated prompt to %s; %s holds it", alg, got, first)
				}
				x.forward(256)
				if x.status != http.StatusOK {
					t.Fatalf("repeated request: %d %s", x.status, x.respBody)
				}
			}
		})
	}
	if n := f.metric(t, "kvgate_routing_decisions_total", map[string]string{"outcome": "prefix_hit"}); n != 2*float64(len(modes)) {
		t.Errorf("prefix hits = %v, want %d", n, 2*len(modes))
	}
	if n := f.metric(t, "kvgate_cache_tracked_requests", nil); n != 0 {
		t.Errorf("%v requests still tracked after every stream ended", n)
	}
	if n := f.metric(t, "kvgate_extproc_requests_total", map[string]string{"code": "200", "model": simModel}); n != 3*float64(len(modes)) {
		t.Errorf("requests counted with 200: %v, want %d", n, 3*len(modes))
	}
}

func TestTheEndpointAnswerFollowsTheProtocol(t *testing.T) {
	f := start(t, 2, options{})
	for _, mode := range append(modes, envoyMode{name: "unannounced", req: buffered.req, resp: buffered.resp, unannounced: true}) {
		t.Run(mode.name, func(t *testing.T) {
			r := completionRequest("hello there", "")
			// A client may not choose the pod.
			r.headers = map[string]string{HeaderDestination: "10.9.9.9:80", gateway.HeaderTargetPod: "10.9.9.9:80"}
			x := f.envoy.start(t, mode, r)
			dest := x.destination()
			if f.engine(dest) == nil {
				t.Fatalf("picked %s, which is no engine", dest)
			}
			if x.headers[routing.HeaderRoutingStrategy] != routing.KVAware || !x.cleared {
				t.Errorf("routing-strategy %q, route cache cleared %v; want kv-aware and cleared, as AIBrix's routes need",
					x.headers[routing.HeaderRoutingStrategy], x.cleared)
			}
			if string(x.body) != r.body {
				t.Errorf("forwarded body %q, want the client's %q", x.body, r.body)
			}
			x.forward(64)
			e := f.engine(dest)
			if x.respHeaders[gateway.HeaderTargetPod] != dest || x.respHeaders[gateway.HeaderTargetPodName] != "static/"+e.name ||
				x.respHeaders[routing.HeaderRoutingStrategy] != routing.KVAware {
				t.Errorf("response headers %v: want target-pod %s, target-pod-name static/%s and routing-strategy", x.respHeaders, dest, e.name)
			}
		})
	}
}

func TestAStreamedResponseIsRelayedEventByEventWithoutTheUsageKvgateAskedFor(t *testing.T) {
	f := start(t, 1, options{})
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			before := f.metric(t, "kvgate_gateway_responses_without_usage_total", nil)
			ttft := f.metric(t, "kvgate_extproc_time_to_first_token_seconds", nil)
			r := completionRequest(words("stream", 30), `,"stream":true`)
			r.pieces = 2
			x := f.envoy.start(t, mode, r)
			if !bytes.Contains(x.body, []byte(`"stream_options":{"include_usage":true}`)) {
				t.Fatalf("forwarded body %s does not ask for the usage chunk", x.body)
			}
			if cl, ok := x.headers["content-length"]; ok && cl != fmt.Sprint(len(x.body)) {
				t.Errorf("content-length %s for a body of %d bytes", cl, len(x.body))
			}
			x.forward(37) // pieces that cut events apart
			out := string(x.respBody)
			if x.status != http.StatusOK || !strings.HasSuffix(out, "data: [DONE]\n\n") || strings.Count(out, `"text"`) < 4 {
				t.Fatalf("relayed %d %q", x.status, out)
			}
			if strings.Contains(out, `"usage"`) {
				t.Errorf("the client received the usage chunk it did not ask for: %q", out)
			}
			for _, ev := range strings.SplitAfter(out, "\n\n") {
				if ev != "" && !strings.HasPrefix(ev, "data: ") {
					t.Errorf("relayed a broken event %q", ev)
				}
			}
			if after := f.metric(t, "kvgate_gateway_responses_without_usage_total", nil); after != before {
				t.Errorf("the attempt closed without the usage the engine reported")
			}
			if n := f.metric(t, "kvgate_extproc_time_to_first_token_seconds", nil); n != ttft+1 {
				t.Errorf("first tokens observed: %v, want %v", n, ttft+1)
			}
		})
	}
	// A client that asked for usage receives it.
	x := f.envoy.start(t, duplex, completionRequest("usage please", `,"stream":true,"stream_options":{"include_usage":true}`))
	x.forward(64)
	if !strings.Contains(string(x.respBody), `"usage"`) {
		t.Errorf("the client that asked for usage did not receive it: %s", x.respBody)
	}
}

func TestEventsBeyondTheBoundArePassedOnUnreadAndCounted(t *testing.T) {
	f := start(t, 1, options{env: map[string]string{"KVGATE_MAX_STREAM_EVENT_BYTES": "16"}})
	ttft := f.metric(t, "kvgate_extproc_time_to_first_token_seconds", nil)
	x := f.envoy.start(t, duplex, completionRequest("oversized events", `,"stream":true,"stream_options":{"include_usage":true}`))
	x.forward(8) // every event but [DONE] outgrows 16 bytes before it ends
	out := string(x.respBody)
	if x.status != http.StatusOK || !strings.HasSuffix(out, "data: [DONE]\n\n") || !strings.Contains(out, `"usage"`) {
		t.Fatalf("relayed %d %q", x.status, out)
	}
	events := strings.Count(out, "\n\n")
	if n := f.metric(t, "kvgate_extproc_oversized_events_total", nil); n != float64(events-1) {
		t.Errorf("oversized events counted %v, want %d (every event of %q but the last)", n, events-1, out)
	}
	if n := f.metric(t, "kvgate_extproc_time_to_first_token_seconds", nil); n != ttft {
		t.Errorf("a first token was read from events beyond the bound")
	}
}

func TestRefusalsAreImmediateResponsesWithOpenAIErrors(t *testing.T) {
	f := start(t, 2, options{})
	tests := []struct {
		name   string
		r      request
		status int
		code   string
	}{
		{"unknown model", request{method: http.MethodPost, path: gateway.PathCompletions, body: `{"model":"nope","prompt":"x"}`},
			http.StatusNotFound, "model_not_found"},
		{"not JSON", request{method: http.MethodPost, path: gateway.PathChatCompletions, body: `{"model":`},
			http.StatusBadRequest, "invalid_json"},
		{"unknown strategy", request{method: http.MethodPost, path: gateway.PathCompletions, body: `{"model":"sim","prompt":"x"}`,
			headers: map[string]string{routing.HeaderRoutingStrategy: "fastest"}}, http.StatusBadRequest, "unknown_routing_strategy"},
		{"no body", request{method: http.MethodPost, path: gateway.PathCompletions}, http.StatusBadRequest, "invalid_json"},
		{"empty subset", request{method: http.MethodPost, path: gateway.PathCompletions, body: `{"model":"sim","prompt":"x"}`,
			subset: []string{}}, http.StatusServiceUnavailable, "no_ready_pod"},
		{"subset of strangers", request{method: http.MethodPost, path: gateway.PathCompletions, body: `{"model":"sim","prompt":"x"}`,
			subset: []string{"10.1.1.1:8000"}}, http.StatusServiceUnavailable, "no_ready_pod"},
		{"other path without a model", request{method: http.MethodPost, path: "/v1/embeddings", body: `{"input":"x"}`},
			http.StatusBadRequest, "missing_field"},
	}
	for _, mode := range modes {
		for _, tt := range tests {
			t.Run(mode.name+"/"+tt.name, func(t *testing.T) {
				x := f.envoy.start(t, mode, tt.r)
				ir := x.immediate
				if ir == nil {
					t.Fatalf("no immediate response; the request went to %s", x.headers[HeaderDestination])
				}
				if int(ir.GetStatus().GetCode()) != tt.status {
					t.Errorf("status %d, want %d", ir.GetStatus().GetCode(), tt.status)
				}
				if _, code := errorOf(t, ir.GetBody()); code != tt.code {
					t.Errorf("error code %q, want %q", code, tt.code)
				}
				ct := ""
				for _, h := range ir.GetHeaders().GetSetHeaders() {
					if h.GetHeader().GetKey() == "content-type" {
						ct = string(h.GetHeader().GetRawValue())
					}
				}
				if ct != "application/json" || ir.GetDetails() != "kvgate_"+tt.code {
					t.Errorf("content-type %q, details %q", ct, ir.GetDetails())
				}
			})
		}
	}
	if n := f.metric(t, "kvgate_cache_tracked_requests", nil); n != 0 {
		t.Errorf("%v refused requests are tracked", n)
	}
}

func TestASubsetRestrictsTheCandidates(t *testing.T) {
	f := start(t, 3, options{})
	only := f.engines[1].address
	for range 4 {
		r := completionRequest("pick from the subset", "")
		r.subset = []string{"10.1.1.1:8000", only}
		x := f.envoy.start(t, duplex, r)
		if got := x.destination(); got != only {
			t.Fatalf("picked %s, outside the subset [%s]", got, only)
		}
		x.forward(128)
	}
}

func TestOtherEndpointsAreRoutedByTheirModelAndModelsAreListed(t *testing.T) {
	f := start(t, 2, options{})
	x := f.envoy.start(t, buffered, request{method: http.MethodGet, path: gateway.PathModels})
	if x.immediate == nil || x.immediate.GetStatus().GetCode() != http.StatusOK ||
		!strings.Contains(string(x.immediate.GetBody()), `"id":"sim"`) {
		t.Fatalf("GET /v1/models: %v", x.immediate)
	}
	x = f.envoy.start(t, buffered, request{method: http.MethodPost, path: "/tokenize", body: `{"model":"sim","prompt":"count me"}`})
	x.forward(512)
	if x.status != http.StatusOK || !strings.Contains(string(x.respBody), `"tokens"`) {
		t.Fatalf("POST /tokenize through kvgate: %d %s", x.status, x.respBody)
	}
}

func TestFailOpenContinuesWithoutAnEndpoint(t *testing.T) {
	f := start(t, 1, options{failOpen: true})
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			r := completionRequest("no pod for me", "")
			r.subset = []string{}
			r.headers = map[string]string{HeaderDestination: "10.9.9.9:80"}
			x := f.envoy.start(t, mode, r)
			if x.immediate != nil {
				t.Fatalf("answered %d itself; want the request continued", x.immediate.GetStatus().GetCode())
			}
			if _, ok := x.headers[HeaderDestination]; ok || x.metadata != nil || string(x.body) != r.body {
				t.Errorf("continued with endpoint header %q, metadata %v, body %q; want none, none and the client's",
					x.headers[HeaderDestination], x.metadata, x.body)
			}
		})
	}
	if n := f.metric(t, "kvgate_extproc_fail_open_total", map[string]string{"code": "503"}); n != float64(len(modes)) {
		t.Errorf("fail-open count %v, want %d", n, len(modes))
	}
	// Client errors are answered all the same.
	x := f.envoy.start(t, buffered, request{method: http.MethodPost, path: gateway.PathCompletions, body: `{"model":"nope"}`})
	if x.immediate == nil || x.immediate.GetStatus().GetCode() != http.StatusNotFound {
		t.Fatalf("unknown model with fail-open: %v", x.immediate)
	}
}

func TestAGatewayNotReadyRefusesAndSaysSoInItsHealth(t *testing.T) {
	f := start(t, 0, options{notReady: true})
	x := f.envoy.start(t, buffered, completionRequest("too early", ""))
	if x.immediate == nil || x.immediate.GetStatus().GetCode() != http.StatusServiceUnavailable {
		t.Fatalf("before the pods are known: %v", x.immediate)
	}
	if _, code := errorOf(t, x.immediate.GetBody()); code != "gateway_not_ready" {
		t.Errorf("code %q, want gateway_not_ready", code)
	}
	h := healthpb.NewHealthClient(f.envoy.conn)
	for service, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
		HealthLiveness: healthpb.HealthCheckResponse_SERVING, HealthReadiness: healthpb.HealthCheckResponse_NOT_SERVING,
		extprocv3.ExternalProcessor_ServiceDesc.ServiceName: healthpb.HealthCheckResponse_NOT_SERVING,
	} {
		resp, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil || resp.GetStatus() != want {
			t.Errorf("health of %q: %v %v, want %v", service, resp.GetStatus(), err, want)
		}
	}
}

func TestHealthIsServingOnceReady(t *testing.T) {
	f := start(t, 1, options{plaintext: true})
	h := healthpb.NewHealthClient(f.envoy.conn)
	testsupport.Eventually(t, "readiness to be SERVING", func() bool {
		resp, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{Service: HealthReadiness})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	x := f.envoy.start(t, buffered, completionRequest("plaintext gRPC", ""))
	x.forward(128)
	if x.status != http.StatusOK {
		t.Fatalf("over plaintext: %d %s", x.status, x.respBody)
	}
}

func TestModesThatCannotPickAreRefusedNamingTheSetting(t *testing.T) {
	f := start(t, 1, options{})
	for _, mode := range []envoyMode{
		{name: "none", req: 0, resp: buffered.resp},
		{name: "streamed waiting", req: streamed.req, resp: streamed.resp},
	} {
		t.Run(mode.name, func(t *testing.T) {
			x := f.envoy.start(t, mode, completionRequest("x", ""))
			if x.immediate == nil || x.immediate.GetStatus().GetCode() != http.StatusInternalServerError {
				t.Fatalf("want 500, got %v", x.immediate)
			}
			if _, code := errorOf(t, x.immediate.GetBody()); code != "extproc_misconfigured" {
				t.Errorf("code %q", code)
			}
		})
	}
	if n := f.metric(t, "kvgate_extproc_stream_errors_total", map[string]string{"reason": errMisconfigure}); n != 2 {
		t.Errorf("misconfigured streams %v, want 2", n)
	}
}

// Trailers end a request body: the full-duplex mode streams it back with
// the trailers after it; the buffered mode sends the whole body, without
// end_of_stream, once the trailers have come.
func TestTrailersEndARequestBody(t *testing.T) {
	f := start(t, 1, options{})
	for _, tc := range []struct {
		mode   envoyMode
		pieces int
	}{{duplex, 2}, {buffered, 0}} {
		t.Run(tc.mode.name, func(t *testing.T) {
			r := completionRequest("ended by trailers in "+tc.mode.name, "")
			r.pieces, r.trailers = tc.pieces, true
			x := f.envoy.start(t, tc.mode, r)
			x.destination()
			if string(x.body) != r.body {
				t.Fatalf("body forwarded %q, want %q", x.body, r.body)
			}
			x.forward(128)
			if x.status != http.StatusOK {
				t.Fatalf("%d %s", x.status, x.respBody)
			}
		})
	}
}

// A response whose upstream sends trailers ends without end_of_stream on
// its last body piece. The BUFFERED response mode sends the whole body in
// that one piece; the trailers follow with response_trailer_mode SEND, and
// never come with SKIP.
func TestAResponseThatTrailersEndIsRelayedWholeAndDone(t *testing.T) {
	f := start(t, 1, options{})
	bufferedResponse := envoyMode{name: "buffered response", req: filterv3.ProcessingMode_BUFFERED,
		resp: filterv3.ProcessingMode_BUFFERED}
	// The last event lacks the blank line that would end it.
	sent := "data: {\"choices\":[{\"text\":\"a\"}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\ndata: [DONE]"
	for _, tc := range []struct {
		name     string
		mode     envoyMode
		trailers bool
	}{
		{"full-duplex", duplex, true},
		{"buffered, trailers sent", bufferedResponse, true},
		{"buffered, trailers skipped", bufferedResponse, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := f.metric(t, "kvgate_extproc_requests_total", map[string]string{"code": "200"})
			early := f.metric(t, "kvgate_extproc_requests_total", map[string]string{"code": "499"})
			noUsage := f.metric(t, "kvgate_gateway_responses_without_usage_total", nil)
			x := f.envoy.start(t, tc.mode, completionRequest("ended by trailers "+tc.name,
				`,"stream":true,"stream_options":{"include_usage":true}`))
			x.destination()
			x.relayHeaders(&http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}}}, nil)
			x.sendResponsePiece([]byte(sent), false)
			if tc.trailers {
				x.sendResponseTrailers()
			}
			x.close()
			if string(x.respBody) != sent {
				t.Errorf("client received %q, upstream sent %q", x.respBody, sent)
			}
			if n := f.metric(t, "kvgate_extproc_requests_total", map[string]string{"code": "200"}); n != done+1 {
				t.Errorf("requests done %v, want %v", n, done+1)
			}
			if n := f.metric(t, "kvgate_extproc_requests_total", map[string]string{"code": "499"}); n != early {
				t.Errorf("the complete response counted as ended early")
			}
			if n := f.metric(t, "kvgate_gateway_responses_without_usage_total", nil); n != noUsage {
				t.Errorf("the attempt closed without the usage the engine reported")
			}
		})
	}
}

func TestABodyBeyondTheLimitIsRefused(t *testing.T) {
	f := start(t, 1, options{env: map[string]string{"KVGATE_MAX_REQUEST_BODY_BYTES": "200"}})
	r := completionRequest(words("big", 100), "")
	r.pieces = 4
	x := f.envoy.start(t, duplex, r)
	if x.immediate == nil || x.immediate.GetStatus().GetCode() != http.StatusRequestEntityTooLarge {
		t.Fatalf("want 413, got %v", x.immediate)
	}
}

func TestTheLargestBodyLimitStillLetsMessagesThrough(t *testing.T) {
	// The gRPC message bound is the body limit plus room for headers; at
	// the largest limit the sum must not wrap around to a bound no
	// message meets.
	largest := strconv.FormatInt(math.MaxInt64, 10)
	f := start(t, 1, options{env: map[string]string{
		"KVGATE_MAX_REQUEST_BODY_BYTES": largest, "KVGATE_MAX_HELD_REQUEST_BYTES": largest}})
	x := f.envoy.start(t, buffered, completionRequest("under the largest limit", ""))
	x.forward(64)
	if x.status != http.StatusOK {
		t.Fatalf("a request under the largest body limit: %d %s", x.status, x.respBody)
	}
}

func TestABodyBeyondTheBytesTheGatewayHoldsIsRefused(t *testing.T) {
	f := start(t, 1, options{env: map[string]string{
		"KVGATE_MAX_REQUEST_BODY_BYTES": "2000", "KVGATE_MAX_HELD_REQUEST_BYTES": "3000"}})
	picker := f.gw.Picker()
	// Other requests hold all but 1000 bytes.
	if e := picker.HoldBody(2000); e != nil {
		t.Fatal(e)
	}
	r := completionRequest(words("big", 250), "")
	r.pieces = 4
	x := f.envoy.start(t, duplex, r)
	if x.immediate == nil || x.immediate.GetStatus().GetCode() != http.StatusServiceUnavailable {
		t.Fatalf("want 503, got %v", x.immediate)
	}
	if _, code := errorOf(t, x.immediate.GetBody()); code != "gateway_overloaded" {
		t.Errorf("code %q, want gateway_overloaded", code)
	}
	picker.ReleaseBody(2000)
	x = f.envoy.start(t, duplex, r)
	x.destination()
	x.forward(128)
	if x.status != http.StatusOK {
		t.Fatalf("with the bytes given back: %d %s", x.status, x.respBody)
	}
	if n := f.metric(t, "kvgate_extproc_stream_errors_total", map[string]string{"reason": errOverloaded}); n != 1 {
		t.Errorf("overloaded streams %v, want 1", n)
	}
	testsupport.EventuallyWhy(t, "the streams to give their bytes back", func() (string, bool) {
		n := f.metric(t, "kvgate_gateway_held_request_bytes", nil)
		return fmt.Sprint(n), n == 0
	})
}

func TestEnvoysReportOfAnUnreachablePodEjectsIt(t *testing.T) {
	// Without scrapes only requests eject or readmit a pod, and an ejection
	// outlasts the test.
	f := start(t, 2, options{configure: func(c *gateway.Config) {
		c.Cache.PodMetricRefreshInterval = -1
		c.Cache.EjectionBackoff, c.Cache.MaxEjectionBackoff = time.Hour, time.Hour
	}})
	x := f.envoy.start(t, buffered, completionRequest("doomed", ""))
	dead := x.destination()
	resp := &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"text/plain"}}}
	x.relayHeaders(resp, map[string]string{
		AttributeCodeDetails: "upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_Connection_refused}"})
	x.relayBody(strings.NewReader("upstream connect error or disconnect/reset before headers"), 512, -1)
	x.close()
	if n := f.metric(t, "kvgate_cache_pod_ejections_total", map[string]string{"reason": "connection_refused"}); n != 1 {
		t.Fatalf("ejections %v, want 1", n)
	}
	for range 5 {
		x := f.envoy.start(t, buffered, completionRequest("avoid the dead pod", ""))
		if got := x.destination(); got == dead {
			t.Fatalf("routed to %s, which Envoy could not reach", dead)
		}
		x.forward(512)
	}
	if n := f.metric(t, "kvgate_gateway_upstream_failures_total", map[string]string{"reason": "connection_refused"}); n != 1 {
		t.Errorf("upstream failures %v, want 1", n)
	}
}

func TestAClientLeavingMidStreamEndsTheRequest(t *testing.T) {
	f := start(t, 1, options{})
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			before := f.metric(t, "kvgate_extproc_requests_total", map[string]string{"code": "499"})
			x := f.envoy.start(t, mode, completionRequest(words("leave", 20), `,"stream":true,"max_tokens":64`))
			resp := x.upstream()
			defer resp.Body.Close()
			x.relayHeaders(resp, nil)
			x.relayBody(resp.Body, 64, 2)
			testsupport.Eventually(t, "the request to count as running", func() bool {
				return f.metric(t, "kvgate_cache_tracked_requests", nil) == 1
			})
			x.cancel() // the client went away: Envoy resets the stream
			testsupport.EventuallyWhy(t, "the request to leave the ledger", func() (string, bool) {
				n := f.metric(t, "kvgate_cache_tracked_requests", nil)
				return fmt.Sprintf("%v tracked", n), n == 0 && f.metric(t, "kvgate_extproc_streams_in_flight", nil) == 0
			})
			if n := f.metric(t, "kvgate_extproc_requests_total", map[string]string{"code": "499"}); n != before+1 {
				t.Errorf("requests ended early: %v, want %v", n, before+1)
			}
		})
	}
}

func TestOneStuckOrBrokenStreamBlocksNoOther(t *testing.T) {
	f := start(t, 2, options{})
	// A stream whose body never comes, and one that breaks the protocol.
	stuck, err := f.envoy.client.Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stuck.CloseSend() }()
	if err := stuck.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: duplex.req, ResponseBodyMode: duplex.resp},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(map[string]string{":method": "POST", ":path": gateway.PathCompletions})}},
	}); err != nil {
		t.Fatal(err)
	}
	broken, err := f.envoy.client.Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := broken.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := broken.Recv(); err == nil {
		t.Fatal("a body before any headers was answered")
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			x := f.envoy.start(t, modes[i%len(modes)], completionRequest(fmt.Sprintf("concurrent %d", i), `,"stream":true`))
			x.forward(64)
			if x.status != http.StatusOK {
				t.Errorf("request %d: %d", i, x.status)
			}
		})
	}
	wg.Wait()
	if n := f.metric(t, "kvgate_extproc_stream_errors_total", map[string]string{"reason": errProtocol}); n != 1 {
		t.Errorf("protocol errors %v, want 1", n)
	}
}

func TestWithTheProxyOffEnvoyIsTheOnlyWayIn(t *testing.T) {
	f := start(t, 1, options{env: map[string]string{"KVGATE_PROXY_ENABLED": "false",
		"KVGATE_EXTPROC_LISTEN_ADDRESS": "127.0.0.1:0"}})
	resp, err := http.Post(f.apiURL+gateway.PathCompletions, "application/json", strings.NewReader(completionRequest("x", "").body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the HTTP proxy answered %d with the proxy off, want 404", resp.StatusCode)
	}
	x := f.envoy.start(t, duplex, completionRequest("through envoy", ""))
	x.forward(256)
	if x.status != http.StatusOK {
		t.Fatalf("through Envoy: %d %s", x.status, x.respBody)
	}
}

func TestAnSLORefusalSaysWhenToRetry(t *testing.T) {
	f := start(t, 1, options{env: map[string]string{
		"KVGATE_SLO_MODELS": simModel + "=ttft:1ms",
		"KVGATE_ROUTING_DEFAULT_PREFILL_TOKENS_PER_SECOND": "500",
	}})
	r := completionRequest(words("slow", 300), "")
	r.headers = map[string]string{routing.HeaderRoutingStrategy: "slo-least-load"}
	x := f.envoy.start(t, buffered, r)
	ir := x.immediate
	if ir == nil || ir.GetStatus().GetCode() != http.StatusTooManyRequests {
		t.Fatalf("want 429, got %v", ir)
	}
	if _, code := errorOf(t, ir.GetBody()); code != "slo_unmeetable" {
		t.Errorf("code %q, want slo_unmeetable", code)
	}
	retry := ""
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retry = string(h.GetHeader().GetRawValue())
		}
	}
	if _, err := strconv.Atoi(retry); err != nil {
		t.Errorf("retry-after %q, want whole seconds", retry)
	}
}

// holdStream opens a stream on e and sends full-duplex request headers, as
// Envoy does before the body arrives; the stream then waits for the body.
// It returns the stream and what cancels it.
func holdStream(t *testing.T, e *envoy) (extprocv3.ExternalProcessor_ProcessClient, context.CancelFunc) {
	t.Helper()
	return holdStreamUntil(t, e, time.Time{})
}

// holdStreamUntil is holdStream, the stream cancelled at deadline unless
// it is zero.
func holdStreamUntil(t *testing.T, e *envoy, deadline time.Time) (extprocv3.ExternalProcessor_ProcessClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if !deadline.IsZero() {
		ctx, cancel = context.WithDeadline(context.Background(), deadline)
	}
	t.Cleanup(cancel)
	s, err := e.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: duplex.req, ResponseBodyMode: duplex.resp},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(map[string]string{":method": "POST", ":path": gateway.PathCompletions})}},
	}); err != nil && err != io.EOF { // io.EOF: refused already, which Recv tells
		t.Fatal(err)
	}
	return s, cancel
}

func TestStreamsBeyondTheBoundAreRefusedAndEachEndGivesItsSlotBack(t *testing.T) {
	f := start(t, 1, options{env: map[string]string{"KVGATE_EXTPROC_MAX_STREAMS": "2"}})
	refused := func() float64 {
		return f.metric(t, "kvgate_extproc_stream_errors_total", map[string]string{"reason": errTooMany})
	}
	inFlight := func(n float64) {
		t.Helper()
		testsupport.EventuallyWhy(t, fmt.Sprintf("%v streams in flight", n), func() (string, bool) {
			got := f.metric(t, "kvgate_extproc_streams_in_flight", nil)
			return fmt.Sprint(got), got == n
		})
	}
	// wantRefused opens a stream on e and wants it refused at once.
	wantRefused := func(e *envoy) {
		t.Helper()
		s, _ := holdStreamUntil(t, e, time.Now().Add(testsupport.WaitTimeout))
		_, err := s.Recv()
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "KVGATE_EXTPROC_MAX_STREAMS") {
			t.Fatalf("a stream beyond the bound ended with %v, want RESOURCE_EXHAUSTED naming KVGATE_EXTPROC_MAX_STREAMS", err)
		}
	}
	// Two streams wait for their bodies on Envoy's connection.
	_, cancelA := holdStream(t, f.envoy)
	b, _ := holdStream(t, f.envoy)
	inFlight(2)
	// A third on that connection waits until one of them ends
	// (MAX_CONCURRENT_STREAMS); one on another connection is refused.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	queued := make(chan error, 1)
	go func() {
		_, err := f.envoy.client.Process(ctx)
		queued <- err
	}()
	other := dialEnvoy(t, f.extAddr, true)
	wantRefused(other)
	if n := refused(); n != 1 {
		t.Fatalf("refused streams %v, want 1", n)
	}
	select {
	case err := <-queued:
		t.Fatalf("a third stream opened on a connection serving the most streams (%v)", err)
	default:
	}
	// b breaks the protocol and ends with an error: the queued stream takes
	// its slot.
	if err := b.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(map[string]string{":method": "POST"})}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("headers twice: %v, want INVALID_ARGUMENT", err)
	}
	select {
	case err := <-queued:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testsupport.WaitTimeout):
		t.Fatal("the stream queued on the connection was not opened once another ended")
	}
	inFlight(2)
	// Envoy resets the first: a new stream is served.
	cancelA()
	inFlight(1)
	x := other.start(t, buffered, completionRequest("served again", ""))
	x.forward(64)
	if x.status != http.StatusOK {
		t.Fatalf("a stream within the bound: %d %s", x.status, x.respBody)
	}
	// The broken, reset and ended streams gave their slots back once each:
	// the queued stream holds one, a new one the other, and the next is
	// refused.
	inFlight(1)
	holdStream(t, other)
	inFlight(2)
	wantRefused(other)
	if n := refused(); n != 2 {
		t.Errorf("refused streams %v, want 2", n)
	}
}

func TestARequestWaitingInItsQueueAsksEnvoyToWaitForIt(t *testing.T) {
	// At 90 tokens a second, each prompt (some 490 tokens) takes about
	// 5.4 s to prefill: a pod can meet the 10 s objective of one, not of two,
	// and the second can wait some 4.5 s for the first to leave.
	f := start(t, 1, options{env: map[string]string{
		"KVGATE_ROUTING_ALGORITHM":                         "slo-least-load-pulling",
		"KVGATE_SLO_MODELS":                                simModel + "=ttft:10s",
		"KVGATE_ROUTING_DEFAULT_PREFILL_TOKENS_PER_SECOND": "90",
		"KVGATE_EXTPROC_MAX_MESSAGE_TIMEOUT":               "20s",
	}})
	first := f.envoy.start(t, buffered, completionRequest(words("first", 150), ""))
	first.destination()
	if len(first.overrides) != 0 {
		t.Fatalf("the first request, routed at once, asked Envoy to wait %v", first.overrides)
	}
	// The second waits until the first's stream ends; Envoy was asked to
	// wait for it first.
	overridden := func() bool {
		mfs, err := f.reg.Gather()
		if err != nil {
			return false
		}
		for _, mf := range mfs {
			if mf.GetName() == "kvgate_extproc_message_timeout_overrides_total" {
				return mf.GetMetric()[0].GetCounter().GetValue() >= 1
			}
		}
		return false
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		for !overridden() {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		first.cancel()
	}()
	second := f.envoy.start(t, buffered, completionRequest(words("second", 150), ""))
	second.destination()
	if len(second.overrides) != 1 || second.overrides[0] <= time.Second || second.overrides[0] > 20*time.Second {
		t.Errorf("the request that waited asked Envoy to wait %v, want once, more than a second and at most 20 s", second.overrides)
	}
	if n := f.metric(t, "kvgate_slo_requests_total", map[string]string{"outcome": "admitted"}); n != 2 {
		t.Errorf("admitted %v requests, want 2", n)
	}
}

func TestConnectionsBeyondTheBoundWaitForOneToClose(t *testing.T) {
	f := start(t, 1, options{env: map[string]string{"KVGATE_EXTPROC_MAX_CONNECTIONS": "1"}})
	x := f.envoy.start(t, buffered, completionRequest("one connection", ""))
	x.destination()
	// A second connection is not accepted while the first is open: its
	// call does not complete.
	other := dialEnvoy(t, f.extAddr, true)
	checked := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testsupport.WaitTimeout)
		defer cancel()
		_, err := healthpb.NewHealthClient(other.conn).Check(ctx, &healthpb.HealthCheckRequest{})
		checked <- err
	}()
	select {
	case err := <-checked:
		t.Fatalf("a connection beyond the bound was served (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	if n := f.metric(t, "kvgate_extproc_connections", nil); n != 1 {
		t.Errorf("%v connections open, want 1", n)
	}
	if n := f.metric(t, "kvgate_extproc_connection_limit_waits_total", nil); n < 1 {
		t.Errorf("the listener waited %v times, want at least once", n)
	}
	// Once the first closes, the second is served.
	x.cancel()
	_ = f.envoy.conn.Close()
	select {
	case err := <-checked:
		if err != nil {
			t.Fatalf("the connection after the first closed: %v", err)
		}
	case <-time.After(testsupport.WaitTimeout):
		t.Fatal("the connection waiting for a slot was not served once the first closed")
	}
	if n := f.metric(t, "kvgate_extproc_connections", nil); n != 1 {
		t.Errorf("%v connections open, want the second only", n)
	}
}

// answerPanics is a stream carrying one buffered request whose answer
// panics as the Server sends it.
type answerPanics struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*extprocv3.ProcessingRequest
}

func (a *answerPanics) Context() context.Context { return a.ctx }

func (a *answerPanics) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(a.msgs) == 0 {
		return nil, io.EOF
	}
	m := a.msgs[0]
	a.msgs = a.msgs[1:]
	return m, nil
}

func (a *answerPanics) Send(*extprocv3.ProcessingResponse) error { panic("the answer cannot be sent") }

func TestAPanicServingAStreamEndsThatStreamAloneWithInternal(t *testing.T) {
	f := start(t, 2, options{})
	body := completionRequest("a stream that panics", "").body
	st := &answerPanics{ctx: context.Background(), msgs: []*extprocv3.ProcessingRequest{
		{
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: buffered.req, ResponseBodyMode: buffered.resp},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: headerMap(map[string]string{":method": "POST", ":path": gateway.PathCompletions,
					"content-type": "application/json", "content-length": strconv.Itoa(len(body))})}},
		},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}},
	}}
	if err := f.srv.Process(st); status.Code(err) != codes.Internal {
		t.Fatalf("Process = %v, want INTERNAL", err)
	}
	if n := f.metric(t, "kvgate_extproc_stream_errors_total", map[string]string{"reason": errPanic}); n != 1 {
		t.Errorf("panics counted %v, want 1", n)
	}
	testsupport.EventuallyWhy(t, "the stream's slot and its request to be released", func() (string, bool) {
		streams := f.metric(t, "kvgate_extproc_streams_in_flight", nil)
		tracked := f.metric(t, "kvgate_cache_tracked_requests", nil)
		return fmt.Sprintf("%v streams in flight, %v requests tracked", streams, tracked), streams == 0 && tracked == 0
	})
	x := f.envoy.start(t, buffered, completionRequest("a stream after the panic", ""))
	x.forward(64)
	if x.status != http.StatusOK {
		t.Fatalf("a request after the panic: %d", x.status)
	}
}

// TestValuesVLLMAcceptsInAnyFormAreReadAsVLLMReadsThem sends a request
// whose stream and max_tokens are strings, as vLLM's validation accepts
// them: it is routed as a stream, asks the engine for the usage chunk
// without any other change to the body, and the client is relayed the
// stream without that chunk.
func TestValuesVLLMAcceptsInAnyFormAreReadAsVLLMReadsThem(t *testing.T) {
	f := start(t, 1, options{})
	events := `data: {"id":"c","object":"text_completion","created":1,"model":"sim","choices":[{"index":0,"text":" a","finish_reason":"length"}]}` + "\n\n"
	usage := `data: {"id":"c","object":"text_completion","created":1,"model":"sim","choices":[],` +
		`"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}` + "\n\n"
	done := "data: [DONE]\n\n"
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			body := `{"model":"` + simModel + `","prompt":"lax values","stream":"true","max_tokens":"8"}`
			x := f.envoy.start(t, mode, request{method: http.MethodPost, path: gateway.PathCompletions, body: body})
			if x.immediate != nil {
				t.Fatalf("refused with %d: %s", x.immediate.GetStatus().GetCode(), x.immediate.GetBody())
			}
			want := `{"stream_options":{"include_usage":true},` + body[1:]
			if string(x.body) != want {
				t.Errorf("forwarded body %s, want %s", x.body, want)
			}
			x.destination()
			x.relayHeaders(&http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}}}, nil)
			x.sendResponsePiece([]byte(events+usage+done), true)
			x.close()
			if string(x.respBody) != events+done {
				t.Errorf("client received %q, want %q", x.respBody, events+done)
			}
		})
	}
}

// TestStreamOptionsWithoutIncludeUsageAskForUsageAsInVLLM sends a stream
// whose stream_options leave include_usage out, which vLLM reads as true:
// the body goes to the engine unchanged and the client receives the usage
// chunk.
func TestStreamOptionsWithoutIncludeUsageAskForUsageAsInVLLM(t *testing.T) {
	f := start(t, 1, options{})
	events := `data: {"id":"c","object":"text_completion","created":1,"model":"sim","choices":[{"index":0,"text":" a","finish_reason":"length"}]}` + "\n\n" +
		`data: {"id":"c","object":"text_completion","created":1,"model":"sim","choices":[],` +
		`"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}` + "\n\n" + "data: [DONE]\n\n"
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			r := completionRequest("default usage", `,"stream":true,"stream_options":{}`)
			x := f.envoy.start(t, mode, r)
			if x.immediate != nil {
				t.Fatalf("refused with %d: %s", x.immediate.GetStatus().GetCode(), x.immediate.GetBody())
			}
			if string(x.body) != r.body {
				t.Errorf("forwarded body %s, want it unchanged: %s", x.body, r.body)
			}
			x.destination()
			x.relayHeaders(&http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}}}, nil)
			x.sendResponsePiece([]byte(events), true)
			x.close()
			if string(x.respBody) != events {
				t.Errorf("client received %q, want %q", x.respBody, events)
			}
		})
	}
}
