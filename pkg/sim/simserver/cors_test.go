package simserver

import (
	"io"
	"net/http"
	"testing"
)

// do sends a request with headers to the server and returns its status,
// headers and body.
func (ts *testServer) do(t *testing.T, method, path string, headers map[string]string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, ts.url+path, nil)
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
	return resp.StatusCode, resp.Header, string(body)
}

const allMethods = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"

func TestCORSPreflightsAreAnsweredAsVLLMsCORSMiddlewareAnswersThem(t *testing.T) {
	restricted := &CORS{AllowedOrigins: []string{"https://app.example"}, AllowedMethods: []string{"POST"},
		AllowedHeaders: []string{"X-Custom"}}
	for _, tc := range []struct {
		name    string
		cors    *CORS
		keys    []string
		path    string
		headers map[string]string
		status  int
		body    string
		want    map[string]string // "" for a header that must be absent
	}{{
		name: "default policy allows everything and echoes the requested headers",
		path: "/v1/chat/completions",
		headers: map[string]string{"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
			"Access-Control-Request-Headers": "authorization, content-type"},
		status: http.StatusOK, body: "OK",
		want: map[string]string{"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": allMethods,
			"Access-Control-Allow-Headers": "authorization, content-type", "Access-Control-Max-Age": "600",
			"Access-Control-Allow-Credentials": "", "Vary": "", "Content-Type": "text/plain; charset=utf-8"},
	}, {
		name:    "any path is answered, even one without an endpoint",
		path:    "/nowhere",
		headers: map[string]string{"Origin": "https://app.example", "Access-Control-Request-Method": "GET"},
		status:  http.StatusOK, body: "OK",
		want: map[string]string{"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Headers": ""},
	}, {
		name:    "a preflight needs no API key",
		keys:    []string{"k"},
		path:    "/v1/completions",
		headers: map[string]string{"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
		status:  http.StatusOK, body: "OK",
		want: map[string]string{"Access-Control-Allow-Origin": "*"},
	}, {
		name:    "credentials make the allowed origin explicit",
		cors:    &CORS{AllowedOrigins: []string{"*"}, AllowedMethods: []string{"*"}, AllowedHeaders: []string{"*"}, AllowCredentials: true},
		path:    "/v1/completions",
		headers: map[string]string{"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
		status:  http.StatusOK, body: "OK",
		want: map[string]string{"Access-Control-Allow-Origin": "https://app.example", "Access-Control-Allow-Credentials": "true",
			"Vary": "Origin"},
	}, {
		name:    "a listed origin is named",
		cors:    restricted,
		path:    "/v1/completions",
		headers: map[string]string{"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
		status:  http.StatusOK, body: "OK",
		want: map[string]string{"Access-Control-Allow-Origin": "https://app.example", "Vary": "Origin",
			"Access-Control-Allow-Methods": "POST",
			"Access-Control-Allow-Headers": "Accept, Accept-Language, Content-Language, Content-Type, X-Custom"},
	}, {
		name:    "another origin is refused",
		cors:    restricted,
		path:    "/v1/completions",
		headers: map[string]string{"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
		status:  http.StatusBadRequest, body: "Disallowed CORS origin",
		want: map[string]string{"Access-Control-Allow-Origin": "", "Vary": "Origin"},
	}, {
		name: "an unlisted method and header are refused",
		cors: restricted,
		path: "/v1/completions",
		headers: map[string]string{"Origin": "https://app.example", "Access-Control-Request-Method": "GET",
			"Access-Control-Request-Headers": "x-custom, x-other"},
		status: http.StatusBadRequest, body: "Disallowed CORS method, headers",
		want: map[string]string{"Access-Control-Allow-Origin": "https://app.example"},
	}, {
		name: "listed and safelisted headers are allowed in any case",
		cors: restricted,
		path: "/v1/completions",
		headers: map[string]string{"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
			"Access-Control-Request-Headers": "X-CUSTOM,content-type"},
		status: http.StatusOK, body: "OK",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, 1, func(c *Config) { c.CORS, c.APIKeys = tc.cors, tc.keys })
			status, h, body := ts.do(t, http.MethodOptions, tc.path, tc.headers)
			if status != tc.status || body != tc.body {
				t.Fatalf("HTTP %d %q, want %d %q", status, body, tc.status, tc.body)
			}
			for k, v := range tc.want {
				if got := h.Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestResponsesToRequestsWithAnOriginAreMarkedAsVLLMMarksThem(t *testing.T) {
	restricted := &CORS{AllowedOrigins: []string{"https://app.example"}, AllowedMethods: []string{"*"}, AllowedHeaders: []string{"*"}}
	for _, tc := range []struct {
		name       string
		method     string // GET when empty
		cors       *CORS
		keys       []string
		headers    map[string]string
		status     int
		origin     string
		varyOrigin bool
	}{
		{name: "no origin, no mark", headers: map[string]string{}, status: http.StatusOK},
		{name: "default policy: any origin", headers: map[string]string{"Origin": "https://a.example"}, status: http.StatusOK, origin: "*"},
		{name: "default policy with cookies: the origin", headers: map[string]string{"Origin": "https://a.example", "Cookie": "c=1"},
			status: http.StatusOK, origin: "https://a.example", varyOrigin: true},
		{name: "a listed origin", cors: restricted, headers: map[string]string{"Origin": "https://app.example"},
			status: http.StatusOK, origin: "https://app.example", varyOrigin: true},
		{name: "another origin", cors: restricted, headers: map[string]string{"Origin": "https://evil.example"}, status: http.StatusOK},
		{name: "refused for its key", keys: []string{"k"}, headers: map[string]string{"Origin": "https://a.example"},
			status: http.StatusUnauthorized},
		{name: "a plain OPTIONS is no preflight", method: http.MethodOptions, headers: map[string]string{"Origin": "https://a.example"},
			status: http.StatusMethodNotAllowed, origin: "*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, 1, func(c *Config) { c.CORS, c.APIKeys = tc.cors, tc.keys })
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			status, h, _ := ts.do(t, method, "/v1/models", tc.headers)
			if status != tc.status {
				t.Fatalf("HTTP %d, want %d", status, tc.status)
			}
			if got := h.Get("Access-Control-Allow-Origin"); got != tc.origin {
				t.Errorf("Access-Control-Allow-Origin %q, want %q", got, tc.origin)
			}
			if got := h.Get("Vary") == "Origin"; got != tc.varyOrigin {
				t.Errorf("Vary %q, want Origin: %v", h.Get("Vary"), tc.varyOrigin)
			}
		})
	}
}
