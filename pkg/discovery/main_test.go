package discovery

import (
	"fmt"
	"os"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// apiServer is the kube-apiserver and etcd shared by the tests of this
// package, nil when KUBEBUILDER_ASSETS is unset.
var apiServer *rest.Config

// TestMain starts one envtest environment for the package. `make test` (and
// CI) sets KUBEBUILDER_ASSETS through hack/setup-envtest.sh; without it the
// tests that need an API server skip, saying so.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return m.Run()
	}
	logf.SetLogger(klog.Background().V(4))
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "start envtest (KUBEBUILDER_ASSETS=%s): %v\n", os.Getenv("KUBEBUILDER_ASSETS"), err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop envtest: %v\n", err)
		}
	}()
	apiServer = cfg
	return m.Run()
}

// needAPIServer skips t without an API server.
func needAPIServer(t *testing.T) *rest.Config {
	t.Helper()
	if apiServer == nil {
		t.Skip("KUBEBUILDER_ASSETS is unset: run `make test` or KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh) go test")
	}
	return apiServer
}
