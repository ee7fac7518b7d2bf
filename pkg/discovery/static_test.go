package discovery

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
)

func TestStaticEndpointsBecomePodsTheManagerFollows(t *testing.T) {
	data, err := os.ReadFile("testdata/endpoints.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ParseStaticFile(data)
	if err != nil {
		t.Fatalf("ParseStaticFile: %v", err)
	}
	defaults := manager.DefaultStreamDefaults()
	want := []struct {
		target   manager.PodTarget
		reason   manager.IneligibleReason
		port     string
		adapters []string
	}{
		{manager.PodTarget{PodKey: "static/vllm-0", IP: "127.0.0.1", Model: "llama-3-8b", PubPort: 5557, ReplayPort: 5558, DPSize: 1,
			EnginePort: 8000}, "", "8000", []string{"sql-lora", "chat-lora"}},
		{manager.PodTarget{PodKey: "static/vllm-dp", IP: "10.0.0.7", Model: "llama-3-8b", LoraID: "7", PubPort: 5600, ReplayPort: 5700,
			Topic: "kv-events", DPSize: 2, EnginePort: 8100}, "", "8100", nil},
		{manager.PodTarget{}, manager.ReasonKVEventsDisabled, "8000", nil},
	}
	if len(f.Endpoints) != len(want) {
		t.Fatalf("%d endpoints, want %d", len(f.Endpoints), len(want))
	}
	for i, e := range f.Endpoints {
		pod := e.Pod()
		got, reason, err := manager.TargetForPod(pod, defaults)
		if err != nil || reason != want[i].reason {
			t.Fatalf("%s: reason %q, %v; want %q", e.Name, reason, err, want[i].reason)
		}
		got.UID = ""
		if got != want[i].target {
			t.Errorf("%s: target %+v, want %+v", e.Name, got, want[i].target)
		}
		if pod.Labels[endpoint.ModelPortLabel] != want[i].port || pod.Namespace != StaticNamespace || pod.UID == "" {
			t.Errorf("%s: pod %+v", e.Name, pod.ObjectMeta)
		}
		if got := endpoint.Adapters(pod); !slices.Equal(got, want[i].adapters) {
			t.Errorf("%s: adapters %q, want %q", e.Name, got, want[i].adapters)
		}
		if again := e.Pod(); again.UID != pod.UID {
			t.Errorf("%s: UID changes between calls", e.Name)
		}
	}
}

func TestParseStaticFileNamesEveryProblem(t *testing.T) {
	data, err := os.ReadFile("testdata/invalid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = ParseStaticFile(data)
	if err == nil || !strings.Contains(err.Error(), "pub_port") {
		t.Fatalf("unknown field not reported: %v", err)
	}
	fixed := strings.Replace(string(data), "  pub_port: 5600\n", "", 1)
	_, err = ParseStaticFile([]byte(fixed))
	for _, want := range []string{"used twice", "not an address", "model is empty", "port 70000", "dpSize 1000",
		`loraAdapters[0] ""`, `loraAdapters[1] "a,b"`, `loraAdapters[2] "llama" is the base model`, `loraAdapters[4] "sql-lora" is listed twice`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %q", err, want)
		}
	}
}

func TestStaticSourceReloadsAndKeepsTheLastValidSet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	write := func(s string) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("endpoints:\n- {name: a, address: 10.0.0.1, model: m}\n- {name: b, address: 10.0.0.2, model: m}\n")
	sink := newRecordingSink()
	src := &StaticSource{Path: path, PollInterval: 5 * millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	synced := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, nil, sink, func() { close(synced) }) }()
	<-synced
	if got := sink.summary(); got != "static/a=10.0.0.1 static/b=10.0.0.2" {
		t.Fatalf("after load: %s", got)
	}

	write("endpoints:\n- {name: a, address: 10.0.0.9, model: m}\n- {name: c, address: 10.0.0.3, model: m}\n")
	testsupport.Eventually(t, "reload", func() bool { return sink.summary() == "static/a=10.0.0.9 static/c=10.0.0.3" })
	updates := sink.count()

	write("endpoints:\n- {name: a, address: 10.0.0.9, model: m, bogus: 1}\n")
	write("endpoints:\n- {name: a, address: 10.0.0.9, model: m}\n- {name: c, address: 10.0.0.3, model: m}\n- {name: d, address: 10.0.0.4, model: m}\n")
	testsupport.Eventually(t, "valid version after an invalid one", func() bool { return strings.Contains(sink.summary(), "static/d=") })
	if got := sink.summary(); got != "static/a=10.0.0.9 static/c=10.0.0.3 static/d=10.0.0.4" {
		t.Fatalf("after recovery: %s", got)
	}
	if n := sink.count(); n != updates+1 {
		t.Fatalf("%d calls for one added endpoint: unchanged endpoints were re-announced", n-updates)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestStaticSourceFailsWhenTheFirstReadFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	src := &StaticSource{Path: path}
	if err := src.Run(context.Background(), nil, newRecordingSink(), func() { t.Fatal("synced") }); err == nil {
		t.Fatal("missing file accepted")
	}
	os.WriteFile(path, []byte("endpoints: [{name: a}]"), 0o644)
	if err := src.Run(context.Background(), nil, newRecordingSink(), func() { t.Fatal("synced") }); err == nil ||
		!strings.Contains(err.Error(), "address") {
		t.Fatalf("invalid file: %v", err)
	}
}
