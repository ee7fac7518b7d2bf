package simserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/sim"
)

// openStream starts a streaming completion and returns once its first
// token arrived, with a cancel func that hangs up.
func (ts *testServer) openStream(t *testing.T, body map[string]any) (hangUp func()) {
	t.Helper()
	body["stream"] = true
	data, _ := json.Marshal(body)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/v1/completions", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first line %q: %v", line, err)
	}
	return func() {
		cancel()
		resp.Body.Close()
	}
}

func TestResetPrefixCacheIsRefusedUntilTheClientHangsUp(t *testing.T) {
	slow := func(c *Config) {
		c.Ranks[0].Engine.Latency.StepOverhead = 2 * time.Millisecond
	}
	ts := startServer(t, 1, slow)
	hangUp := ts.openStream(t, map[string]any{"prompt": "a long answer holds its blocks", "max_tokens": 400})

	status, body := ts.post(t, "/reset_prefix_cache", nil)
	if status != http.StatusConflict || !strings.Contains(string(body), "in use") {
		t.Fatalf("reset during a request: %d %s, want 409 naming the blocks in use", status, body)
	}
	hangUp()
	testsupport.Eventually(t, "the hung-up request to be aborted", func() bool {
		q := ts.queue(0)
		return q.Running+q.Waiting == 0
	})
	families := ts.scrape(t)
	if v := metricValue(t, families, "vllm:request_success_total", map[string]string{"finished_reason": "abort"}); v != 1 {
		t.Errorf("aborted requests counted %v, want 1", v)
	}
	if status, body := ts.post(t, "/reset_prefix_cache", nil); status != http.StatusOK {
		t.Fatalf("reset when idle: %d %s", status, body)
	}
	batches := ts.sinks[0].snapshot()
	b := batches[len(batches)-1]
	if len(b.Events) != 1 || b.Events[0].GetType() != kvevent.EventTypeAllCleared || b.DataParallelRank != 0 {
		t.Errorf("last batch %+v, want AllBlocksCleared from rank 0", b)
	}
}

func TestRequestsSpreadOverDataParallelRanks(t *testing.T) {
	slow := func(c *Config) {
		for i := range c.Ranks {
			c.Ranks[i].Engine.Latency.StepOverhead = 2 * time.Millisecond
		}
	}
	ts := startServer(t, 2, slow)
	// A long request keeps rank 0 busy, so the balancer sends the next one
	// to rank 1.
	hangUp := ts.openStream(t, map[string]any{"prompt": "keep rank zero busy", "max_tokens": 400})
	defer hangUp()
	status, body := ts.post(t, "/v1/completions", map[string]any{"prompt": "this one lands on rank one", "max_tokens": 2})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	for rank, sink := range ts.sinks {
		batches := sink.snapshot()
		if len(batches) == 0 {
			t.Fatalf("rank %d published nothing", rank)
		}
		for _, b := range batches {
			if b.DataParallelRank != rank {
				t.Errorf("rank %d published a batch stamped rank %d", rank, b.DataParallelRank)
			}
		}
	}
	want := sim.Tokenizer{}.Encode("this one lands on rank one", true)
	if got := ts.sinks[1].storedTokens(); len(got) == 0 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("rank 1 stored %v, want the second prompt %v", got, want)
	}
}

func TestStoppingTheEnginesFailsOpenRequests(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) { c.Ranks[0].Engine.Latency.StepOverhead = 50 * time.Millisecond })
	var wg sync.WaitGroup
	var status int
	var body []byte
	wg.Go(func() {
		status, body = ts.post(t, "/v1/completions", map[string]any{"prompt": "never finishes", "max_tokens": 400})
	})
	testsupport.Eventually(t, "the request to start", func() bool { return ts.queue(0).Running == 1 })
	ts.runners[0].stop()
	wg.Wait()
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), errStopped.Error()) {
		t.Errorf("open request got %d %s, want 503 %q", status, body, errStopped)
	}
	if status, _ := ts.post(t, "/v1/completions", map[string]any{"prompt": "x"}); status != http.StatusServiceUnavailable {
		t.Errorf("request after stop got %d, want 503", status)
	}
}
