package extproc

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/routing"
)

// warmRank has rank of engine e complete prompt, which stores the prompt's
// whole blocks in that rank's cache.
func warmRank(t *testing.T, e *simEngine, rank int, prompt string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+"/v1/completions", strings.NewReader(completionRequest(prompt, "").body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-data-parallel-rank", fmt.Sprint(rank))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("rank %d: completion: %d", rank, resp.StatusCode)
	}
}

// waitKVAwareRank waits until /debug/match says kv-aware names rank want
// of the one engine for prompt.
func (f *fixture) waitKVAwareRank(t *testing.T, prompt string, want int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": simModel, "prompt": prompt})
	testsupport.EventuallyWhy(t, fmt.Sprintf("kv-aware to name rank %d", want), func() (string, bool) {
		resp, err := http.Post(f.apiURL+"/debug/match", "application/json", strings.NewReader(string(body)))
		if err != nil {
			return err.Error(), false
		}
		defer resp.Body.Close()
		var m struct {
			Decisions []routing.Decision `json:"decisions"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			return err.Error(), false
		}
		for _, d := range m.Decisions {
			if d.Algorithm == routing.KVAware {
				return fmt.Sprintf("rank %d", d.DPRank), d.DPRank == want
			}
		}
		return "no kv-aware decision", false
	})
}

// TestTheHeaderMutationNamesTheRankHoldingThePrefix sends, in every body
// mode, a prompt whose prefix rank 1 of an engine of two data-parallel
// ranks holds: the request headers Envoy forwards name rank 1. A client's
// own rank header is forwarded as it came, and a prompt no rank holds gets
// none.
func TestTheHeaderMutationNamesTheRankHoldingThePrefix(t *testing.T) {
	f := start(t, 1, options{ranks: 2})
	e := f.engines[0]
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			prompt := strings.Repeat("The second rank alone computed this prompt in "+mode.name+" mode. ", 6)
			warmRank(t, e, 1, prompt)
			f.waitKVAwareRank(t, prompt, 1)
			x := f.envoy.start(t, mode, completionRequest(prompt+"And then?", ""))
			if got, ok := x.headers[headerDPRank]; !ok || got != "1" {
				t.Errorf("the forwarded headers carry %s %q (present %v), want 1", headerDPRank, got, ok)
			}
			x.forward(512)

			r := completionRequest(prompt+"Or else?", "")
			r.headers = map[string]string{"X-Data-Parallel-Rank": "0"}
			x = f.envoy.start(t, mode, r)
			if got := x.headers[headerDPRank]; got != "0" {
				t.Errorf("a client's rank 0 was forwarded as %q", got)
			}
			x.forward(512)

			x = f.envoy.start(t, mode, completionRequest("Nothing of this is cached anywhere, in "+mode.name+" mode.", ""))
			if got, ok := x.headers[headerDPRank]; ok {
				t.Errorf("a prompt no rank holds was forwarded with %s %q", headerDPRank, got)
			}
			x.forward(512)
		})
	}
}
