package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
	"github.com/kvgate/kvgate/pkg/routing"
)

func TestDebugKVCacheShowsBlocksAndStreamsPerPod(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	tokens := f.holdPrompt("b")
	v := f.kvcache()
	if !v.KVEventSync || len(v.Models) != 1 {
		t.Fatalf("kvcache = %s, want KV event sync and one model", mustJSON(v))
	}
	m := v.Models[0]
	blocks := len(tokens) / testBlockSize
	if m.Model != "llama" || m.BlockSize != testBlockSize || len(m.BlockSizes) != 1 || m.BlockSizes[0] != testBlockSize ||
		m.Entries != blocks || len(m.Pods) != 2 {
		t.Fatalf("model %s: want llama, block size %d, %d entries, 2 pods", mustJSON(m), testBlockSize, blocks)
	}
	a, b := m.Pods[0], m.Pods[1]
	if a.Pod != "static/a" || a.State != "followed" || len(a.Blocks) != 0 {
		t.Errorf("pod a = %s, want followed without blocks", mustJSON(a))
	}
	if b.Pod != "static/b" || b.State != "followed" || b.Blocks["GPU"] != blocks || len(b.Ranks) != 1 {
		t.Fatalf("pod b = %s, want followed with %d GPU blocks on one rank", mustJSON(b), blocks)
	}
	r := b.Ranks[0]
	if r.Rank != 0 || len(r.Lanes) != 1 || r.Lanes[0].Blocks != blocks || r.Lanes[0].BlockSize != testBlockSize || r.LastEventAgeSeconds == nil ||
		*r.LastEventAgeSeconds < 0 || *r.LastEventAgeSeconds > testsupport.WaitTimeout.Seconds() {
		t.Errorf("rank = %s, want rank 0, one GPU lane of %d blocks and a recent last event", mustJSON(r), blocks)
	}
	c := r.Client
	if c == nil || !c.Connected || c.LastSeq == nil || *c.LastSeq != 0 || c.Batches != 1 || c.PubEndpoint == "" {
		t.Errorf("client = %s, want connected, one batch, last seq 0", mustJSON(c))
	}
}

func TestDebugMatchShowsEveryPodsMatchAndEveryAlgorithm(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{})
	tokens := f.holdPrompt("b")
	blocks := len(tokens) / testBlockSize
	promptJSON, _ := json.Marshal(sharedPrompt)
	for _, body := range []string{
		`{"model":"llama","prompt":` + string(promptJSON) + `}`,
		`{"model":"llama","messages":[{"role":"user","content":` + string(promptJSON) + `}]}`,
		`{"model":"llama","tokens":` + mustJSON(tokens) + `}`,
	} {
		resp, data := post(t, f.url+"/debug/match", body, nil)
		var m matchResponse
		if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &m) != nil {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, data)
		}
		if m.PromptBlocks < blocks || m.BlockSize != testBlockSize || m.DefaultAlgorithm != routing.KVAware ||
			len(m.Decisions) != len(routing.Algorithms()) || len(m.Pods) != 2 {
			t.Fatalf("%s: %s", body, data)
		}
		if m.Pods[0].Pod != "static/a" || m.Pods[0].MatchedBlocks != 0 || m.Pods[1].Pod != "static/b" || m.Pods[1].MatchedBlocks != blocks {
			t.Errorf("%s: pods %s, want a 0 and b %d blocks", body, mustJSON(m.Pods), blocks)
		}
		for _, d := range m.Decisions {
			if (d.Algorithm == routing.KVAware || d.Algorithm == routing.PrefixCache) && d.PodKey != "static/b" {
				t.Errorf("%s: %s would choose %s, want b", body, d.Algorithm, d.PodKey)
			}
		}
	}
	// Explaining routes nothing.
	if n := len(f.engine("a").received()) + len(f.engine("b").received()); n != 0 {
		t.Errorf("engines received %d requests from /debug/match", n)
	}
}

func TestDebugMatchRejectsBadRequests(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	for body, want := range map[string]struct {
		status int
		code   string
	}{
		`{"tokens":[1]}`:    {400, codeMissingField},
		`{"model":"llama"}`: {400, codeInvalidField},
		`{"model":"llama","prompt":"x","tokens":[1]}`: {400, codeInvalidField},
		`{"model":"llama","tokens":[1],"extra":1}`:    {400, codeInvalidJSON},
		`{"model":"nope","tokens":[1]}`:               {404, codeModelNotFound},
	} {
		resp, data := post(t, f.url+"/debug/match", body, nil)
		if e := decodeError(t, data); resp.StatusCode != want.status || e.Code != want.code {
			t.Errorf("%s: %d %s, want %d %s", body, resp.StatusCode, data, want.status, want.code)
		}
	}
}

