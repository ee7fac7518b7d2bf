package tokenizer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
)

// startKeyedEngine serves a simulated vLLM for localModelName that, as
// vLLM with --api-key, refuses /tokenize without the key.
func startKeyedEngine(t testing.TB, key string) string {
	t.Helper()
	s, err := simserver.New(simserver.Config{Model: localModelName, APIKeys: []string{key},
		Ranks: []simserver.Rank{{Engine: sim.EngineConfig{NumGPUBlocks: 2048}}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestTokenizeSendsTheEngineAPIKeyToAnEngineThatRequiresOne(t *testing.T) {
	const key = "engine-s3cret"
	url := startKeyedEngine(t, key)
	body := `{"model":"` + localModelName + `","prompt":"hello there"}`
	for _, tc := range []struct {
		name   string
		apiKey string
		status int // of the failed call; 0 for success
	}{
		{"with the key", key, 0},
		{"without a key", "", http.StatusUnauthorized},
		{"with another key", "other", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk, _ := newTestTokenizer(t, Config{APIKey: tc.apiKey})
			ids, err := tk.TokenizeCompletion(context.Background(), url, completionRequest(t, body))
			if tc.status == 0 {
				if err != nil || len(ids) == 0 {
					t.Fatalf("TokenizeCompletion = %v, %v; want the prompt's ids", ids, err)
				}
				return
			}
			e := reasonOf(t, err)
			if e.Reason != ReasonStatus || e.StatusCode != tc.status {
				t.Fatalf("error %v: want %s with HTTP %d", err, ReasonStatus, tc.status)
			}
			if tc.apiKey != "" && strings.Contains(err.Error(), tc.apiKey) {
				t.Fatalf("error %q names the key", err)
			}
		})
	}
}

func TestNewRefusesAnAPIKeyAHeaderWouldAlterWithoutNamingIt(t *testing.T) {
	_, err := New(Config{APIKey: "s3cret\r\nX-Injected: 1"}, prometheus.NewRegistry())
	if err == nil || !strings.Contains(err.Error(), "APIKey") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("New with a key holding CR LF: error %v, want one naming APIKey and not the key", err)
	}
}
