package discovery

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvgate/kvgate/internal/testapiserver"
)

// TestMain starts one API server for the package's tests that need one,
// serving the InferencePool CRD kvgate ships (config/inference-extension).
func TestMain(m *testing.M) {
	os.Exit(testapiserver.Main(m, &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "inference-extension")},
		ErrorIfCRDPathMissing: true,
	}))
}
