package kvgate_test

import (
	"os"
	"strings"
	"testing"
)

// TestMakeBuildRunsTheImageBuildLine keeps one build line: make build and
// the Dockerfile both run hack/build.sh, which builds with cgo (libzmq) and
// without the build machine's paths.
func TestMakeBuildRunsTheImageBuildLine(t *testing.T) {
	makefile, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	_, recipe, _ := strings.Cut(string(makefile), "\nbuild:")
	recipe, _, _ = strings.Cut(recipe, "\n\n")
	if !strings.Contains(recipe, "hack/build.sh $(BIN_DIR)") {
		t.Errorf("make build runs %q; want hack/build.sh $(BIN_DIR)", recipe)
	}
	script, err := os.ReadFile("hack/build.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CGO_ENABLED=1", "-trimpath", "./cmd/..."} {
		if !strings.Contains(string(script), want) {
			t.Errorf("hack/build.sh does not build with %s", want)
		}
	}
}
