package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	v1 "k8s.io/api/core/v1"
)

// sharedPrompt is 22 whole blocks of the test engines' tokenizer.
var sharedPrompt = strings.Repeat("the quick brown fox jumps over the lazy dog ", 8)

// send posts a completion of prompt with the routing strategy and returns
// the pod that served it.
func (f *testFleet) send(prompt, strategy string) string {
	f.t.Helper()
	pod, err := f.trySend(prompt, strategy)
	if err != nil {
		f.t.Fatal(err)
	}
	return pod
}

// trySend is send for goroutines other than the test's.
func (f *testFleet) trySend(prompt, strategy string) (string, error) {
	resp, body, err := tryPost(f.url+"/v1/completions", completion(prompt, ""), map[string]string{"routing-strategy": strategy})
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("completion with %s: %d %s", strategy, resp.StatusCode, body)
	}
	return resp.Header.Get(HeaderTargetPodName), nil
}

func TestRequestGoesToThePodHoldingItsPrefixUntilItsBlocksAreRemoved(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	tokens := toyTokens(sharedPrompt)
	b := f.engine("b")
	hashes := b.storePrompt(tokens)
	f.waitMatched(tokens, "b", len(hashes))

	for _, strategy := range []string{"kv-aware", "prefix-cache"} {
		for range 3 {
			if pod := f.send(sharedPrompt, strategy); pod != "static/b" {
				t.Fatalf("%s sent a request whose whole prompt b holds to %q", strategy, pod)
			}
		}
	}
	if hits := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="prefix_hit"}`); hits != 3 {
		t.Errorf("kv-aware prefix hits = %v, want 3", hits)
	}
	if got := len(b.received()); got != 6 {
		t.Errorf("b received %d requests, want 6", got)
	}

	b.removeBlocks(hashes)
	f.waitMatched(tokens, "b", 0)
	served := map[string]int{}
	for range 20 {
		served[f.send(sharedPrompt, "kv-aware")]++
	}
	if served["static/a"] == 0 || served["static/b"] == 0 {
		t.Errorf("after b evicted the prompt, 20 requests went to %v; want both idle pods used", served)
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="load_fallback"}`); n != 20 {
		t.Errorf("kv-aware load fallbacks = %v, want 20", n)
	}
}

func TestKVAwareLeavesThePrefixHolderWhenItIsOverloaded(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	tokens := toyTokens(sharedPrompt)
	b := f.engine("b")
	f.waitMatched(tokens, "b", len(b.storePrompt(tokens)))
	if pod := f.send(sharedPrompt, "kv-aware"); pod != "static/b" {
		t.Fatalf("before b is loaded the request went to %q, want b", pod)
	}

	// b's engine now decodes a large batch: half a second per step, well
	// above the time a to computes the whole prompt.
	b.setLoad(func(l *engineLoad) { l.running, l.waiting, l.tpotSeconds = 200, 30, 0.5 })
	testsupport.EventuallyWhy(t, "the Store to scrape b's load", func() (string, bool) {
		m := f.match(tokens)
		for _, c := range m.Decisions[0].Candidates {
			if c.Pod == "static/b" {
				return mustJSON(c), c.AvgTPOTSeconds == 0.5
			}
		}
		return mustJSON(m), false
	})
	if pod := f.send(sharedPrompt, "kv-aware"); pod != "static/a" {
		t.Fatalf("with b overloaded the request went to %q, want a", pod)
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="load_over_prefix"}`); n != 1 {
		t.Errorf("kv-aware load_over_prefix decisions = %v, want 1", n)
	}
}

func TestPrefixCacheImbalanceGuardCountsTheGatewaysRequestsInFlight(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	tokens := toyTokens(sharedPrompt)
	b := f.engine("b")
	f.waitMatched(tokens, "b", len(b.storePrompt(tokens)))
	release := make(chan struct{})
	b.setAnswer(func(w http.ResponseWriter, r *http.Request, body []byte) {
		<-release
		defaultAnswer(w, r, body)
	})

	// Nine requests held by b: AIBrix's guard trips when the running
	// requests of two pods differ by more than eight.
	type sent struct {
		pod string
		err error
	}
	var wg sync.WaitGroup
	pods := make(chan sent, 9)
	for i := range 9 {
		wg.Go(func() {
			pod, err := f.trySend(sharedPrompt, "prefix-cache")
			pods <- sent{pod, err}
		})
		testsupport.EventuallyWhy(t, "b to hold the requests", func() (string, bool) {
			n := len(b.received())
			return "", n == i+1
		})
	}
	if pod := f.send(sharedPrompt, "prefix-cache"); pod != "static/a" {
		t.Errorf("with nine requests in flight on b, the tenth went to %q, want a", pod)
	}
	close(release)
	wg.Wait()
	close(pods)
	for p := range pods {
		if p.err != nil {
			t.Fatal(p.err)
		}
		if p.pod != "static/b" {
			t.Errorf("one of the first nine requests went to %q, want b", p.pod)
		}
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="prefix-cache",outcome="imbalance_guard"}`); n != 1 {
		t.Errorf("imbalance_guard decisions = %v, want 1", n)
	}
}