func TestWithoutKVSyncOrTokenizerRequestsRouteOnLoad(t *testing.T) {
	f := startFleet(t, []string{"a", "b"}, fleetOptions{env: map[string]string{
		"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false", "AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER": "false"}})
	if v := f.kvcache(); v.KVEventSync || len(v.Models) != 0 {
		t.Errorf("kvcache without KV sync = %s", mustJSON(v))
	}
	if _, body := get(t, f.url+"/readyz"); body != "ready: pods synced from static endpoints file "+f.file+"\n" {
		t.Errorf("/readyz = %q", body)
	}
	for range 4 {
		f.send(sharedPrompt, "kv-aware")
	}
	if n := f.metric(`kvgate_routing_decisions_total{algorithm="kv-aware",outcome="no_tokens"}`); n != 4 {
		t.Errorf("kv-aware no_tokens decisions = %v, want 4", n)
	}
	resp, data := post(t, f.url+"/debug/match", `{"model":"llama","prompt":"hi"}`, nil)
	if e := decodeError(t, data); resp.StatusCode != http.StatusBadRequest || e.Code != codeTokenizerDisabled {
		t.Errorf("/debug/match with a prompt and no tokenizer: %d %s", resp.StatusCode, data)
	}
	if status, list := get(t, f.url+"/v1/models"); status != http.StatusOK ||
		len(listedModels(t, []byte(list))) != 1 || listedModels(t, []byte(list))[0]["id"] != "llama" {
		t.Errorf("/v1/models: %d %s", status, list)
	}
}

func TestDebugKVCacheShowsATopicThatFiltersOutLiveEvents(t *testing.T) {
	// The engines publish on vLLM's default topic "", which "other" is not
	// a prefix of: every live message is filtered out, and the batches
	// come only through the client's quiet-stream replays.
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{"KVGATE_KV_EVENTS_TOPIC": "other"}})
	e := f.engine("a")
	// The engine publishes a new prompt every half second, so that each
	// replay has new batches to deliver.
	var c *clientView
	var published time.Time
	n := 0
	testsupport.EventuallyWhy(t, "the topic mismatch to show", func() (string, bool) {
		if time.Since(published) > 500*time.Millisecond {
			e.storePrompt(toyTokens(fmt.Sprintf("prompt %d %s", n, sharedPrompt)))
			published, n = time.Now(), n+1
		}
		c = f.kvcache().Models[0].Pods[0].Ranks[0].Client
		return mustJSON(c), c.TopicMismatch
	})
	if c.Topic != "other" || c.PublisherTopic == nil || *c.PublisherTopic != "" ||
		c.Batches == 0 || c.ReplayedBatches != c.Batches {
		t.Errorf("client = %s; want the subscribed topic other, the engine's empty topic, every batch replayed", mustJSON(c))
	}
	if n := f.metric(`aibrix_kvcache_zmq_topic_mismatch{dp_rank="0",pod_key="static/a"}`); n != 1 {
		t.Errorf("aibrix_kvcache_zmq_topic_mismatch = %v, want 1", n)
	}
}

func TestClientViewShowsHowTheStreamHoldsItsEngine(t *testing.T) {
	now := time.Now()
	st := manager.StreamStatus{Topic: "kv@10.0.0.1:8000@m", Stats: transport.ClientStats{Connected: true,
		JoinedAtSeq: 15, LastHeardTime: now.Add(-2 * time.Second), Disconnections: 1, DroppedMessages: 3,
		ReplaysCut: 2, Suspended: true}}
	c := newClientView(st, now)
	if c.JoinedAtSeq == nil || *c.JoinedAtSeq != 15 || c.LastHeardAgeSeconds == nil || *c.LastHeardAgeSeconds != 2 ||
		c.Disconnections != 1 || c.DroppedMessages != 3 || c.ReplaysCut != 2 || !c.Suspended {
		t.Errorf("client = %s", mustJSON(c))
	}
	if c := newClientView(manager.StreamStatus{}, now); c.JoinedAtSeq != nil || c.LastHeardAgeSeconds != nil {
		t.Errorf("client of a stream that began at 0 and was never heard = %s", mustJSON(c))
	}
}
