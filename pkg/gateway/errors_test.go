package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// decodeError checks an OpenAI-style error body and returns it.
func decodeError(t *testing.T, body []byte) apiErrorBody {
	t.Helper()
	var e struct {
		Error *apiErrorBody `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error: %s (%v)", body, err)
	}
	return *e.Error
}

func TestErrorsAreOpenAIStyleJSON(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{"KVGATE_MAX_REQUEST_BODY_BYTES": "1024"}})
	big := completion(strings.Repeat("x", 2000), "")
	tests := []struct {
		name, method, path, body string
		header                   map[string]string
		chunked                  bool
		status                   int
		code, param              string
	}{
		{"bad JSON", "POST", "/v1/completions", `{"model":"llama",`, nil, false, 400, codeInvalidJSON, ""},
		{"not an object", "POST", "/v1/chat/completions", `[1,2]`, nil, false, 400, codeInvalidJSON, ""},
		{"field of the wrong type", "POST", "/v1/completions", `{"model":7}`, nil, false, 400, codeInvalidJSON, ""},
		{"no model", "POST", "/v1/completions", `{"prompt":"hi"}`, nil, false, 400, codeMissingField, "model"},
		{"unknown model", "POST", "/v1/completions", `{"model":"gpt-9","prompt":"hi"}`, nil, false, 404, codeModelNotFound, "model"},
		{"unknown routing strategy", "POST", "/v1/completions", completion("hi", ""),
			map[string]string{"routing-strategy": "fastest"}, false, 400, codeUnknownStrategy, ""},
		{"oversized body", "POST", "/v1/completions", big, nil, false, 413, codeRequestTooLarge, ""},
		{"oversized chunked body", "POST", "/v1/completions", big, nil, true, 413, codeRequestTooLarge, ""},
		{"bad stream_options", "POST", "/v1/completions", completion("hi", `,"stream":true,"stream_options":[1]`), nil, false,
			400, codeInvalidField, "stream_options"},
		{"include_usage no boolean reading takes", "POST", "/v1/completions",
			completion("hi", `,"stream":true,"stream_options":{"include_usage":"maybe"}`), nil, false, 400, codeInvalidField, "stream_options"},
		{"wrong method", "GET", "/v1/completions", "", nil, false, 405, codeMethodNotAllowed, ""},
		{"wrong method for models", "POST", "/v1/models", "", nil, false, 405, codeMethodNotAllowed, ""},
		{"no such endpoint", "GET", "/v1/assistants", "", nil, false, 404, codeNotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body = strings.NewReader(tt.body)
			req, _ := http.NewRequest(tt.method, f.url+tt.path, body)
			if tt.chunked {
				req.ContentLength = -1
				req.Body = readerOnly{body}
			}
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var data json.RawMessage
			_ = json.NewDecoder(resp.Body).Decode(&data)
			e := decodeError(t, data)
			param := ""
			if e.Param != nil {
				param = *e.Param
			}
			if resp.StatusCode != tt.status || e.Code != tt.code || param != tt.param ||
				resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("got %d %s (%s), want %d code %s param %q", resp.StatusCode, data, resp.Header.Get("Content-Type"),
					tt.status, tt.code, tt.param)
			}
		})
	}
	if got := len(f.engine("a").received()); got != 0 {
		t.Errorf("the engine received %d requests, want none", got)
	}
	if n := testsupport.MetricValue(t, f.gw.registry, "kvgate_gateway_requests_total",
		map[string]string{"algorithm": "", "code": "400", "model": ""}); n != 5 {
		t.Errorf("400s counted without model and algorithm = %v, want 5", n)
	}
	if n := f.metric(`kvgate_gateway_requests_total{algorithm="kv-aware",code="404",endpoint="/v1/completions",model=""}`); n != 1 {
		t.Errorf("404 for an unknown model counted %v times without its model label, want 1", n)
	}
}

// readerOnly hides a body's length from net/http, so that it is sent
// chunked.
type readerOnly struct{ r *strings.Reader }

func (r readerOnly) Read(p []byte) (int, error) { return r.r.Read(p) }
func (r readerOnly) Close() error               { return nil }

// podsSource is a cache.PodSource that delivers fixed pods once release is
// closed.
type podsSource struct {
	pods    []*v1.Pod
	release chan struct{}
}

func (s *podsSource) Run(ctx context.Context, _ *rest.Config, sink cache.PodSink, synced func()) error {
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, p := range s.pods {
		sink.AddOrUpdatePod(p)
	}
	synced()
	<-ctx.Done()
	return nil
}

// unreadyPod is a pod of model llama whose Ready condition is false.
func unreadyPod(name string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: k8stypes.UID("uid-" + name),
			Labels: map[string]string{endpoint.ModelNameLabel: "llama"}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1",
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionFalse}}},
	}
}

func TestModelWithoutReadyPodIs503(t *testing.T) {
	src := &podsSource{pods: []*v1.Pod{unreadyPod("p0")}, release: make(chan struct{})}
	close(src.release)
	cfg := loadTestConfig(t, map[string]string{"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false"})
	cfg.PodSource = src
	_, url, _ := serveGateway(t, cfg)
	testsupport.EventuallyWhy(t, "readiness", func() (string, bool) {
		status, body := get(t, url+"/readyz")
		return body, status == http.StatusOK
	})
	resp, body := post(t, url+"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`, nil)
	if e := decodeError(t, body); resp.StatusCode != http.StatusServiceUnavailable || e.Code != codeNoReadyPod {
		t.Errorf("got %d %s, want 503 %s", resp.StatusCode, body, codeNoReadyPod)
	}
	for _, path := range []string{PathMessages, pathCountTokens} {
		resp, body := post(t, url+path, anthropicBody("hi", ""), nil)
		if e := decodeAnthropicError(t, body); resp.StatusCode != http.StatusServiceUnavailable || e.Type != typeServiceUnavailable {
			t.Errorf("%s: got %d %s, want 503 %s in Anthropic's shape", path, resp.StatusCode, body, typeServiceUnavailable)
		}
	}
	if status, list := get(t, url+"/v1/models"); status != http.StatusOK || list != `{"object":"list","data":[]}`+"\n" {
		t.Errorf("/v1/models with no ready pod: %d %s", status, list)
	}
}

// decodeAnthropicError checks an Anthropic-style error body, its members
// those of Anthropic's shape and no others, and returns its error.
func decodeAnthropicError(t *testing.T, body []byte) anthropicErrorInner {
	t.Helper()
	var outer map[string]json.RawMessage
	var inner map[string]string
	if err := json.Unmarshal(body, &outer); err != nil || len(outer) != 2 || string(outer["type"]) != `"error"` ||
		json.Unmarshal(outer["error"], &inner) != nil || len(inner) != 2 || inner["type"] == "" || inner["message"] == "" {
		t.Fatalf("not an Anthropic error: %s (%v)", body, err)
	}
	return anthropicErrorInner{Type: inner["type"], Message: inner["message"]}
}

func TestTheGatewaysErrorsToAnthropicRequestsAreInAnthropicsShape(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{"KVGATE_MAX_REQUEST_BODY_BYTES": "1024"}})
	tests := []struct {
		name, method, path, body string
		status                   int
		typ                      string
		header                   string // a header the answer must have
	}{
		{"unknown model", "POST", PathMessages, `{"model":"nope","max_tokens":16,"messages":[]}`, 404, typeInvalidRequest, ""},
		{"unknown model's token count", "POST", pathCountTokens, `{"model":"nope","messages":[]}`, 404, typeInvalidRequest, ""},
		{"no model", "POST", PathMessages, `{"max_tokens":16,"messages":[]}`, 400, typeInvalidRequest, ""},
		{"token count without a model", "POST", pathCountTokens, `{"messages":[]}`, 400, typeInvalidRequest, ""},
		{"bad JSON", "POST", PathMessages, `{"model":`, 400, typeInvalidRequest, ""},
		{"oversized body", "POST", PathMessages, anthropicBody(strings.Repeat("x", 2000), ""), 413, typeInvalidRequest, ""},
		{"wrong method", "GET", PathMessages, "", 405, typeInvalidRequest, "Allow"},
		{"wrong method for the token count", "GET", pathCountTokens, "", 405, typeInvalidRequest, "Allow"},
	}
	do := func(t *testing.T, method, url, body string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp, data
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := do(t, tt.method, f.url+tt.path, tt.body)
			e := decodeAnthropicError(t, body)
			if resp.StatusCode != tt.status || e.Type != tt.typ || resp.Header.Get("Content-Type") != "application/json" ||
				(tt.header != "" && resp.Header.Get(tt.header) == "") {
				t.Errorf("%s %s: %d %s %v, want %d type %s with %s", tt.method, tt.path, resp.StatusCode, body, resp.Header,
					tt.status, tt.typ, tt.header)
			}
			// The same refusal of a chat completion keeps OpenAI's shape.
			chat, body := do(t, tt.method, f.url+PathChatCompletions, tt.body)
			if o := decodeError(t, body); chat.StatusCode != tt.status || o.Type != tt.typ || o.Code == "" {
				t.Errorf("%s %s: %d %s, want %d type %s", tt.method, PathChatCompletions, chat.StatusCode, body, tt.status, tt.typ)
			}
		})
	}
	if got := len(f.engine("a").received()); got != 0 {
		t.Errorf("the engine received %d requests, want none", got)
	}
}
