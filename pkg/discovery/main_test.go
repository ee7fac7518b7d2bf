package discovery

import (
	"os"
	"testing"

	"github.com/kvgate/kvgate/internal/testapiserver"
)

// TestMain starts one API server for the package's tests that need one.
func TestMain(m *testing.M) {
	os.Exit(testapiserver.Main(m, nil))
}
