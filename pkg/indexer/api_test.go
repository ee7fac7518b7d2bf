package indexer

import (
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

func TestConfigDefaultsAndValidation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"zero selects defaults", Config{}, ""},
		{"negative contexts", Config{MaxContexts: -1}, "MaxContexts is -1"},
		{"negative per-context prefixes", Config{MaxPrefixesPerContext: -5}, "MaxPrefixesPerContext is -5"},
		{"negative total", Config{MaxPrefixes: -1}, "MaxPrefixes is -1"},
		{"negative interval", Config{EvictionInterval: -time.Second}, "EvictionInterval is -1s"},
		{"negative duration", Config{EvictionDuration: -time.Minute}, "EvictionDuration is -1m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx, err := NewSyncPrefixHashTable(tc.cfg, nil)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("NewSyncPrefixHashTable: %v", err)
				}
				want := Config{MaxContexts: DefaultMaxContexts, MaxPrefixesPerContext: DefaultMaxPrefixesPerContext,
					MaxPrefixes: DefaultMaxPrefixes, EvictionInterval: DefaultEvictionInterval, EvictionDuration: DefaultEvictionDuration}
				got := idx.cfg
				if got.Logger.GetSink() == nil {
					t.Error("no default logger")
				}
				got.Logger = logr.Logger{}
				if got != want {
					t.Fatalf("config %+v, want defaults %+v", got, want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestMetricsRegisterOnTheGivenRegistryOnly(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewSyncPrefixHashTable(Config{}, reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSyncPrefixHashTable(Config{}, reg); err == nil {
		t.Fatal("a second table registered the same metrics on one registry without an error")
	}
	if _, err := NewSyncPrefixHashTable(Config{}, prometheus.NewRegistry()); err != nil {
		t.Fatalf("a table on its own registry: %v", err)
	}
}

func TestGaugesDescribeTheIndexAndForgetPurgedPods(t *testing.T) {
	idx, reg := newTestTable(t, Config{})
	mustApply(t, idx, podA, stored(hashSeq(1, 3), nil, tokenRange(0, 48), 16))
	cpu := stored(hashSeq(1, 2), nil, tokenRange(0, 32), 16)
	cpu.Medium = kvevent.MediumCPU
	mustApply(t, idx, podA, cpu)
	mustApply(t, idx, podB, stored(hashSeq(1, 1), nil, tokenRange(0, 16), 16))
	gauge := func(name string, labels map[string]string) float64 {
		return testsupport.MetricValue(t, reg, name, labels)
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kvgate_indexer_entries", map[string]string{"model": "llama"}, 3},
		{"kvgate_indexer_pods", map[string]string{"model": "llama"}, 2},
		{"kvgate_indexer_resident_blocks", map[string]string{"pod": "ns/a", "medium": "GPU"}, 3},
		{"kvgate_indexer_resident_blocks", map[string]string{"pod": "ns/a", "medium": "CPU"}, 2},
		{"kvgate_indexer_resident_blocks", map[string]string{"pod": "ns/b", "medium": "GPU"}, 1},
	} {
		if got := gauge(tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	// Media vLLM does not name share one series, whatever engines call them.
	for i := range 3 {
		e := stored(hashSeq(1, 1), nil, tokenRange(0, 16), 16)
		e.Medium = "tier-" + itoa(i)
		mustApply(t, idx, podB, e)
	}
	if got := gauge("kvgate_indexer_resident_blocks", map[string]string{"pod": "ns/b", "medium": mediumOther}); got != 3 {
		t.Errorf("resident blocks of ns/b in other media = %v, want 3", got)
	}
	if got := testsupport.MetricSeries(t, reg, "kvgate_indexer_resident_blocks", map[string]string{"pod": "ns/b"}); got != 2 {
		t.Errorf("ns/b has %d resident_blocks series, want 2 (GPU and %s)", got, mediumOther)
	}
	match(idx, "llama", "", tokenRange(0, 48), "ns/a")
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_match_duration_seconds", nil); got != 1 {
		t.Errorf("match histogram count = %v, want 1", got)
	}
	idx.PurgePod("ns/a")
	if got := gauge("kvgate_indexer_resident_blocks", map[string]string{"pod": "ns/a"}); got != 0 {
		t.Errorf("purged pod still has resident blocks %v", got)
	}
	if got := gauge("kvgate_indexer_entries", map[string]string{"model": "llama"}); got != 1 {
		t.Errorf("entries after purge = %v, want 1", got)
	}
}

func TestStatsReportPodsStreamsAndLanes(t *testing.T) {
	idx, _, clock := newClockedTable(t, Config{})
	r1 := podA
	r1.Rank = 1
	mustApply(t, idx, podA, stored(hashSeq(1, 2), nil, tokenRange(0, 32), 16))
	clock.Advance(time.Minute)
	mustApply(t, idx, r1, stored(hashSeq(1, 1), nil, tokenRange(0, 16), 16))
	st := idx.Stats()
	if len(st) != 1 || st[0].Model != "llama" || st[0].BlockSize != 16 || st[0].Entries != 2 {
		t.Fatalf("Stats = %+v", st)
	}
	p := st[0].Pods[0]
	if p.Pod != "ns/a" || len(p.Streams) != 2 || p.Streams[0].Rank != 0 || p.Streams[1].Rank != 1 {
		t.Fatalf("pod stats = %+v", p)
	}
	if got := p.Streams[1].LastEvent; !got.Equal(clock.Now()) {
		t.Errorf("rank 1 last event %v, want %v", got, clock.Now())
	}
	if l := p.Streams[0].Lanes; len(l) != 1 || l[0] != (LaneStats{Medium: "GPU", Group: 0, BlockSize: 16, Blocks: 2}) {
		t.Errorf("rank 0 lanes = %+v", l)
	}
}

func TestAStreamThatChangesModelStartsOver(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	mustApply(t, idx, podA, stored(hashSeq(1, 2), nil, tokenRange(0, 32), 16))
	moved := podA
	moved.Model = "mistral"
	mustApply(t, idx, moved, stored(hashSeq(1, 1), nil, tokenRange(0, 16), 16))
	if b, _ := match(idx, "llama", "", tokenRange(0, 32), "ns/a"); b["ns/a"] != 0 {
		t.Errorf("old model still credits the pod with %d blocks", b["ns/a"])
	}
	if b, _ := match(idx, "mistral", "", tokenRange(0, 32), "ns/a"); b["ns/a"] != 1 {
		t.Errorf("new model credits %d blocks, want 1", b["ns/a"])
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

func TestUnsupportedEventsAreReported(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	var nilStored *kvevent.BlockStoredEvent
	err := idx.ApplyBatch(podA, &kvevent.EventBatch{Events: []kvevent.KVEvent{nil, nilStored}})
	if err == nil || !strings.Contains(err.Error(), "event 0") || !strings.Contains(err.Error(), "event 1") {
		t.Fatalf("ApplyBatch error = %v, want both events reported", err)
	}
	if err := idx.ApplyBatch(podA, nil); err == nil {
		t.Fatal("nil batch accepted")
	}
}
