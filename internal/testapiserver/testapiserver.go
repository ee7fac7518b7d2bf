// Package testapiserver runs a real kube-apiserver and etcd (controller-
// runtime's envtest) for the tests of a package.
//
// A package's TestMain calls Main, and its tests call Config; Apply creates
// or replaces an object on any API server a test reaches. The binaries
// come from KUBEBUILDER_ASSETS, which `make test` (and CI) sets through
// hack/setup-envtest.sh; without it Main runs the tests without a server and
// Config skips the tests that need one, saying so, except in CI (CI=true),
// where it fails them.
package testapiserver

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// server is the API server of the running test binary, nil without
// KUBEBUILDER_ASSETS.
var server *rest.Config

// Main starts env (an empty Environment when nil), runs the tests, stops env
// and returns the exit code for os.Exit. It returns 1 without running the
// tests when KUBEBUILDER_ASSETS is set but the server does not start.
func Main(m *testing.M, env *envtest.Environment) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return m.Run()
	}
	logf.SetLogger(klog.Background().V(4))
	if env == nil {
		env = &envtest.Environment{}
	}
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
	server = cfg
	return m.Run()
}

// Config returns the configuration of an administrator of the API server
// Main started, or skips t when KUBEBUILDER_ASSETS is unset (fails it in CI). Callers may
// modify the returned copy.
func Config(t testing.TB) *rest.Config {
	t.Helper()
	if server == nil {
		testsupport.SkipUnlessCI(t, "KUBEBUILDER_ASSETS is unset: run `make test` or KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh) go test")
	}
	return rest.CopyConfig(server)
}

// Apply makes u the object of its name in resource: it creates it when
// there is none, and otherwise updates it, u taking the resource version of
// the object it replaces (so a whole object is written, not merged). It
// fails t, naming u's kind and name, when the API server refuses either.
func Apply(t testing.TB, resource dynamic.ResourceInterface, u *unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	old, err := resource.Get(ctx, u.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = resource.Create(ctx, u, metav1.CreateOptions{})
	case err == nil:
		u.SetResourceVersion(old.GetResourceVersion())
		_, err = resource.Update(ctx, u, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("apply %s %s: %v", u.GetKind(), u.GetName(), err)
	}
}
