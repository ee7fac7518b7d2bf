// Package manifests tests the Kubernetes configuration in config/: every
// kustomization renders, the installable ones pass a server-side dry run on
// a real kube-apiserver, the gateway's RBAC grants exactly what pod
// discovery needs, the gateway's settings match the variables the gateway
// declares, and the samples run engines the gateway follows.
//
// The tests run from config/, so paths are relative to it.
package manifests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvgate/kvgate/internal/testapiserver"
)

// TestMain starts one API server for the package, serving the CRDs the
// installations use: the ServiceMonitor of testdata/crds, the InferencePool
// and InferenceObjective kvgate ships, and the Gateway API's (Gateway,
// HTTPRoute), from the module go.mod requires.
func TestMain(m *testing.M) {
	gatewayAPI, err := moduleDir("sigs.k8s.io/gateway-api")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(testapiserver.Main(m, &envtest.Environment{
		CRDDirectoryPaths: []string{filepath.Join("testdata", "crds"), "inference-extension",
			filepath.Join(gatewayAPI, "config", "crd", "standard")},
		ErrorIfCRDPathMissing: true,
	}))
}

// moduleDir returns the directory of module path, as go.mod requires it.
func moduleDir(path string) (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", path).Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		return "", fmt.Errorf("locate module %s (go list -m): %v", path, err)
	}
	return dir, nil
}

// warnings collects the warnings the API server sends with its responses,
// such as Pod Security admission's "would violate PodSecurity".
type warnings struct {
	mu   sync.Mutex
	list []string
}

// HandleWarningHeaderWithContext implements rest.WarningHandlerWithContext.
func (w *warnings) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

// take returns the warnings received since the last take.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.list
	w.list = nil
	return l
}

// newClient returns a client of the API server with admin rights whose
// responses' warnings go to the returned collector.
func newClient(t *testing.T) (client.Client, *warnings) {
	t.Helper()
	cfg := testapiserver.Config(t)
	w := &warnings{}
	cfg.WarningHandler = nil
	cfg.WarningHandlerWithContext = w
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}
