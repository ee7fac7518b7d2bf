package localfleet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Import paths of the binaries a fleet runs.
const (
	gatewayPackage = "github.com/kvgate/kvgate/cmd/gateway"
	vllmSimPackage = "github.com/kvgate/kvgate/cmd/vllm-sim"
)

// Build builds the gateway and vllm-sim, and the extra packages (import
// paths), into dir with the go command, for tests and benchmarks that run
// a fleet from the source tree; the working directory must be inside the
// kvgate module. The error quotes the go command's output.
func Build(dir string, extra ...string) error {
	args := append([]string{"build", "-o", dir + string(filepath.Separator), gatewayPackage, vllmSimPackage}, extra...)
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}
