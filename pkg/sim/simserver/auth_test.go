package simserver

import (
	"net/http"
	"strings"
	"testing"
)

func TestAPIKeysGuardEveryPathButHealthAndMetricsAsVLLMDoes(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) { c.APIKeys = []string{"k1", "k2"} })
	tokenize := `{"model":"` + testModel + `","prompt":"hi"}`
	messages := `{"model":"` + testModel + `","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		method, path, body, authorization string
		want                              int
	}{
		{"GET", "/health", "", "", http.StatusOK},
		{"GET", "/metrics", "", "", http.StatusOK},
		{"GET", "/v1/models", "", "", http.StatusUnauthorized},
		{"GET", "/v1/models", "", "Bearer wrong", http.StatusUnauthorized},
		{"GET", "/v1/models", "", "Basic k1", http.StatusUnauthorized},
		{"GET", "/v1/models", "", "k1", http.StatusUnauthorized},
		{"GET", "/v1/models", "", "Bearer k1", http.StatusOK},
		{"GET", "/v1/models", "", "bearer k2", http.StatusOK},
		{"POST", "/tokenize", tokenize, "", http.StatusUnauthorized},
		{"POST", "/tokenize", tokenize, "Bearer k2", http.StatusOK},
		{"POST", "/v1/completions", `{"prompt":"hi","max_tokens":1}`, "", http.StatusUnauthorized},
		{"POST", "/v1/completions", `{"prompt":"hi","max_tokens":1}`, "Bearer k1", http.StatusOK},
		{"POST", "/v1/messages", messages, "", http.StatusUnauthorized},
		{"POST", "/v1/messages", messages, "Bearer k1", http.StatusOK},
		{"POST", "/v1/messages/count_tokens", messages, "", http.StatusUnauthorized},
		{"POST", "/v1/messages/count_tokens", messages, "Bearer k2", http.StatusOK},
		{"OPTIONS", "/v1/models", "", "", http.StatusMethodNotAllowed},
	} {
		req, err := http.NewRequest(tc.method, ts.url+tc.path, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if tc.authorization != "" {
			req.Header.Set("Authorization", tc.authorization)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s with Authorization %q: HTTP %d, want %d", tc.method, tc.path, tc.authorization, resp.StatusCode, tc.want)
		}
	}
}

func TestNoAPIKeysLeaveEveryPathOpen(t *testing.T) {
	ts := startServer(t, 1, nil)
	resp, err := http.Get(ts.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/models without a key on a server without keys: HTTP %d", resp.StatusCode)
	}
}
