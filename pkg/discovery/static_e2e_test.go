package discovery

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
)

// staticFleet is a Store fed by a StaticSource reading file, with a KV
// event manager writing to a real index.
type staticFleet struct {
	file    string
	store   *cache.Store
	manager *manager.KVEventManager
	index   *testIndex
}

func newStaticFleet(t *testing.T, endpoints string) *staticFleet {
	t.Helper()
	f := &staticFleet{file: filepath.Join(t.TempDir(), "endpoints.yaml"), index: newTestIndex(t)}
	f.write(t, endpoints)
	f.manager = f.index.newManager(t)
	f.store, _ = startStore(t, nil, &StaticSource{Path: f.file, PollInterval: 5 * time.Millisecond, Logger: klog.Background().V(4)}, f.manager)
	return f
}

// write replaces the endpoints file at once, as a ConfigMap update does.
func (f *staticFleet) write(t *testing.T, endpoints string) {
	t.Helper()
	tmp := f.file + ".tmp"
	if err := os.WriteFile(tmp, []byte("endpoints:\n"+endpoints), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f.file); err != nil {
		t.Fatal(err)
	}
}

// following lists "pod:pubPort" of every followed pod, sorted.
func (f *staticFleet) following() []string {
	var out []string
	for _, ps := range f.manager.Snapshot() {
		if ps.State == manager.PodStateFollowed {
			out = append(out, fmt.Sprintf("%s:%d", ps.Pod, ps.Target.PubPort))
		}
	}
	return out
}

// step waits until the manager follows exactly want, then checks at once
// that the index holds no block of any other pod.
func (f *staticFleet) step(t *testing.T, name string, want ...string) {
	t.Helper()
	slices.Sort(want)
	testsupport.Eventually(t, name+": followed pods", func() bool { return slices.Equal(f.following(), want) })
	followed := map[string]bool{}
	for _, w := range want {
		pod, _, _ := strings.Cut(w, ":")
		followed[pod] = true
	}
	for pod, n := range f.index.blocks() {
		if n > 0 && !followed[pod] {
			t.Fatalf("%s: the index holds %d blocks of %s, which is not followed", name, n, pod)
		}
	}
}

func TestStaticEndpointsFeedTheIndexThroughTheManager(t *testing.T) {
	// Four distinct pairs of ports: a's, moved's, and the DP engine's PUB
	// and replay ports, rank r on port+r.
	ports := testsupport.ConsecutivePorts(t, 8, "127.0.0.1", "127.0.0.2")
	a, moved, dpPub, dpReplay := ports[0], ports[2], ports[4], ports[6]
	// Engine a serves adapter sql-lora besides the base model: it publishes
	// chain 1 for the base model, then chain 5 computed with the adapter.
	pubA := enginePublisher(t, "127.0.0.1", a)
	publishBatches(t, pubA, 1, 0, 3)
	for i := range 2 {
		if err := pubA.Publish(chainBatch(5, i, "sql-lora")); err != nil {
			t.Fatal(err)
		}
	}
	publishBatches(t, enginePublisher(t, "127.0.0.1", moved), 2, 0, 4)
	// The data-parallel engine publishes one chain per rank, each on its
	// rank's ports.
	publishBatches(t, rankPublisher(t, "127.0.0.1", dpPub, dpReplay), 3, 0, 2)
	publishBatches(t, rankPublisher(t, "127.0.0.1", dpPub+1, dpReplay+1), 4, 0, 5)

	entry := func(name string, pub, replay int, extra string) string {
		return fmt.Sprintf("- {name: %s, address: 127.0.0.1, model: %s, pubPort: %d, replayPort: %d%s}\n",
			name, testModel, pub, replay, extra)
	}
	f := newStaticFleet(t, entry("a", a, a+1, ", loraAdapters: [sql-lora]")+
		entry("dp", dpPub, dpReplay, ", dpSize: 2")+
		entry("off", moved, moved+1, ", kvEvents: false"))
	f.step(t, "loaded", fmt.Sprintf("static/a:%d", a), fmt.Sprintf("static/dp:%d", dpPub))
	// Requests for the adapter match its blocks, requests for the base
	// model the base model's, and neither the other's.
	testsupport.Eventually(t, "static/a to hold chain 1 and the adapter's chain 5", func() bool {
		x := f.index
		return x.blocks()["static/a"] == 5 && x.matched("static/a", "", 1, 4) == 3 && x.matched("static/a", "sql-lora", 5, 3) == 2
	})
	if n, m := f.index.matched("static/a", "", 5, 3), f.index.matched("static/a", "sql-lora", 1, 4); n != 0 || m != 0 {
		t.Fatalf("the base model matches %d blocks of the adapter's chain, the adapter %d of the base model's", n, m)
	}
	if pods, err := f.store.ListPodsByModel("sql-lora"); err != nil || len(pods) != 1 || pods[0].Key.Name != "a" {
		t.Fatalf("pods serving sql-lora: %v, %v; want static/a", pods, err)
	}
	testsupport.Eventually(t, "static/dp to hold one chain per rank", func() bool {
		return f.index.blocks()["static/dp"] == 7 && slices.Equal(f.index.ranks("static/dp"), []int{0, 1}) &&
			f.index.matched("static/dp", "", 3, 3) == 2 && f.index.matched("static/dp", "", 4, 6) == 5
	})
	if pods, err := f.store.ListPodsByModel(testModel); err != nil || len(pods) != 3 {
		t.Fatalf("the Store routes to %d pods of %s, want all 3 endpoints: %v", len(pods), testModel, err)
	}

	// a's engine moves to other ports: its old blocks go with its old
	// streams, and the new engine's chain is indexed.
	f.write(t, entry("a", moved, moved+1, "")+entry("dp", dpPub, dpReplay, ", dpSize: 2"))
	f.step(t, "a moved", fmt.Sprintf("static/a:%d", moved), fmt.Sprintf("static/dp:%d", dpPub))
	testsupport.Eventually(t, "static/a to hold chain 2 only", func() bool { return f.index.holds("static/a", 2, 4) })
	if f.store.HasModel("sql-lora") {
		t.Fatal("sql-lora is still served once no endpoint lists it")
	}
	if _, err := f.store.GetPod(endpoint.Key{Namespace: StaticNamespace, Name: "off"}); err == nil {
		t.Fatal("the endpoint removed from the file is still registered")
	}

	// Turning off dp's KV events and removing a empties the index.
	f.write(t, entry("dp", dpPub, dpReplay, ", dpSize: 2, kvEvents: false"))
	f.step(t, "a removed, dp off")
	if n := f.index.entries(); n != 0 {
		t.Fatalf("the index holds %d blocks with no pod followed", n)
	}
}
