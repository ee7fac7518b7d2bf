package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/internal/testredis"
)

func TestRequestsAreTracedWithTheUsageOfTheirResponses(t *testing.T) {
	srv := testredis.Start(t)
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{
		"KVGATE_REDIS_ADDRESS": srv.Addr, "AIBRIX_GPU_OPTIMIZER_TRACING_FLAG": "true"}})
	// Whole: 352 prompt tokens (bucket round(10*log2(352)) = 85) and 3
	// output tokens (bucket 16).
	if pod := f.send(sharedPrompt, "random"); pod != "static/a" {
		t.Fatalf("served by %q", pod)
	}
	// Streamed without asking for usage: 64 prompt tokens (bucket 60).
	resp := openStream(t, f.url+"/v1/completions", completion(strings.Repeat("y", 64), `,"stream":true`))
	streamed, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(streamed), `"usage"`) {
		t.Errorf("the client received a usage chunk it did not ask for: %s", streamed)
	}
	// A request the engine fails has no usage to trace.
	f.engine("a").setAnswer(func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		http.Error(w, `{"error":{"message":"bad","type":"BadRequestError","code":400}}`, http.StatusBadRequest)
	})
	if r, body := post(t, f.url+"/v1/completions", completion("z", ""), nil); r.StatusCode != http.StatusBadRequest ||
		!strings.Contains(string(body), "BadRequestError") {
		t.Errorf("engine error relayed as %d %s", r.StatusCode, body)
	}
	if err := f.stop(); err != nil { // writes the traces of the window in progress
		t.Fatal(err)
	}

	rc := srv.NewClient(t)
	ctx := context.Background()
	keys, err := rc.Keys(ctx, "aibrix:llama_request_trace_*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("trace keys %v, %v", keys, err)
	}
	sum, traced := map[string]int{}, 0
	for _, k := range keys {
		var trace map[string]int
		data, err := rc.Get(ctx, k).Result()
		if err != nil || json.Unmarshal([]byte(data), &trace) != nil {
			t.Fatalf("trace %s = %q, %v", k, data, err)
		}
		for b, n := range trace {
			sum[b] += n
			if !strings.HasPrefix(b, "meta_") {
				traced += n
			}
		}
	}
	if sum["85:16"] != 1 || sum["60:16"] != 1 || traced != 2 || sum["meta_total_reqs"] != 3 {
		t.Errorf("traces add up to %v; want one request in 85:16, one in 60:16, none else traced, three arrived", sum)
	}
}
