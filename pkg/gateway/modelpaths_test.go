package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
)

// modelBody is a body naming model whose spacing, member order, escapes and
// number forms a re-encoding would change: the engine must receive it as
// the client wrote it.
func modelBody(model string) string {
	return "{ \"input\" : [\"caf\\u00e9\", \"x\"],\n  \"model\":\"" + model + "\", \"dimensions\": 1.0e2, \"extra\": {\"k\": null} }"
}

func TestModelRoutedEndpointsReachAPodOfTheNamedModelWithTheBodyAsSent(t *testing.T) {
	// a serves llama and the adapter sql-lora; b serves llama alone.
	f := startFleet(t, []string{"a", "b"}, fleetOptions{
		env:     map[string]string{"KVGATE_ADAPTER_REFRESH_INTERVAL": "20ms"},
		declare: map[string][]string{"a": {"sql-lora"}},
	})
	a, b := f.engine("a"), f.engine("b")
	a.setAdapters("sql-lora")
	f.waitAdapterPods("static/a")

	for _, path := range modelPaths {
		if path == "/tokenize" {
			continue // the test engines answer it themselves; TestTokenizeThroughTheProxyIsAnsweredByTheEngine covers it
		}
		// Each routing algorithm routes these requests, the prompt-reading
		// and SLO-aware ones on load alone, without queueing.
		for _, strategy := range []string{"", "kv-aware", "prefix-cache", "least-latency", "slo", "slo-least-load"} {
			body := modelBody("sql-lora")
			before := len(a.received())
			resp, data := post(t, f.url+path, body, map[string]string{"routing-strategy": strategy, "X-Request-Id": "client-1"})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s with %q: %d %s", path, strategy, resp.StatusCode, data)
			}
			if pod := resp.Header.Get(HeaderTargetPodName); pod != "static/a" {
				t.Errorf("%s with %q went to %q; want static/a, the only pod serving sql-lora", path, strategy, pod)
			}
			if resp.Header.Get(HeaderServerTiming) == "" {
				t.Errorf("%s with %q: no %s header", path, strategy, HeaderServerTiming)
			}
			got := a.received()
			if len(got) != before+1 {
				t.Fatalf("%s with %q: engine a received %d requests, want %d", path, strategy, len(got), before+1)
			}
			last := got[len(got)-1]
			if last.path != path || string(last.body) != body {
				t.Errorf("engine a received %s %q; want %s %q", last.path, last.body, path, body)
			}
			if id := last.header.Get("X-Request-Id"); id != "client-1" {
				t.Errorf("%s: the engine received X-Request-Id %q; want the client's", path, id)
			}
			if last.header.Get("X-Forwarded-For") == "" {
				t.Errorf("%s: the engine received no X-Forwarded-For", path)
			}
		}
		// Each endpoint's requests are counted and timed under its own path,
		// once the handler has returned.
		for _, name := range []string{"kvgate_gateway_requests_total", "kvgate_gateway_request_duration_seconds"} {
			testsupport.EventuallyWhy(t, name+"{endpoint="+path+"} to count one request a routing algorithm", func() (string, bool) {
				n := testsupport.MetricValue(t, f.gw.registry, name, map[string]string{"endpoint": path, "model": "sql-lora"})
				return fmt.Sprint(n), n == 6
			})
		}
	}
	if n := len(b.received()); n != 0 {
		t.Errorf("engine b, which does not serve sql-lora, received %d requests", n)
	}
	if tokenized := append(a.tokenizedModels(), b.tokenizedModels()...); len(tokenized) != 0 {
		t.Errorf("the gateway tokenized requests to endpoints it routes on load alone: %v", tokenized)
	}
	if missing := f.metric("kvgate_gateway_responses_without_usage_total"); missing != 0 {
		t.Errorf("responses without usage counted %v times; endpoints other than the completions report none", missing)
	}
}

