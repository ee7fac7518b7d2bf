package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

func TestParseKVEventsConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		json    string
		wantOn  bool
		wantErr bool
		check   func(kvEventsConfig) bool
	}{
		{name: "empty disables events", json: ""},
		{name: "enabled takes vLLM's defaults", json: `{"enable_kv_cache_events": true}`, wantOn: true,
			check: func(c kvEventsConfig) bool {
				return c.Endpoint == "tcp://*:5557" && c.ReplayEndpoint == nil && c.BufferSteps == 10000 && c.HWM == 100000 && c.Topic == ""
			}},
		{name: "every field", json: `{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:6000",
			"replay_endpoint": "tcp://*:6100", "topic": "kv-events", "buffer_steps": 5, "hwm": 7, "max_queue_size": 9}`, wantOn: true,
			check: func(c kvEventsConfig) bool {
				return c.Endpoint == "tcp://*:6000" && *c.ReplayEndpoint == "tcp://*:6100" && c.Topic == "kv-events" &&
					c.BufferSteps == 5 && c.HWM == 7 && c.MaxQueueSize == 9
			}},
		{name: "null publisher", json: `{"enable_kv_cache_events": true, "publisher": "null"}`},
		{name: "not enabled", json: `{"publisher": "zmq"}`},
		{name: "unknown publisher", json: `{"enable_kv_cache_events": true, "publisher": "kafka"}`, wantErr: true},
		{name: "unknown field", json: `{"enable_kv_cache_events": true, "endpoints": "x"}`, wantErr: true},
		{name: "trailing text", json: `{"enable_kv_cache_events": true} {}`, wantErr: true},
		{name: "not JSON", json: `enable`, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, on, err := parseKVEventsConfig(tc.json)
			if (err != nil) != tc.wantErr || on != tc.wantOn {
				t.Fatalf("on %v err %v, want on %v error %v", on, err, tc.wantOn, tc.wantErr)
			}
			if tc.check != nil && !tc.check(cfg) {
				t.Errorf("config %+v", cfg)
			}
		})
	}
}

// recorder keeps the batches a kvevent client delivers.
type recorder struct {
	mu      sync.Mutex
	batches []*kvevent.EventBatch
}

func (r *recorder) HandleEvent(kvevent.KVEvent) error { return nil }

func (r *recorder) HandleBatch(_ uint64, b *kvevent.EventBatch) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, b)
	return nil
}

// stored returns the token ids of the BlockStored events received so far and
// the ranks the batches carried.
func (r *recorder) stored() (tokens []uint32, ranks []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.batches {
		ranks = append(ranks, b.DataParallelRank)
		for _, ev := range b.Events {
			if st, ok := ev.(*kvevent.BlockStoredEvent); ok {
				tokens = append(tokens, st.TokenIDs...)
			}
		}
	}
	return tokens, ranks
}

func tokenize(t *testing.T, url, prompt string) []uint32 {
	t.Helper()
	resp, err := http.Post(url+"/tokenize", "application/json", strings.NewReader(fmt.Sprintf(`{"prompt":%q}`, prompt)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tok struct{ Tokens []uint32 }
	if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil {
		t.Fatal(err)
	}
	return tok.Tokens
}

func TestEachRankPublishesToKVGatesClient(t *testing.T) {
	for _, wire := range []string{"v0.26", "v0.10"} {
		t.Run(wire, func(t *testing.T) {
			pub := testsupport.ConsecutivePorts(t, 4)[0] // PUB ports pub, pub+1; replay ports pub+2, pub+3
			events := fmt.Sprintf(`{"enable_kv_cache_events": true, "endpoint": "tcp://[::ffff:127.0.0.1]:%d", `+
				`"replay_endpoint": "tcp://127.0.0.1:%d", "topic": "kv"}`, pub, pub+2)
			url, stop := startServe(t, "--data-parallel-size", "2", "--kv-events-config", events, "--kv-events-wire", wire,
				"--step-overhead", "5ms", "--num-gpu-blocks", "256", "--block-size", "4")
			defer stop()

			recs := []*recorder{{}, {}}
			for rank, rec := range recs {
				cfg := transport.DefaultZMQClientConfig("sim/vllm-sim-0", "127.0.0.1", "sim-model")
				cfg.PubPort, cfg.RouterPort, cfg.DPRank, cfg.Topic = pub, pub+2, rank, "kv"
				client, err := transport.NewZMQClient(cfg, rec)
				if err != nil {
					t.Fatal(err)
				}
				if err := client.Start(); err != nil {
					t.Fatal(err)
				}
				defer client.Close()
			}

			// A long answer keeps rank 0 busy, so the next request goes to rank 1.
			long, short := "a long answer that keeps rank zero busy", "a short one for rank one"
			resp, err := http.Post(url+"/v1/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":300,"stream":true}`, long)))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			r2, err := http.Post(url+"/v1/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":2}`, short)))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, r2.Body)
			r2.Body.Close()

			for rank, prompt := range []string{long, short} {
				want := tokenize(t, url, prompt)
				want = want[:len(want)/4*4]
				var tokens []uint32
				var ranks []int
				testsupport.EventuallyWhy(t, fmt.Sprintf("rank %d's client to receive %v", rank, want), func() (string, bool) {
					tokens, ranks = recs[rank].stored()
					return fmt.Sprint("received ", tokens), len(tokens) >= len(want)
				})
				if !slices.Equal(tokens[:len(want)], want) {
					t.Errorf("rank %d stored %v first, want the prompt's blocks %v", rank, tokens[:len(want)], want)
				}
				for _, r := range ranks {
					if r != rank {
						t.Errorf("rank %d's stream carried a batch of rank %d", rank, r)
					}
				}
			}
		})
	}
}

