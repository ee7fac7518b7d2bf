package manifests

import (
	"os"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestPROJECTDescribesThisLayout checks the kubebuilder PROJECT file
// against the module and config/: kubebuilder's v4 layout, the module's
// import path, and no API resources, as kvgate has no CRDs.
func TestPROJECTDescribesThisLayout(t *testing.T) {
	text, err := os.ReadFile("../PROJECT")
	if err != nil {
		t.Fatal(err)
	}
	var project struct {
		Domain      string   `json:"domain"`
		Layout      []string `json:"layout"`
		ProjectName string   `json:"projectName"`
		Repo        string   `json:"repo"`
		Version     string   `json:"version"`
		Resources   []any    `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(text, &project); err != nil {
		t.Fatalf("PROJECT: %v", err)
	}
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	module, _, _ := strings.Cut(strings.TrimPrefix(string(gomod), "module "), "\n")
	if project.Repo != module || project.ProjectName != "kvgate" || project.Version != "3" {
		t.Errorf("PROJECT names repo %q, project %q, version %q; want %q, kvgate, 3", project.Repo, project.ProjectName, project.Version, module)
	}
	if !slices.Contains(project.Layout, "go.kubebuilder.io/v4") {
		t.Errorf("PROJECT layout %q, want go.kubebuilder.io/v4", project.Layout)
	}
	if len(project.Resources) > 0 || isDir("crd") {
		t.Errorf("PROJECT lists %d resources and config/crd exists: %v; kvgate has no CRDs", len(project.Resources), isDir("crd"))
	}
	for _, dir := range []string{"default", "manager", "rbac", "prometheus", "samples"} {
		if !isDir(dir) {
			t.Errorf("config/%s, a directory of kubebuilder's v4 layout, is missing", dir)
		}
	}
}