func TestModelRoutedEndpointsRefuseAsTheCompletionsDo(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{"KVGATE_MAX_REQUEST_BODY_BYTES": "1024"}})
	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"unknown model", http.MethodPost, "/v1/embeddings", `{"model":"nope","input":"x"}`, http.StatusNotFound, codeModelNotFound},
		{"no model", http.MethodPost, "/v1/rerank", `{"query":"q","documents":["d"]}`, http.StatusBadRequest, codeMissingField},
		{"null model", http.MethodPost, "/score", `{"model":null}`, http.StatusBadRequest, codeMissingField},
		{"not an object", http.MethodPost, "/pooling", `["llama"]`, http.StatusBadRequest, codeMissingField},
		{"model of another type", http.MethodPost, "/classify", `{"model":7}`, http.StatusBadRequest, codeInvalidJSON},
		{"broken JSON", http.MethodPost, "/v1/responses", `{"model":"llama",`, http.StatusBadRequest, codeInvalidJSON},
		{"too large", http.MethodPost, "/v1/embeddings", `{"model":"llama","input":"` + strings.Repeat("x", 2048) + `"}`,
			http.StatusRequestEntityTooLarge, codeRequestTooLarge},
		{"GET on a POST endpoint", http.MethodGet, "/v1/embeddings", "", http.StatusMethodNotAllowed, codeMethodNotAllowed},
		{"a stored response", http.MethodGet, "/v1/responses/resp_1", "", http.StatusNotFound, codeNotFound},
		{"cancelling a stored response", http.MethodPost, "/v1/responses/resp_1/cancel", `{}`, http.StatusNotFound, codeNotFound},
	}
	// Endpoints that act on one engine are no client's to reach through
	// the gateway.
	for _, p := range []string{"/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/reset_prefix_cache", "/reset_mm_cache",
		"/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/start_profile", "/stop_profile", "/scale_elastic_ep",
		"/is_scaling_elastic_ep", "/invocations"} {
		cases = append(cases, struct {
			name, method, path, body string
			status                   int
			code                     string
		}{"engine endpoint " + p, http.MethodPost, p, `{"model":"llama","lora_name":"x"}`, http.StatusNotFound, codeNotFound})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, f.url+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var e apiError
			if resp.StatusCode != tc.status || json.Unmarshal(data, &e) != nil || e.Error.Code != tc.code {
				t.Fatalf("%s %s: %d %s; want %d %s", tc.method, tc.path, resp.StatusCode, data, tc.status, tc.code)
			}
			if tc.status == http.StatusMethodNotAllowed && resp.Header.Get("Allow") != http.MethodPost {
				t.Errorf("Allow = %q; want POST", resp.Header.Get("Allow"))
			}
			if strings.HasPrefix(tc.path, "/v1/responses/") && !strings.Contains(e.Error.Message, "stored response") {
				t.Errorf("the error does not say why a stored response is not routed: %s", e.Error.Message)
			}
		})
	}
	if n := len(f.engine("a").received()); n != 0 {
		t.Errorf("the engine received %d of the refused requests: %v", n, f.engine("a").received())
	}
}

func TestAStreamedResponsesAPIReplyIsRelayedEventByEventWhileItsRequestRunsOnThePod(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	events := []string{
		"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\n",
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\",\"sequence_number\":1}\n\n",
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}},\"sequence_number\":2}\n\n",
	}
	release := make(chan struct{})
	f.engine("a").setAnswer(func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		for i, ev := range events {
			if i == len(events)-1 {
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	})
	running := func() int64 {
		var n int64
		for _, l := range f.gw.store.PodLoads() {
			n += l.Running()
		}
		return n
	}

	resp := openStream(t, f.url+"/v1/responses", `{"model":"llama","input":"hello","stream":true}`)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := bufio.NewReader(resp.Body)
	readEvent := func() string {
		var ev strings.Builder
		for {
			line, err := r.ReadString('\n')
			ev.WriteString(line)
			if err != nil || line == "\n" {
				return ev.String()
			}
		}
	}
	// The events sent so far reach the client while the engine holds back
	// the last one.
	for _, want := range events[:2] {
		if got := readEvent(); got != want {
			t.Fatalf("event %q; want %q", got, want)
		}
	}
	if n := running(); n != 1 {
		t.Errorf("%d requests running on the pod while the response streams; want 1", n)
	}
	close(release)
	rest, err := io.ReadAll(r)
	if err != nil || string(rest) != events[2] {
		t.Fatalf("the rest of the stream: %q, %v; want %q", rest, err, events[2])
	}
	testsupport.Eventually(t, "the request to leave the pod once its response ended", func() bool { return running() == 0 })
	if missing := f.metric("kvgate_gateway_responses_without_usage_total"); missing != 0 {
		t.Errorf("responses without usage counted %v times", missing)
	}
}

