package config

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

func TestLoadKVSyncDefaults(t *testing.T) {
	e := NewEnv(lookupFrom(nil))
	k := LoadKVSync(e)
	want := KVSync{Enabled: true, PubPort: 5557, ReplayPort: 5558, BindRanks: 1, BindLivenessTimeout: time.Minute,
		DeadPodTimeout:  30 * time.Second,
		MaxMessageBytes: 16 << 20, ReceiveBufferBytes: 64 << 20, PendingBufferBytes: 64 << 20, MaxReplayBatches: 20000,
		MaxReplayDuration: time.Minute, ReadInterval: 5 * time.Millisecond, MaxContexts: 1000,
		MaxPrefixesPerContext: 4 << 20, MaxPrefixes: 8 << 20, EvictionInterval: time.Minute, EvictionDuration: 20 * time.Minute}
	if e.Err() != nil || k != want {
		t.Fatalf("LoadKVSync = %+v, %v; want %+v", k, e.Err(), want)
	}
}

// The gateway passes every stream bound explicitly, so the documented
// defaults are the transport's own: the two must not drift apart.
func TestKVEventBoundDefaultsAreTheTransports(t *testing.T) {
	for _, c := range []struct {
		v    Var
		want string
	}{
		{KVEventsMaxMessageBytes, strconv.Itoa(transport.DefaultMaxMessageBytes)},
		{KVEventsReceiveBufferBytes, strconv.Itoa(transport.DefaultReceiveBufferBytes)},
		{KVEventsPendingBufferBytes, strconv.Itoa(transport.DefaultMaxPendingBytes)},
		{KVEventsMaxReplayBatches, strconv.Itoa(transport.DefaultMaxReplayBatches)},
		{KVEventsMaxReplayDuration, strconv.Itoa(int(transport.DefaultMaxReplayDuration / time.Second))},
		{KVEventsBindLivenessTimeout, strconv.Itoa(int(transport.DefaultLivenessTimeout / time.Second))},
		{KVEventsDeadPodTimeout, strconv.Itoa(int(manager.DefaultDeadPodTimeout / time.Second))},
		{KVEventsReadInterval, strconv.Itoa(int(transport.DefaultReadInterval / time.Millisecond))},
	} {
		if c.v.Default != c.want {
			t.Errorf("%s defaults to %s, the transport to %s", c.v.Name, c.v.Default, c.want)
		}
	}
	if maxReadInterval != transport.MaxReadInterval {
		t.Errorf("%s is bounded by %v, the transport by %v", KVEventsReadInterval.Name, maxReadInterval, transport.MaxReadInterval)
	}
}

// The gateway passes every index bound explicitly, so the documented defaults
// are the index's own: the two must not drift apart.
func TestIndexDefaultsAreTheIndexers(t *testing.T) {
	for _, c := range []struct {
		v    Var
		want int
	}{
		{SyncMaxContexts, indexer.DefaultMaxContexts},
		{SyncMaxPrefixesPerContext, indexer.DefaultMaxPrefixesPerContext},
		{SyncMaxPrefixes, indexer.DefaultMaxPrefixes},
		{SyncEvictionInterval, int(indexer.DefaultEvictionInterval / time.Second)},
		{SyncEvictionDuration, int(indexer.DefaultEvictionDuration / time.Minute)},
	} {
		if c.v.Default != strconv.Itoa(c.want) {
			t.Errorf("%s defaults to %s, the index to %d", c.v.Name, c.v.Default, c.want)
		}
	}
}

func TestLoadKVSyncReadsAliasesAndOverrides(t *testing.T) {
	e := NewEnv(lookupFrom(map[string]string{
		"AIBRIX_KV_EVENT_SYNC_ENABLED": "true", "AIBRIX_USE_REMOTE_TOKENIZER": "true",
		"KVGATE_KV_EVENTS_PUB_PORT": "6000", "KVGATE_KV_EVENTS_REPLAY_PORT": "0", "KVGATE_KV_EVENTS_TOPIC": "kv",
		"KVGATE_KV_EVENTS_BIND_ENDPOINT": "tcp://*:7000", "KVGATE_KV_EVENTS_BIND_RANKS": "4",
		"KVGATE_KV_EVENTS_BIND_ALLOW_ANY_PEER": "true", "KVGATE_KV_EVENTS_BIND_LIVENESS_TIMEOUT": "90s",
		"KVGATE_KV_EVENTS_MAX_MESSAGE_BYTES": "1048576", "KVGATE_KV_EVENTS_RECEIVE_BUFFER_BYTES": "2097152",
		"KVGATE_KV_EVENTS_PENDING_BUFFER_BYTES": "4194304", "KVGATE_KV_EVENTS_MAX_REPLAY_BATCHES": "100000",
		"KVGATE_KV_EVENTS_MAX_REPLAY_DURATION": "2m", "KVGATE_KV_EVENTS_DEAD_POD_TIMEOUT": "45",
		"KVGATE_KV_EVENTS_READ_INTERVAL": "0",
	}))
	k := LoadKVSync(e)
	if e.Err() != nil || !k.Enabled || k.PubPort != 6000 || k.ReplayPort != 0 || k.Topic != "kv" ||
		k.BindEndpoint != "tcp://*:7000" || k.BindRanks != 4 || !k.BindAllowAnyPeer || k.BindLivenessTimeout != 90*time.Second ||
		k.MaxMessageBytes != 1<<20 || k.ReceiveBufferBytes != 2<<20 || k.PendingBufferBytes != 4<<20 ||
		k.MaxReplayBatches != 100000 || k.MaxReplayDuration != 2*time.Minute || k.DeadPodTimeout != 45*time.Second ||
		k.ReadInterval >= 0 {
		t.Fatalf("LoadKVSync = %+v, %v", k, e.Err())
	}
}

