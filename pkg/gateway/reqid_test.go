package gateway

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/types"
)

func TestRequestLogsShowTheClientsRequestIDBesideTheGateways(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{Verbosity: 4})
	cfg := loadTestConfig(t, map[string]string{
		"KVGATE_POD_DISCOVERY":                      "static",
		"KVGATE_STATIC_ENDPOINTS_FILE":              writeEndpoints(t, "endpoints: []\n"),
		"KVGATE_SHUTDOWN_TIMEOUT":                   "10s",
		"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false",
	})
	cfg.PodSource = startSims(t, 1, sim.LatencyModel{})
	cfg.Logger = logger
	f := &testFleet{t: t}
	f.serve(cfg)
	f.waitReady()

	long := strings.Repeat("x", types.MaxLoggedClientRequestIDBytes+10)
	for _, tc := range []struct{ sent, logged string }{
		{"client-7", `"clientRequestID"="client-7"`},
		{"client-8\tcaf\u00e9", `"clientRequestID"="client-8?caf??"`},
		{long, `"clientRequestID"="` + long[:types.MaxLoggedClientRequestIDBytes] + `"`},
	} {
		body := completion("hello", `,"max_tokens":2`)
		resp, data := post(t, f.url+"/v1/completions", body, map[string]string{"X-Request-Id": tc.sent})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %d %s", resp.StatusCode, data)
		}
		mu.Lock()
		var routed string
		for _, l := range lines {
			if strings.Contains(l, `"msg"="Routed request"`) && strings.Contains(l, tc.logged) {
				routed = l
			}
		}
		mu.Unlock()
		if routed == "" {
			t.Fatalf("no Routed request line with %s among:\n%s", tc.logged, strings.Join(lines, "\n"))
		}
		if !strings.Contains(routed, `"requestID"="kvgate-`) {
			t.Errorf("the line does not carry the gateway's own id: %s", routed)
		}
	}
}