func TestTokenizeThroughTheProxyIsAnsweredByTheEngine(t *testing.T) {
	pod := startKeyedSim(t)
	f := serveSims(t, staticPods{pod}, nil)
	const body = `{"model":"llama","prompt":"the quick brown fox"}`
	direct, want := post(t, "http://127.0.0.1:"+pod.Labels[endpoint.ModelPortLabel]+"/tokenize", body, nil)
	if direct.StatusCode != http.StatusOK {
		t.Fatalf("the engine's /tokenize: %d %s", direct.StatusCode, want)
	}
	resp, got := post(t, f.url+"/tokenize", body, nil)
	if resp.StatusCode != http.StatusOK || string(got) != string(want) {
		t.Fatalf("/tokenize through the gateway: %d %s; want the engine's %s", resp.StatusCode, got, want)
	}
	if pod := resp.Header.Get(HeaderTargetPodName); pod != "ns/keyed" {
		t.Errorf("served by %q", pod)
	}
}

func TestThePickerReadsNoUsageFromTheResponsesOfModelRoutedEndpoints(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	p := f.gw.Picker()
	var closed []*inflight.Handle
	var mu sync.Mutex
	f.gw.ledger.Observe(inflight.Observer{Closed: func(h *inflight.Handle) {
		mu.Lock()
		defer mu.Unlock()
		closed = append(closed, h)
	}})
	// An embeddings response carries prompt tokens and no completion: read
	// as a completion's usage, it would teach the output predictor that
	// the model generates nothing.
	for _, body := range []string{
		`{"object":"list","data":[{"object":"embedding","embedding":[0.1],"index":0}],"model":"llama",` +
			`"usage":{"prompt_tokens":5,"total_tokens":5,"completion_tokens":0}}`,
		`{"id":"rerank-1","model":"llama","results":[{"index":0,"relevance_score":0.9}]}`,
	} {
		k, err := p.Pick(context.Background(), PickRequest{Path: "/v1/embeddings", Body: []byte(`{"model":"llama","input":"x"}`)})
		if err != nil {
			t.Fatalf("Pick: %v", err)
		}
		r := k.Response(http.StatusOK, "application/json")
		if out := r.Body(nil, []byte(body), true); string(out) != body {
			t.Errorf("the body became %q", out)
		}
		r.Done()
		k.End()
	}
	testsupport.Eventually(t, "both attempts to close", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(closed) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	for _, h := range closed {
		if u, ok := h.Usage(); ok {
			t.Errorf("usage %+v reported for a model-routed request", u)
		}
		if o, _ := h.Outcome(); o != inflight.Done {
			t.Errorf("attempt closed as %v, want done", o)
		}
	}
	if missing := f.metric("kvgate_gateway_responses_without_usage_total"); missing != 0 {
		t.Errorf("responses without usage counted %v times", missing)
	}
}

// audioForm is a multipart/form-data body as OpenAI's SDKs send to the
// audio endpoints: the file first, then fields (model among them when
// model is not empty, after others more parts); it returns the body and
// its Content-Type.
func audioForm(t *testing.T, model string, others int) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	fw, err := w.CreateFormFile("file", "speech.wav")
	if err != nil {
		t.Fatal(err)
	}
	audio := make([]byte, 64<<10)
	for i := range audio {
		audio[i] = byte(i * 7)
	}
	// A line in the file that looks like a field must not be taken for
	// one.
	copy(audio[1000:], "\r\n--"+w.Boundary()+"x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nnope\r\n")
	_, _ = fw.Write(audio)
	for i := range others {
		_ = w.WriteField(fmt.Sprintf("field%d", i), "v")
	}
	_ = w.WriteField("language", "en")
	if model != "" {
		_ = w.WriteField("model", model)
	}
	_ = w.WriteField("response_format", "json")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String(), w.FormDataContentType()
}

