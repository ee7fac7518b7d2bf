package cache

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStoreMetricsAreRegisteredUntilRunReturns(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := noScrape()
	cfg.Registerer = reg
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopFirst := runStore(first)
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "register cache metrics") {
		t.Fatalf("a second Store on the same registry: %v", err)
	}
	families, _ := reg.Gather()
	if len(families) == 0 {
		t.Fatal("no metrics registered")
	}
	stopFirst()
	second, err := New(cfg)
	if err != nil {
		t.Fatalf("New after the first Store stopped: %v", err)
	}
	runStore(second)()
}

func TestRunReturnsWhilePodsComeAndGo(t *testing.T) {
	s, err := New(Config{PodMetricRefreshInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := runStore(s)
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
	stop()
}
