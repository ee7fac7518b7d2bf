package simserver

import (
	"net/http"
	"testing"

	"github.com/kvgate/kvgate/pkg/sim"
)

// postToRank posts body to path asking for the data-parallel rank rank
// ("" for none).
func (ts *testServer) postToRank(t *testing.T, path, body, rank string) (int, []byte) {
	t.Helper()
	var header map[string]string
	if rank != "" {
		header = map[string]string{"x-data-parallel-rank": rank}
	}
	return ts.send(t, http.MethodPost, path, body, header)
}

// TestARequestRunsOnTheDataParallelRankItsHeaderNames runs a prompt on
// rank 1 of two, then again on rank 1 and on rank 0, as vLLM runs a request whose
// X-data-parallel-rank header names a rank: only rank 1 finds it cached.
// A rank that is no integer or no rank of the server is refused.
func TestARequestRunsOnTheDataParallelRankItsHeaderNames(t *testing.T) {
	ts := startServer(t, 2, nil)
	prompt := "The KV cache of this prompt is kept by the second data-parallel rank alone."
	body := `{"model":"` + testModel + `","prompt":"` + prompt + `","max_tokens":2}`
	cachedOn := func(rank string) int {
		t.Helper()
		status, out := ts.postToRank(t, "/v1/completions", body, rank)
		if status != http.StatusOK {
			t.Fatalf("rank %s: %d %s", rank, status, out)
		}
		return decode[completionResp](t, out).Usage.PromptTokensDetails.CachedTokens
	}
	if got := cachedOn("1"); got != 0 {
		t.Fatalf("first request: %d tokens cached, want none", got)
	}
	want := (len(sim.Tokenizer{}.Encode(prompt, true)) - 1) / testBS * testBS
	for range 3 {
		if got := cachedOn("1"); got != want {
			t.Errorf("rank 1 found %d tokens cached, want %d", got, want)
		}
	}
	if got := cachedOn("0"); got != 0 {
		t.Errorf("rank 0 found %d tokens cached; only rank 1 ran the prompt", got)
	}
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		req := body
		if path == "/v1/chat/completions" {
			req = `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}]}`
		}
		for _, bad := range []string{"2", "-1", "one"} {
			if status, out := ts.postToRank(t, path, req, bad); status != http.StatusBadRequest {
				t.Errorf("%s with rank %q: %d %s; want 400", path, bad, status, out)
			}
		}
	}
}