func TestAudioFormsAreRoutedByTheirModelField(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{
		env:     map[string]string{"KVGATE_ADAPTER_REFRESH_INTERVAL": "20ms"},
		declare: map[string][]string{"a": {"sql-lora"}},
	})
	a := f.engine("a")
	a.setAdapters("sql-lora")
	f.waitAdapterPods("static/a")

	for _, path := range []string{"/v1/audio/transcriptions", "/v1/audio/translations"} {
		body, contentType := audioForm(t, "sql-lora", 0)
		resp, data := post(t, f.url+path, body, map[string]string{"Content-Type": contentType})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "static/a" {
			t.Fatalf("%s: %d from %q: %s", path, resp.StatusCode, resp.Header.Get(HeaderTargetPodName), data)
		}
		got := a.received()
		if last := got[len(got)-1]; last.path != path || string(last.body) != body || last.header.Get("Content-Type") != contentType {
			t.Errorf("%s: engine a received %s, %d bytes of %q; want the form as sent", path, last.path, len(last.body),
				last.header.Get("Content-Type"))
		}
	}

	noModel, noModelType := audioForm(t, "", 0)
	late, lateType := audioForm(t, "sql-lora", maxFormParts)
	long, longType := audioForm(t, strings.Repeat("m", maxFormModelBytes+1), 0)
	unknown, unknownType := audioForm(t, "nope", 0)
	good, goodType := audioForm(t, "llama", 0)
	for _, tc := range []struct {
		name, body, contentType string
		status                  int
		code                    string
	}{
		{"no model field", noModel, noModelType, http.StatusBadRequest, codeMissingField},
		{"the model field beyond the parts read", late, lateType, http.StatusBadRequest, codeMissingField},
		{"a model field beyond its bound", long, longType, http.StatusBadRequest, codeUnreadableBody},
		{"an unknown model", unknown, unknownType, http.StatusNotFound, codeModelNotFound},
		{"a form cut short", good[:len(good)/2], goodType, http.StatusBadRequest, codeUnreadableBody},
		{"a form without its boundary", good, "multipart/form-data", http.StatusBadRequest, codeMissingField},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(a.received()) + len(f.engine("b").received())
			resp, data := post(t, f.url+"/v1/audio/transcriptions", tc.body, map[string]string{"Content-Type": tc.contentType})
			var e apiError
			if resp.StatusCode != tc.status || json.Unmarshal(data, &e) != nil || e.Error.Code != tc.code {
				t.Fatalf("%d %s; want %d %s", resp.StatusCode, data, tc.status, tc.code)
			}
			if after := len(a.received()) + len(f.engine("b").received()); after != before {
				t.Errorf("the refused form reached an engine")
			}
		})
	}
}

func TestTheEndpointLabelIsAPathTheGatewayRoutesOrOther(t *testing.T) {
	for path, want := range map[string]string{
		PathChatCompletions:            PathChatCompletions,
		PathCompletions + "?x=1":       PathCompletions,
		PathModels:                     PathModels,
		PathMessages:                   PathMessages,
		PathResponses:                  PathResponses,
		PathResponses + "/resp_1":      "other",
		"/v1/embeddings":               "/v1/embeddings",
		"/v1/audio/transcriptions":     "/v1/audio/transcriptions",
		"/v1/load_lora_adapter":        "other",
		"/v1/embeddings/":              "other",
		"/" + strings.Repeat("x", 300): "other",
		"":                             "other",
	} {
		if got := Endpoint(path); got != want {
			t.Errorf("Endpoint(%.40q) = %q, want %q", path, got, want)
		}
	}
}