func TestTokenizationFailureRoutesOnLoadAndIsCounted(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	tokens := toyTokens(sharedPrompt)
	f.waitMatched(tokens, "b", len(f.engine("b").storePrompt(tokens)))
	for _, e := range f.engines {
		e.mu.Lock()
		e.tokenizeStatus = http.StatusInternalServerError
		e.mu.Unlock()
	}
	for range 4 {
		f.send(sharedPrompt+" once more", "kv-aware")
	}
	if n := f.metric(`kvgate_gateway_tokenization_failures_total{reason="status"}`); n != 4 {
		t.Errorf("tokenization failures = %v, want 4", n)
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="no_tokens"}`); n != 4 {
		t.Errorf("kv-aware no_tokens decisions = %v, want 4", n)
	}
}

// TestAModelLabelWithSpacesServesTheTrimmedModel runs a pod labelled
// "llama " beside one labelled "llama". The KV event manager indexes the
// first one's blocks under "llama"; the Store must serve it under the same
// name, and routing must match it there, so that a request for llama goes
// to the pod holding its prefix.
func TestAModelLabelWithSpacesServesTheTrimmedModel(t *testing.T) {
	a, b := newTestEngine(t, "a"), newTestEngine(t, "b")
	pods := []*v1.Pod{a.pod("llama "), b.pod("llama")}
	src := &podsSource{pods: pods, release: make(chan struct{})}
	close(src.release)
	cfg := loadTestConfig(t, map[string]string{"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "20"})
	cfg.PodSource = src
	f := &testFleet{t: t, engines: []*testEngine{a, b}}
	f.serve(cfg)
	f.waitReady()
	f.waitFollowed("ns/a")
	f.waitFollowed("ns/b")
	if status, list := get(t, f.url+"/v1/models"); status != http.StatusOK || len(listedModels(t, []byte(list))) != 1 ||
		listedModels(t, []byte(list))[0]["id"] != "llama" {
		t.Fatalf("/v1/models = %d %s; want llama, once", status, list)
	}

	tokens := toyTokens(sharedPrompt)
	blocks := len(a.storePrompt(tokens))
	testsupport.EventuallyWhy(t, "the index to hold a's blocks under llama", func() (string, bool) {
		for _, p := range f.match(tokens).Pods {
			if p.Pod == "ns/a" {
				return mustJSON(p), p.MatchedBlocks == blocks
			}
		}
		return "a is not a candidate for llama", false
	})
	for range 3 {
		resp, body := post(t, f.url+"/v1/completions", completion(sharedPrompt, ""), map[string]string{"routing-strategy": "kv-aware"})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "ns/a" {
			t.Fatalf("completion: %d from %q: %s; want a, which holds the prompt", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), body)
		}
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="prefix_hit"}`); n != 3 {
		t.Errorf("kv-aware prefix hits = %v, want 3", n)
	}
}
