package cache

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/kvgate/kvgate/internal/testsupport"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// listSource is a PodSource delivering a fixed list, then whatever the test
// sends on more, until it is stopped.
type listSource struct {
	pods    []*v1.Pod
	more    chan *v1.Pod
	failNow error
	config  *rest.Config
	stopped chan struct{}
}

func (s *listSource) Run(ctx context.Context, config *rest.Config, sink PodSink, synced func()) error {
	defer close(s.stopped)
	s.config = config
	if s.failNow != nil {
		return s.failNow
	}
	for _, p := range s.pods {
		sink.AddOrUpdatePod(p)
	}
	synced()
	for {
		select {
		case <-ctx.Done():
			return nil
		case p := <-s.more:
			sink.AddOrUpdatePod(p)
		}
	}
}

// recordingManager is a KVEventManager recording its calls.
type recordingManager struct {
	recorder
	startErr error
	started  bool
	stopped  bool
}

func (m *recordingManager) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.started = true
	m.events = append(m.events, "start")
	return m.startErr
}

func (m *recordingManager) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopped = true
	m.events = append(m.events, "stop")
}

func TestInitWithOptionsWiresThePodSourceAndTheKVEventManager(t *testing.T) {
	src := &listSource{
		pods:    []*v1.Pod{testPod("ns", "a", "m", "10.0.0.1"), testPod("ns", "b", "m", "10.0.0.2")},
		more:    make(chan *v1.Pod),
		stopped: make(chan struct{}),
	}
	mgr := &recordingManager{}
	cfg := &rest.Config{Host: "https://apiserver.test"}
	s, err := InitWithOptions(cfg, nil, InitOptions{Config: noScrape(), PodSource: src, EnableKVSync: true, KVEventManager: mgr})
	if err != nil {
		t.Fatal(err)
	}
	if src.config != cfg {
		t.Fatal("the pod source did not get the Kubernetes config")
	}
	if pods, _ := s.ListPodsByModel("m"); len(pods) != 2 {
		t.Fatalf("InitWithOptions returned before the source synced: %d pods", len(pods))
	}
	src.more <- testPod("ns", "c", "m", "10.0.0.3")
	testsupport.Eventually(t, "the third pod to be delivered", func() bool { return s.HasModel("m") && len(s.ListPods()) == 3 })

	s.Close()
	select {
	case <-src.stopped:
	default:
		t.Fatal("Close returned before the pod source stopped")
	}
	want := []string{"start", "add a 10.0.0.1", "add b 10.0.0.2", "add c 10.0.0.3", "stop"}
	if got := mgr.got(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("manager saw %v, want %v", got, want)
	}
	s.Close() // a second Close is harmless
}

func TestInitWithOptionsFailsCleanly(t *testing.T) {
	sourceErr := errors.New("no API server")
	closed := make(chan struct{})
	close(closed)
	tests := []struct {
		name   string
		stopCh <-chan struct{}
		opts   InitOptions
		want   string
	}{
		{"kv sync without a manager", nil, InitOptions{EnableKVSync: true}, "needs a KVEventManager"},
		{"manager fails to start", nil, InitOptions{EnableKVSync: true, KVEventManager: &recordingManager{startErr: errors.New("boom")}}, "boom"},
		{"source fails", nil, InitOptions{PodSource: &listSource{failNow: sourceErr, stopped: make(chan struct{})}}, "no API server"},
		{"stopped before sync", closed, InitOptions{PodSource: &neverSyncs{}}, "stopped before syncing"},
		{"bad config", nil, InitOptions{Config: Config{EnableRequestTrace: true}}, "needs a Redis client"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer goleak.VerifyNone(t)
			tt.opts.Config.PodMetricRefreshInterval, tt.opts.Config.AdapterRefreshInterval = -1, -1
			s, err := InitWithOptions(nil, tt.stopCh, tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) || s != nil {
				t.Fatalf("InitWithOptions = %v, %v; want an error containing %q", s, err, tt.want)
			}
		})
	}
}

// neverSyncs is a PodSource that blocks until stopped without syncing.
type neverSyncs struct{}

func (neverSyncs) Run(ctx context.Context, _ *rest.Config, _ PodSink, _ func()) error {
	<-ctx.Done()
	return nil
}

func TestStopChannelStopsTheStore(t *testing.T) {
	src := &listSource{more: make(chan *v1.Pod), stopped: make(chan struct{})}
	stop := make(chan struct{})
	s, err := InitWithOptions(nil, stop, InitOptions{Config: noScrape(), PodSource: src})
	if err != nil {
		t.Fatal(err)
	}
	close(stop)
	select {
	case <-src.stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("closing the stop channel did not stop the pod source")
	}
	s.Close()
}

func TestStoreMetricsAreRegisteredUntilClose(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := noScrape()
	cfg.Registerer = reg
	first, err := New(nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(nil, cfg); err == nil || !strings.Contains(err.Error(), "register cache metrics") {
		t.Fatalf("a second Store on the same registry: %v", err)
	}
	families, _ := reg.Gather()
	if len(families) == 0 {
		t.Fatal("no metrics registered")
	}
	first.Close()
	second, err := New(nil, cfg)
	if err != nil {
		t.Fatalf("New after the first Store closed: %v", err)
	}
	second.Close()
}

func TestCloseWaitsForConcurrentUsers(t *testing.T) {
	s, err := New(nil, Config{PodMetricRefreshInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				p := testPod("ns", "p", "m", "127.0.0.1", withPort(1+i))
				if j%2 == 0 {
					s.AddOrUpdatePod(p)
				} else {
					s.DeletePod(pkey("ns", "p"))
				}
			}
		}()
	}
	wg.Wait()
	s.Close()
}
