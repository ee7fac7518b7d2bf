package gateway

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/sim/simtest"
)

// startCORSSim runs a simulated vLLM engine serving llama with the CORS
// policy cors (vLLM's default when nil) and, when keys are given, vLLM's
// API-key check, and returns its URL and its pod, ready when ready is set.
func startCORSSim(t *testing.T, cors *simserver.CORS, ready bool, keys ...string) (string, *v1.Pod) {
	t.Helper()
	e := simtest.Serve(t, simserver.Config{Model: "llama", CORS: cors, APIKeys: keys,
		Ranks: []simserver.Rank{{Engine: sim.EngineConfig{BlockSize: 16, NumGPUBlocks: 4096}}}})
	condition := v1.ConditionTrue
	if !ready {
		condition = v1.ConditionFalse
	}
	return e.URL, &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cors", UID: k8stypes.UID("uid-cors"),
			Labels: map[string]string{endpoint.ModelNameLabel: "llama", endpoint.ModelPortLabel: strconv.Itoa(e.Port)}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1",
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: condition}}},
	}
}

// answer is what a client gets of a response.
type answer struct {
	status int
	header http.Header
	body   string
}

// options sends an OPTIONS request with headers to url.
func options(t *testing.T, url string, headers map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodOptions, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	// The date is the only field two answers may differ by.
	resp.Header.Del("Date")
	return answer{resp.StatusCode, resp.Header, string(body)}
}

func preflight(origin string, headers string) map[string]string {
	h := map[string]string{"Origin": origin, "Access-Control-Request-Method": "POST"}
	if headers != "" {
		h["Access-Control-Request-Headers"] = headers
	}
	return h
}

func TestCORSPreflightsThroughTheGatewayGetTheEnginesOwnAnswer(t *testing.T) {
	for _, tc := range []struct {
		name string
		cors *simserver.CORS
		keys []string
		// request's Origin and Access-Control-Request-Headers, and the
		// engine's status
		origin, headers string
		want            int
	}{
		{name: "default policy", origin: "https://app.example", headers: "authorization, content-type", want: http.StatusOK},
		{name: "engines requiring a key answer preflights without one", keys: []string{"k"},
			origin: "https://app.example", headers: "authorization", want: http.StatusOK},
		{name: "a listed origin", cors: &simserver.CORS{AllowedOrigins: []string{"https://app.example"},
			AllowedMethods: []string{"*"}, AllowedHeaders: []string{"*"}},
			origin: "https://app.example", want: http.StatusOK},
		{name: "another origin is refused", cors: &simserver.CORS{AllowedOrigins: []string{"https://app.example"},
			AllowedMethods: []string{"*"}, AllowedHeaders: []string{"*"}},
			origin: "https://evil.example", want: http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engine, pod := startCORSSim(t, tc.cors, true, tc.keys...)
			f := serveSims(t, staticPods{pod}, nil)
			for _, path := range []string{PathChatCompletions, PathCompletions, PathMessages, PathResponses, PathModels, "/v1/embeddings", "/tokenize"} {
				direct := options(t, engine+path, preflight(tc.origin, tc.headers))
				if direct.status != tc.want {
					t.Fatalf("%s: the engine answers %d %q, want %d", path, direct.status, direct.body, tc.want)
				}
				through := options(t, f.url+path, preflight(tc.origin, tc.headers))
				if through.status != direct.status || through.body != direct.body {
					t.Errorf("%s: through the gateway %d %q; the engine answers %d %q", path, through.status, through.body,
						direct.status, direct.body)
				}
				if !maps.EqualFunc(through.header, direct.header, slices.Equal) {
					t.Errorf("%s: through the gateway headers %v; the engine's %v", path, through.header, direct.header)
				}
			}
			if n := f.metric(`kvgate_gateway_requests_total{algorithm="",code="` + strconv.Itoa(tc.want) +
				`",endpoint="/v1/chat/completions",model=""}`); n != 1 {
				t.Errorf("preflights to /v1/chat/completions counted %v times, want 1", n)
			}
		})
	}
}