func TestLoadKVSyncRejectsWhatCannotWork(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"sync without remote tokenizer", map[string]string{"AIBRIX_USE_REMOTE_TOKENIZER": "false"},
			[]string{"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED", "AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER"}},
		{"short alias names", map[string]string{"AIBRIX_KV_EVENT_SYNC_ENABLED": "true", "AIBRIX_USE_REMOTE_TOKENIZER": "false"},
			[]string{"AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER is false"}},
		{"bad ports", map[string]string{"KVGATE_KV_EVENTS_PUB_PORT": "70000", "KVGATE_KV_EVENTS_REPLAY_PORT": "-1"},
			[]string{"KVGATE_KV_EVENTS_PUB_PORT=70000", `KVGATE_KV_EVENTS_REPLAY_PORT="-1"`}},
		{"bad bind endpoint", map[string]string{"KVGATE_KV_EVENTS_BIND_ENDPOINT": "*:5557"}, []string{"KVGATE_KV_EVENTS_BIND_ENDPOINT"}},
		{"buffers below the largest batch", map[string]string{"KVGATE_KV_EVENTS_MAX_MESSAGE_BYTES": "100000000"},
			[]string{"KVGATE_KV_EVENTS_RECEIVE_BUFFER_BYTES=67108864 is below", "KVGATE_KV_EVENTS_PENDING_BUFFER_BYTES=67108864 is below"}},
		{"a read interval past its bound", map[string]string{"KVGATE_KV_EVENTS_READ_INTERVAL": "2s"},
			[]string{"KVGATE_KV_EVENTS_READ_INTERVAL=2s: want at most 1s"}},
		{"a negative read interval", map[string]string{"KVGATE_KV_EVENTS_READ_INTERVAL": "-5"},
			[]string{"KVGATE_KV_EVENTS_READ_INTERVAL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := NewEnv(lookupFrom(tt.env))
			LoadKVSync(e)
			err := e.Err()
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v does not mention %s", err, w)
				}
			}
		})
	}
	e := NewEnv(lookupFrom(map[string]string{"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false", "AIBRIX_USE_REMOTE_TOKENIZER": "false"}))
	if LoadKVSync(e); e.Err() != nil {
		t.Fatalf("disabled sync without remote tokenizer: %v", e.Err())
	}
}

func TestLoadDiscovery(t *testing.T) {
	tests := []struct {
		env     map[string]string
		want    Discovery
		errWant string
	}{
		{nil, Discovery{Mode: "kubernetes", LabelSelector: "model.aibrix.ai/name"}, ""},
		{map[string]string{"KVGATE_POD_DISCOVERY": "Static", "KVGATE_STATIC_ENDPOINTS_FILE": "/etc/kvgate/endpoints.yaml"},
			Discovery{Mode: "static", StaticFile: "/etc/kvgate/endpoints.yaml", LabelSelector: "model.aibrix.ai/name"}, ""},
		{map[string]string{"KVGATE_POD_DISCOVERY": "static"}, Discovery{}, "needs KVGATE_STATIC_ENDPOINTS_FILE"},
		{map[string]string{"KVGATE_POD_DISCOVERY": "consul"}, Discovery{}, `KVGATE_POD_DISCOVERY="consul"`},
		{map[string]string{"KVGATE_POD_LABEL_SELECTOR": "a in (b"}, Discovery{}, "KVGATE_POD_LABEL_SELECTOR"},
		{map[string]string{"KVGATE_POD_DISCOVERY": "inferencepool", "KVGATE_POD_NAMESPACE": "llm",
			"KVGATE_INFERENCE_POOLS": " qwen , ,llama"},
			Discovery{Mode: "inferencepool", Namespace: "llm", LabelSelector: "model.aibrix.ai/name", Pools: []string{"qwen", "llama"}}, ""},
		{map[string]string{"KVGATE_POD_DISCOVERY": "inferencepool"},
			Discovery{Mode: "inferencepool", LabelSelector: "model.aibrix.ai/name"}, ""},
	}
	for _, tt := range tests {
		e := NewEnv(lookupFrom(tt.env))
		got := LoadDiscovery(e)
		if tt.errWant != "" {
			if e.Err() == nil || !strings.Contains(e.Err().Error(), tt.errWant) {
				t.Errorf("%v: error %v, want one mentioning %s", tt.env, e.Err(), tt.errWant)
			}
			continue
		}
		if e.Err() != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%v: LoadDiscovery = %+v, %v; want %+v", tt.env, got, e.Err(), tt.want)
		}
	}
}
