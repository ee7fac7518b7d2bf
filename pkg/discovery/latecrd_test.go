package discovery

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// extensionGroup is the group of the extension's CRDs of
// config/inference-extension that a test may install again under a group of
// its own.
const extensionGroup = "inference.networking.x-k8s.io"

// shortRecheck makes sources check every 50ms again for what they could
// not list at start, until the test ends.
func shortRecheck(t *testing.T) {
	t.Helper()
	saved := recheckInterval
	recheckInterval = 50 * time.Millisecond
	t.Cleanup(func() { recheckInterval = saved })
}

// lateCRD returns the resource of the CRD of config/inference-extension's
// file (of group extensionGroup, version v1alpha2, resource plural) in a
// group of its own, which the API server does not serve until install is
// called. The CRD is uninstalled when the test ends.
func lateCRD(t *testing.T, cfg *rest.Config, file, plural string) (r schema.GroupVersionResource, install func()) {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("..", "..", "config", "inference-extension", file))
	if err != nil {
		t.Fatal(err)
	}
	group := fmt.Sprintf("late-%d.kvgate.io", rand.Uint32())
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strings.ReplaceAll(string(text), extensionGroup, group)), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := envtest.CRDInstallOptions{Paths: []string{dir}, ErrorIfPathMissing: true, MaxTime: 30 * time.Second}
	r = schema.GroupVersionResource{Group: group, Version: "v1alpha2", Resource: plural}
	return r, func() {
		t.Helper()
		if _, err := envtest.InstallCRDs(cfg, opts); err != nil {
			t.Fatalf("install the CRD of %s: %v", r, err)
		}
		t.Cleanup(func() {
			if err := envtest.UninstallCRDs(cfg, opts); err != nil {
				t.Errorf("uninstall the CRD of %s: %v", r, err)
			}
		})
	}
}

// logLines is a logger keeping its lines for a test to count.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() klog.Logger {
	return funcr.New(func(_, args string) { l.mu.Lock(); l.lines = append(l.lines, args); l.mu.Unlock() }, funcr.Options{})
}

// count returns how many lines contain each of msgs.
func (l *logLines) count(msgs ...string) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[string]int{}
	for _, line := range l.lines {
		for _, m := range msgs {
			if strings.Contains(line, m) {
				n[m]++
			}
		}
	}
	return n
}

// wantLoggedOnce waits until each of msgs was logged, and fails t unless
// each was logged once.
func (l *logLines) wantLoggedOnce(t *testing.T, msgs ...string) {
	t.Helper()
	testsupport.EventuallyWhy(t, "the logs", func() (string, bool) {
		n := l.count(msgs...)
		return fmt.Sprintf("logged %v; want each of %q", n, msgs), len(n) == len(msgs)
	})
	n := l.count(msgs...)
	for _, m := range msgs {
		if n[m] != 1 {
			l.mu.Lock()
			t.Errorf("logged %q %d times; want once. Logs: %q", m, n[m], l.lines)
			l.mu.Unlock()
		}
	}
}