func TestOptionsRequestsThatAreNoPreflightAreStillRefused(t *testing.T) {
	_, pod := startCORSSim(t, nil, true)
	f := serveSims(t, staticPods{pod}, nil)
	for _, tc := range []struct {
		path    string
		headers map[string]string
		allow   string
	}{
		{PathCompletions, nil, http.MethodPost},
		{PathChatCompletions, map[string]string{"Origin": "https://app.example"}, http.MethodPost},
		{"/v1/embeddings", map[string]string{"Access-Control-Request-Method": "POST"}, http.MethodPost},
		{PathModels, map[string]string{"Origin": "https://app.example"}, http.MethodGet},
	} {
		a := options(t, f.url+tc.path, tc.headers)
		if a.status != http.StatusMethodNotAllowed || a.header.Get("Allow") != tc.allow {
			t.Errorf("OPTIONS %s with %v: %d (Allow %q) %s, want 405 allowing %s", tc.path, tc.headers, a.status,
				a.header.Get("Allow"), a.body, tc.allow)
		}
	}
}

func TestCORSPreflightWithoutAReadyPodIsAnswered503(t *testing.T) {
	_, pod := startCORSSim(t, nil, false)
	f := serveSims(t, staticPods{pod}, nil)
	a := options(t, f.url+PathChatCompletions, preflight("https://app.example", ""))
	var e apiError
	if err := json.Unmarshal([]byte(a.body), &e); err != nil || a.status != http.StatusServiceUnavailable || e.Error.Code != codeNoReadyPod {
		t.Fatalf("preflight without a ready pod: %d %s, want 503 %s", a.status, a.body, codeNoReadyPod)
	}
	a = options(t, f.url+PathMessages, preflight("https://app.example", ""))
	if e := decodeAnthropicError(t, []byte(a.body)); a.status != http.StatusServiceUnavailable || e.Type != typeServiceUnavailable {
		t.Fatalf("Messages preflight without a ready pod: %d %s, want 503 %s in Anthropic's shape", a.status, a.body, typeServiceUnavailable)
	}
}

func TestCORSPreflightAnswersAreRelayedUpToTheirBound(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	for _, tc := range []struct {
		size, want int
	}{{maxPreflightBodyBytes, http.StatusOK}, {maxPreflightBodyBytes + 1, http.StatusBadGateway}} {
		f.engine("a").setAnswer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
			w.Header().Set("Access-Control-Allow-Origin", "*")
			_, _ = w.Write([]byte(strings.Repeat("x", tc.size)))
		})
		headers := preflight("https://app.example", "")
		headers["Connection"] = "X-Hop"
		headers["X-Hop"] = "dropped"
		a := options(t, f.url+PathChatCompletions, headers)
		if a.status != tc.want {
			t.Fatalf("an answer of %d bytes: %d %.80s, want %d", tc.size, a.status, a.body, tc.want)
		}
		if tc.want == http.StatusOK && (len(a.body) != tc.size || a.header.Get("Access-Control-Allow-Origin") != "*") {
			t.Errorf("an answer of %d bytes relayed as %d bytes, headers %v", tc.size, len(a.body), a.header)
		}
	}
	got := f.engine("a").received()
	if len(got) != 2 {
		t.Fatalf("the engine received %d preflights, want 2", len(got))
	}
	h := got[0].header
	if h.Get("Origin") != "https://app.example" || h.Get("Access-Control-Request-Method") != "POST" ||
		h.Get("X-Hop") != "" || h.Get("X-Forwarded-For") != "127.0.0.1" {
		t.Errorf("the engine received the preflight's headers %v: want Origin and Access-Control-Request-Method, "+
			"X-Forwarded-For 127.0.0.1, no hop-by-hop X-Hop", h)
	}
}