// startClient subscribes a recorder to rank 0's events on pub, replaying
// from replay (0: no replay endpoint).
func startClient(t *testing.T, pub, replay int) (*transport.ZMQClient, *recorder) {
	t.Helper()
	rec := &recorder{}
	cfg := transport.DefaultZMQClientConfig("sim/vllm-sim-0", "127.0.0.1", "sim-model")
	cfg.PubPort, cfg.RouterPort = pub, replay
	client, err := transport.NewZMQClient(cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return client, rec
}

func complete(t *testing.T, url, prompt string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":2}`, prompt)))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

func TestKVEventsArriveAfterTheConfiguredDelay(t *testing.T) {
	ports := testsupport.ConsecutivePorts(t, 1)
	events := fmt.Sprintf(`{"enable_kv_cache_events": true, "endpoint": "tcp://[::ffff:127.0.0.1]:%d"}`, ports[0])
	url, stop := startServe(t, "--kv-events-config", events, "--kv-events-delay", "400ms",
		"--step-overhead", "1ms", "--num-gpu-blocks", "256", "--block-size", "4")
	defer stop()
	client, rec := startClient(t, ports[0], 0)
	if err := client.WaitForConnection(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	prompt := "a prompt long enough to fill a few blocks of four tokens"
	complete(t, url, prompt)
	answered := time.Now()
	want := tokenize(t, url, prompt)
	want = want[:len(want)/4*4]
	testsupport.EventuallyWhy(t, "the prompt's blocks to arrive", func() (string, bool) {
		tokens, _ := rec.stored()
		return fmt.Sprint("received ", tokens), len(tokens) >= len(want)
	})
	// The batch was published 400 ms after its step, which ended before the
	// answer did; a loaded machine only makes it later.
	if late := time.Since(answered); late < 300*time.Millisecond {
		t.Errorf("the prompt's blocks arrived %v after the answer, want the 400 ms delay", late)
	}
}

func TestLostKVEventsAreWithheldFromTheLiveStreamAndReplayed(t *testing.T) {
	ports := testsupport.ConsecutivePorts(t, 2)
	events := fmt.Sprintf(`{"enable_kv_cache_events": true, "endpoint": "tcp://[::ffff:127.0.0.1]:%d", `+
		`"replay_endpoint": "tcp://127.0.0.1:%d"}`, ports[0], ports[1])
	url, stop := startServe(t, "--kv-events-config", events, "--kv-events-loss", "1",
		"--step-overhead", "1ms", "--num-gpu-blocks", "256", "--block-size", "4")
	defer stop()
	client, rec := startClient(t, ports[0], ports[1])
	if err := client.WaitForConnection(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	var want []uint32
	for _, prompt := range []string{"the first prompt of three, for blocks", "the second one, also long enough", "and a third"} {
		complete(t, url, prompt)
		toks := tokenize(t, url, prompt)
		want = append(want, toks[:len(toks)/4*4]...)
	}
	testsupport.EventuallyWhy(t, "every prompt's blocks to be replayed", func() (string, bool) {
		tokens, _ := rec.stored()
		return fmt.Sprint("received ", tokens), len(tokens) >= len(want)
	})
	if tokens, _ := rec.stored(); !slices.Equal(tokens[:len(want)], want) {
		t.Errorf("received %v, want %v", tokens[:len(want)], want)
	}
	if st := client.Stats(); st.ReplayedBatches != st.BatchesReceived {
		t.Errorf("%d of %d batches were replayed, want every one: the live stream lost them all", st.ReplayedBatches, st.BatchesReceived)
	}
}
