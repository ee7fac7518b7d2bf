package kvgate_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
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

// pureGoPackages are the packages an embedder or a simulator imports
// without libzmq: the event types and codec, the prefix index and the
// engine simulator. They must build with CGO_ENABLED=0.
var pureGoPackages = []string{"./pkg/kvevent", "./pkg/indexer", "./pkg/sim"}

// TestCodecIndexAndSimulatorNeedNoCgo keeps the ZeroMQ transport and any
// other cgo library out of pureGoPackages: no package outside the standard
// library that they depend on may have cgo files. (The standard library
// falls back to pure Go; pebbe/zmq4 does not build without cgo.)
func TestCodecIndexAndSimulatorNeedNoCgo(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	args := append([]string{"list", "-deps", "-f", "{{if and (not .Standard) .CgoFiles}}{{.ImportPath}}{{end}}"}, pureGoPackages...)
	out, err := exec.CommandContext(ctx, "go", args...).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	if cgo := strings.Fields(string(out)); len(cgo) > 0 {
		t.Errorf("%v depend on cgo packages %v; they must build with CGO_ENABLED=0", pureGoPackages, cgo)
	}
}

// buildImageBinaries runs hack/build.sh to build pkgs into dir.
func buildImageBinaries(t *testing.T, dir string, pkgs []string) {
	t.Helper()
	// A cold build takes minutes on a loaded machine.
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "hack/build.sh", append([]string{dir}, pkgs...)...).CombinedOutput(); err != nil {
		t.Fatalf("hack/build.sh: %v\n%s", err, out)
	}
}

// simulatorCommand returns the program config/samples/simulator runs from
// the kvgate image.
func simulatorCommand(t *testing.T) string {
	t.Helper()
	const path = "config/samples/simulator/simulator.yaml"
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(text, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if cs := d.Spec.Template.Spec.Containers; len(cs) != 1 || len(cs[0].Command) == 0 {
		t.Fatalf("%s: want one container with a command", path)
	}
	return d.Spec.Template.Spec.Containers[0].Command[0]
}

// startsWithItsLibraries runs bin -help, which every command answers with
// its usage and exit status 0 once the dynamic loader has found its
// libraries.
func startsWithItsLibraries(t *testing.T, bin string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, bin, "-help").CombinedOutput(); err != nil {
		t.Errorf("%s -help: %v\n%s", bin, err, out)
	}
}
