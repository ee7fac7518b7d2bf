package gateway

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// sendChat posts a chat completion of prompt for model with the routing
// strategy and returns the pod that served it.
func (f *testFleet) sendChat(model, prompt, strategy string) string {
	f.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": prompt}}})
	resp, data := post(f.t, f.url+"/v1/chat/completions", string(body), map[string]string{"routing-strategy": strategy})
	if resp.StatusCode != http.StatusOK {
		f.t.Fatalf("chat for %s with %s: %d %s", model, strategy, resp.StatusCode, data)
	}
	return resp.Header.Get(HeaderTargetPodName)
}

// matched returns each candidate pod's matched blocks in m.
func matched(m matchResponse) map[string]int {
	out := map[string]int{}
	for _, p := range m.Pods {
		out[p.Pod] = p.MatchedBlocks
	}
	return out
}

// waitAdapterPods waits until the pods serving adapter sql-lora are want.
func (f *testFleet) waitAdapterPods(want ...string) {
	f.t.Helper()
	testsupport.EventuallyWhy(f.t, "sql-lora to be served by "+strings.Join(want, ", "), func() (string, bool) {
		got := matched(f.matchAdapter("sql-lora", []uint32{1}))
		var pods []string
		for p := range got {
			pods = append(pods, p)
		}
		slices.Sort(pods)
		return strings.Join(pods, ", "), slices.Equal(pods, want)
	})
}

func TestAdapterRequestsGoToThePodsServingItByTheAdaptersBlocks(t *testing.T) {
	// a declares sql-lora in the endpoints file; b will load it at runtime;
	// c serves the base model only.
	f := startFleet(t, []string{"a", "b", "c"}, fleetOptions{
		env:     map[string]string{"KVGATE_ADAPTER_REFRESH_INTERVAL": "20ms"},
		declare: map[string][]string{"a": {"sql-lora"}},
	})
	a, b, c := f.engine("a"), f.engine("b"), f.engine("c")
	f.waitAdapterPods("static/a")
	b.setAdapters("sql-lora")
	f.waitAdapterPods("static/a", "static/b")
	if status, body := get(t, f.url+"/v1/models"); status != http.StatusOK || !strings.Contains(body, `"id":"sql-lora"`) {
		t.Fatalf("/v1/models: %d %s; want sql-lora listed", status, body)
	}

	// b holds the prompt's blocks computed with the adapter; a and c hold
	// the same tokens' blocks of the base model. The chat template of the
	// test engines appends a newline to each message.
	prompt := sharedPrompt
	tokens := toyTokens(prompt + "\n")
	hashes := b.storeAdapterPrompt("sql-lora", tokens)
	blocks := len(hashes)
	a.storePrompt(tokens)
	c.storePrompt(tokens)
	testsupport.EventuallyWhy(t, "the index to hold the adapter's and the base model's blocks", func() (string, bool) {
		lora, base := matched(f.matchAdapter("sql-lora", tokens)), matched(f.match(tokens))
		return mustJSON([]any{lora, base}), lora["static/b"] == blocks && base["static/a"] == blocks && base["static/c"] == blocks
	})
	if lora, base := matched(f.matchAdapter("sql-lora", tokens)), matched(f.match(tokens)); lora["static/a"] != 0 || base["static/b"] != 0 {
		t.Fatalf("base-model blocks match the adapter (%v) or adapter blocks the base model (%v)", lora, base)
	}

	// Requests for the adapter are tokenized by a pod serving it, and go to
	// the pod holding the prompt's adapter blocks.
	for range 3 {
		if pod := f.sendChat("sql-lora", prompt, "kv-aware"); pod != "static/b" {
			t.Fatalf("an adapter request whose prompt b holds went to %q", pod)
		}
	}
	if hits := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="prefix_hit"}`); hits != 3 {
		t.Errorf("kv-aware prefix hits = %v, want 3", hits)
	}
	if tokenized := append(a.tokenizedModels(), b.tokenizedModels()...); !slices.Contains(tokenized, "sql-lora") {
		t.Errorf("no /tokenize call named the adapter: %q", tokenized)
	}
	if got := c.tokenizedModels(); slices.Contains(got, "sql-lora") {
		t.Errorf("the adapter's prompt was tokenized by c, which does not serve it")
	}
	for _, r := range b.received() {
		if !strings.Contains(string(r.body), `"model":"sql-lora"`) {
			t.Errorf("b received %s, not the adapter request as sent", r.body)
		}
	}
	// A request for the base model goes to a pod holding its base-model
	// blocks, never to b.
	if pod := f.sendChat("llama", prompt, "kv-aware"); pod != "static/a" && pod != "static/c" {
		t.Fatalf("a base-model request whose prompt a and c hold went to %q", pod)
	}

	// Without a prefix to follow, adapter requests spread over a and b,
	// never c.
	b.removeBlocks(hashes)
	testsupport.EventuallyWhy(t, "b's adapter blocks to go", func() (string, bool) {
		m := matched(f.matchAdapter("sql-lora", tokens))
		return mustJSON(m), m["static/b"] == 0
	})
	served := map[string]int{}
	for range 20 {
		served[f.sendChat("sql-lora", prompt+" again", "least-request")]++
	}
	if served["static/c"] != 0 || served["static/a"] == 0 || served["static/b"] == 0 {
		t.Errorf("20 adapter requests went to %v; want a and b, never c", served)
	}

	// b unloads the adapter: requests for it go to a alone.
	b.setAdapters()
	f.waitAdapterPods("static/a")
	for range 3 {
		if pod := f.sendChat("sql-lora", prompt, "kv-aware"); pod != "static/a" {
			t.Fatalf("after b unloaded the adapter a request for it went to %q", pod)
		}
	}
}
